"""The preprocessing cache: one Arrow dataset per key, safe under kills and concurrent runs.

A :func:`key` covers the settings, the input files (:func:`fingerprint`) and the encoding code (:func:`code_digest`), so
neither an edited table nor an updated mate_cli is served stale examples; any edit of that code, a comment too,
rebuilds the cache once.

An entry proves what it holds: :func:`save_atomically` writes ``mate_entry.json`` into it (the key, the entry's folder
name, and a digest of each file's bytes), and a load checks both before it serves the entry. A folder holding another
entry's files (a botched restore or copy of the cache folder) or files changed since they were written is rebuilt, with
one warning, never served as this key's examples.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import shutil
import socket
from pathlib import Path
from typing import Callable, Iterable

import datasets

from mate_cli.errors import MateError
from mate_cli.io import closed_in_forked_children, file_sha256, pid_alive, write_failure, writable

log = logging.getLogger(__name__)

_TEMP_SUFFIX = ".tmp"


def fingerprint(files: Iterable[Path], root: Path) -> str:
    """Digest of every file's (path relative to ``root``, size, mtime)."""
    digest = hashlib.sha256()
    for path in sorted(files):
        stat = path.stat()
        digest.update(f"{path.relative_to(root)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def content_digest(files: Iterable[Path]) -> str:
    """Digest of every file's name and bytes (small files whose every change matters, such as a tokenizer's)."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


#: the installed package, whose data modules' source keys the cache
PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def code_digest(package_root: Path | None = None) -> str:
    """Digest of every module under ``<package_root>/data/`` and every ``mate_cli`` module they import (statically, at
    any depth), and of the transformers, tokenizers and datasets versions. Recomputed only when a source changed."""
    root = Path(package_root or PACKAGE_ROOT).resolve()
    stamp = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(root.rglob("*.py")))
    return _code_digest(root, stamp)


def key(**payload) -> str:
    """The cache key of ``payload`` (an entry's JSON-able settings and :func:`fingerprint`) and the code."""
    return hashlib.sha256(json.dumps({**payload, "code": code_digest()}, sort_keys=True).encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=4)
def _code_digest(root: Path, stamp: tuple) -> str:  # noqa: ARG001 - ``stamp`` keys the memo
    from importlib.metadata import PackageNotFoundError, version

    todo, seen = sorted((root / "data").glob("*.py")), set()
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        todo.extend(_imported_modules(path, root))
    digest = hashlib.sha256()
    for path in sorted(seen):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    for package in ("transformers", "tokenizers", "datasets"):
        try:
            digest.update(f"{package}=={version(package)}\n".encode())
        except PackageNotFoundError:
            digest.update(f"{package} absent\n".encode())
    return digest.hexdigest()[:16]


def _imported_modules(path: Path, root: Path) -> list[Path]:
    """The files of the ``mate_cli`` modules ``path`` imports anywhere (relative imports too), with the ``__init__`` of
    each package on the way, which an import runs."""
    here = ["mate_cli", *path.parent.relative_to(root).parts]  # the package ``path`` is in
    names = []
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level <= len(here):
            package = here[: len(here) - node.level + 1] if node.level else []  # level 1: ``here``, 2: its parent
            base = ".".join([*package, *([node.module] if node.module else [])])
            names += [base, *(f"{base}.{alias.name}" for alias in node.names)]
    found = []
    for name in names:
        parts = name.split(".")
        if parts[0] == "mate_cli":
            for depth in range(1, len(parts) + 1):  # mate_cli, mate_cli.a, mate_cli.a.b: each runs
                base = root.joinpath(*parts[1:depth])
                found += [p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()]
    return found


def temp_name(target: Path) -> str:
    """``.<entry>.<host>.<pid>.tmp``: who is writing it."""
    return f".{target.name}.{socket.gethostname()}.{os.getpid()}{_TEMP_SUFFIX}"


def remove_stale_temps(directory: Path) -> int:
    """Remove temp folders of this host's writers that no longer run; returns how many."""
    removed = 0
    host = socket.gethostname()
    for tmp in directory.glob(f".*{_TEMP_SUFFIX}") if directory.is_dir() else ():
        rest, _, pid = tmp.name[: -len(_TEMP_SUFFIX)].rpartition(".")  # the host name may hold dots itself
        if rest.endswith(f".{host}") and pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)
            removed += 1
    if removed:
        log.info("cache: removed %d temp folder(s) left by killed runs in %s", removed, directory)
    return removed


#: the record an entry holds of what it is (:func:`save_atomically`, :func:`unproven`)
RECORD = "mate_entry.json"


#: files ``datasets`` writes into a loaded dataset's folder itself (``filter``/``map``'s caches), not part of the entry
DATASETS_CACHE_FILES = "cache-*.arrow"


def _file_digests(folder: Path) -> dict[str, str]:
    """sha256 of each file in ``folder`` but the record and ``datasets``' own caches, by name."""
    return {
        path.name: file_sha256(path)
        for path in sorted(folder.iterdir())
        if path.name != RECORD and path.is_file() and not path.match(DATASETS_CACHE_FILES)
    }


def unproven(target: Path) -> str | None:
    """Why the entry at ``target`` is not the one its folder name (the key) names, or None when its record proves it:
    the key recorded in it is its own, and its files are the ones written with that record, byte for byte."""
    try:
        record = json.loads((target / RECORD).read_text(encoding="utf-8"))
        recorded_key, recorded_files = record["key"], record["files"]
    except FileNotFoundError:
        return f"it has no {RECORD} (written by an older mate_cli, or not by mate_cli)"
    except (OSError, ValueError, TypeError, KeyError) as err:
        return f"its {RECORD} is unreadable ({type(err).__name__})"
    if recorded_key != target.name:
        return f"it holds the files of the entry {recorded_key!r} (a copy or restore put them in the wrong folder)"
    found = _file_digests(target)
    if found != recorded_files:
        changed = sorted(set(found) ^ set(recorded_files) | {n for n in found if found[n] != recorded_files.get(n)})
        return f"its files differ from those it was written with ({', '.join(changed[:3])})"
    return None


def save_atomically(ds: datasets.Dataset, target: Path) -> None:
    """Save beside ``target`` with the record that proves it (:data:`RECORD`), then one rename; an entry another run
    renamed there first is kept."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / temp_name(target)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        ds.save_to_disk(str(tmp))
        record = {"key": target.name, "files": _file_digests(tmp)}
        (tmp / RECORD).write_text(json.dumps(record, indent=1, sort_keys=True), encoding="utf-8")
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
            log.info("cache: %s was written by another run meanwhile; using it", target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


#: read-only cache folders already warned about
_READ_ONLY_WARNED: set[Path] = set()


#: the build locks this process holds, open (a forked preprocessing worker closes its copies)
_BUILDING: set = closed_in_forked_children(set())


@contextlib.contextmanager
def build_lock(target: Path):
    """Hold ``.<entry>.lock`` beside ``target`` while building it: a second run that needs the same entry meanwhile (a
    sweep's runs, MATE and dense started side by side) waits and then loads it, instead of building it again. An
    exclusive ``flock``, which the OS releases when its holder dies (``kill -9`` too). Where no lock can be had (a lock
    file of another user's that this one cannot open, a file system without ``flock``) the run builds unlocked, as
    before: the entry's rename keeps it whole either way (:func:`save_atomically`)."""
    path = target.parent / f".{target.name}.lock"
    try:
        handle = os.fdopen(os.open(path, os.O_RDONLY | os.O_CREAT, 0o666), "rb")  # flock needs no write access
    except OSError as err:
        log.warning("cache: no build lock for %s (%s); building it unlocked", target, err)
        handle = None
    if handle is None:
        yield
        return
    with handle:
        _BUILDING.add(handle)  # before any wait: a child forked meanwhile must not keep the lock
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("cache: another run is building %s; waiting for it", target)
                fcntl.flock(handle, fcntl.LOCK_EX)
            locked = True
        except OSError as err:
            log.warning("cache: no build lock for %s (%s); building it unlocked", target, err)
            locked = False
        try:
            yield
        finally:
            _BUILDING.discard(handle)
            if locked:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _load(target: Path, what: str, repair: bool) -> datasets.Dataset | None:
    """The entry at ``target``; None when absent or unreadable. With ``repair`` (under the build lock, so that no
    other run's fresh entry is taken for the broken one) an unreadable entry is removed, with one warning."""
    if not target.is_dir():
        return None
    why = unproven(target)
    if why is not None:
        if repair:
            log.warning("cache: %s is not as it was written: %s; rebuilding it", target, why)
            shutil.rmtree(target, ignore_errors=True)
        return None
    try:
        ds = datasets.load_from_disk(str(target))
    except Exception as err:  # noqa: BLE001 - any unreadable entry is rebuilt
        if repair:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            log.warning("cache: %s is unreadable (%s: %s); rebuilding it", target, type(err).__name__, first)
            shutil.rmtree(target, ignore_errors=True)
        return None
    log.info("%s loaded from cache %s", what, target)
    return ds


def load_or_build(target: Path, build: Callable[[], datasets.Dataset], what: str) -> datasets.Dataset:
    """The cached dataset at ``target``, built and saved when absent or unreadable, by one run at a time
    (:func:`build_lock`). A folder that cannot be written serves what it holds, and what it lacks is built in memory
    (one warning); a full disk is one ``MateError`` line naming the folder and its free space."""
    if not writable(target.parent):
        if target.parent not in _READ_ONLY_WARNED:
            _READ_ONLY_WARNED.add(target.parent)
            log.warning(
                "cache: %s cannot be written; what it lacks is built in memory for this run only "
                "(set MATE_CACHE_DIR or dataset.cache_dir to a writable folder to keep it)",
                target.parent,
            )
        why = unproven(target) if target.is_dir() else "absent"
        if why is None:
            with contextlib.suppress(Exception):
                return datasets.load_from_disk(str(target))
        elif target.is_dir():
            log.warning("cache: %s is not as it was written: %s; building it in memory", target, why)
        return build()
    remove_stale_temps(target.parent)
    ds = _load(target, what, repair=False)
    if ds is not None:
        return ds
    with build_lock(target):
        ds = _load(target, what, repair=True)  # built by the run this one waited for
        if ds is not None:
            return ds
        built = build()
        try:
            save_atomically(built, target)
        except OSError as err:
            raise MateError(
                write_failure(
                    target, err, "free space there, or set MATE_CACHE_DIR (dataset.cache_dir) to a folder with room"
                )
            ) from None
        return datasets.load_from_disk(str(target))
