"""Atomic writes: a temp file beside the target, fsynced, then renamed over it, so after any kill the target holds the
old content or all of the new; a dead writer's temp file is recognised by :func:`is_stale_temp`. The result gets
``open(path, "w")``'s permissions (0666 less the umask), not a temp file's 0600."""

from __future__ import annotations

import contextlib
import csv
import errno
import hashlib
import io
import json
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any, Iterable

from mate_cli.errors import find_in_chain


def default_mode() -> int:
    """``0o666`` less the process umask (read without changing it for good)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


#: ``.<name>.mate~<host>~<pid>~<random>.tmp``: a temp file of mate's, with its writer
_TEMP = re.compile(r"^\.(?P<name>.+)\.mate~(?P<host>[^~/]+)~(?P<pid>\d+)~[^~/]*\.tmp$")


def temp_prefix(path: Path) -> str:
    return f".{path.name}.mate~{socket.gethostname()}~{os.getpid()}~"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def closed_in_forked_children(handles: dict | set) -> dict | set:
    """``handles``, the open lock files (a dict's values or a set's members) an ``flock`` of this process's is held on,
    registered so that a forked child (a loader or preprocessing worker) closes its copies and forgets them: the
    parent's lock stands, and once the parent dies (``kill -9`` too) the lock is free whatever its workers still do."""

    def forget() -> None:
        for handle in handles.values() if isinstance(handles, dict) else handles:
            with contextlib.suppress(OSError):
                handle.close()
        handles.clear()

    os.register_at_fork(after_in_child=forget)
    return handles


def is_stale_temp(path: Path) -> bool:
    """Whether ``path`` is mate's temp file of a gone writer on this host (a user's ``.notes.tmp`` never is)."""
    match = _TEMP.match(path.name)
    return bool(match and match["host"] == socket.gethostname() and not pid_alive(int(match["pid"])))


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w"):
    """A temp file beside ``path``, open for writing: renamed to ``path`` on success, removed on an error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, default_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 of ``path``'s bytes, read in chunks (``hashlib.file_digest`` is Python 3.11's)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_open(path) as handle:
        handle.write(text)
    return Path(path)


def atomic_write_csv(path: str | os.PathLike, fieldnames: list[str], rows: Iterable[dict], **options) -> Path:
    """``rows`` under a header of ``fieldnames`` (``"\\n"`` line ends; ``options``: ``csv.DictWriter``'s)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fieldnames, lineterminator="\n", **options)
    writer.writeheader()
    writer.writerows(rows)
    return atomic_write_text(path, buffer.getvalue())


def atomic_write_json(path: str | os.PathLike, data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def writable(directory: str | os.PathLike) -> bool:
    """Whether a file can be created in ``directory`` (made if missing): tried, as root ignores permission bits."""
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            return True
    except OSError:
        return False


def os_error_in(err: BaseException | None) -> OSError | None:
    """The first ``OSError`` with an errno in ``err``'s cause chain (torch wraps failed writes in ``RuntimeError``)."""
    return find_in_chain(err, OSError, lambda cause: cause.errno)


def free_space(directory: str | os.PathLike) -> str:
    """``"1.2 GB free"`` on the filesystem of ``directory`` (its nearest existing parent)."""
    path = Path(directory)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return "free space unknown"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if free >= size:
            return f"{free / size:.1f} {unit} free"
    return f"{free} bytes free"


def write_failure(path: str | os.PathLike, err: BaseException, fix: str) -> str:
    """The one line for a failed write of ``path``: why (a full disk named so), the folder's free space, ``fix``."""
    cause = os_error_in(err)
    folder = Path(path).parent
    if cause is not None and cause.errno == errno.ENOSPC:
        return f"no space left on the device of {folder} ({free_space(folder)}) while writing {Path(path).name}; {fix}"
    reason = os.strerror(cause.errno) if cause is not None else f"{type(err).__name__}: {err}"
    return f"writing {path} failed ({reason}; {free_space(folder)} in {folder}); {fix}"
