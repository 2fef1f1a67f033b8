"""Who owns a run dir: one process, by an exclusive ``flock`` on ``<run dir>/.mate.lock`` that the OS releases when
the process dies (``kill -9`` too), so it never goes stale; and never another run's files (:func:`claim`). Taking it
removes dead mate writers' temp files (:func:`mate_cli.io.is_stale_temp`), nothing else. DDP ranks > 0 work in rank
0's run dir, unlocked and unchecked."""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import time
from pathlib import Path

from mate_cli.errors import MateError
from mate_cli.io import closed_in_forked_children, is_stale_temp

log = logging.getLogger(__name__)

LOCK_NAME = ".mate.lock"
#: the setting that names a sweep's folder (``-m``), where a single run's is ``hydra.run.dir``
SWEEP_KEY = "hydra.sweep.dir"

#: the lock files this process holds, open (closing one would release its lock); a forked child closes its copies
_HELD: dict[Path, object] = closed_in_forked_children({})


def is_ddp_child() -> bool:
    return any(os.environ.get(name, "0").strip() not in ("", "0") for name in ("LOCAL_RANK", "NODE_RANK", "RANK"))


def take(run_dir: str | os.PathLike, key: str = "hydra.run.dir") -> bool:
    """Lock ``run_dir`` (made if missing) for this process; False for a DDP rank > 0; `MateError` if held elsewhere
    (naming ``key``, the setting that chose the folder)."""
    directory = Path(run_dir).resolve()
    if directory in _HELD:
        return True
    if is_ddp_child():
        return False
    directory.mkdir(parents=True, exist_ok=True)
    handle = _locked(directory, "a+", key)  # held open for the process's life
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    _HELD[directory] = handle
    remove_stale_temps(directory)
    return True


def _locked(directory: Path, mode: str, key: str = "hydra.run.dir"):
    """``directory``'s lock file, open in ``mode`` and locked by this process; a `MateError` naming the holder."""
    handle = open(directory / LOCK_NAME, mode)  # noqa: SIM115 - the caller keeps or closes it
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise MateError(
            f"{'sweep' if key == SWEEP_KEY else 'run'} dir {directory} is in use by another mate process "
            f"(pid {holder}); wait for it to finish, or drop {key}= so this {'sweep' if key == SWEEP_KEY else 'run'} "
            "gets a directory of its own"
        ) from None
    return handle


def holder(run_dir: str | os.PathLike) -> str | None:
    """The pid (as its lock file says) of another live mate process holding ``run_dir``, else None."""
    directory = Path(run_dir).resolve()
    if directory in _HELD or is_ddp_child() or not (directory / LOCK_NAME).is_file():
        return None  # a DDP rank > 0 resumes the run dir its rank 0 holds
    try:
        _locked(directory, "r").close()
    except MateError:
        return (directory / LOCK_NAME).read_text().strip() or "unknown"
    return None


def check_not_running(run_dir: str | os.PathLike, what: str) -> None:
    """`MateError` naming the holder when another live mate process holds ``run_dir`` (``what``: the setting)."""
    if (pid := holder(run_dir)) is not None:
        raise MateError(
            f"{what}: the run in {Path(run_dir).resolve()} is still running (pid {pid}); resuming it now would train "
            "the same run twice: wait for it to end, or stop it (it saves last.ckpt), then resume"
        )


def release(run_dir: str | os.PathLike) -> None:
    """Give up this process's lock on ``run_dir`` (kept: the lock file, for the next taker)."""
    if (handle := _HELD.pop(Path(run_dir).resolve(), None)) is not None:
        handle.close()


def remove_stale_temps(directory: Path) -> int:
    """Remove the stale temp files (:func:`mate_cli.io.is_stale_temp`) under ``directory``; returns how many."""
    removed = 0
    for tmp in directory.rglob(".*.tmp") if directory.is_dir() else ():
        if tmp.is_file() and is_stale_temp(tmp):
            tmp.unlink(missing_ok=True)
            removed += 1
    if removed:
        log.info("removed %d unfinished temp file(s) a killed run left in %s", removed, directory)
    return removed


#: the folders :func:`claim` took while they held nothing: the first folder it made on the way (the folder or a
#: parent; None: the folder was there), and whether it made the lock file
_CLAIMED: dict[Path, tuple[Path | None, bool]] = {}


def remove_unused_claims() -> None:
    """Undo :func:`claim` where the command wrote nothing into the folder (Hydra refused the command line after the
    claim, say): the lock file the claim made goes, then each empty folder it made. Anything else stays."""
    for directory, (made, lock_made) in list(_CLAIMED.items()):
        del _CLAIMED[directory]
        if existing_files(directory):
            continue
        release(directory)
        if lock_made:
            (directory / LOCK_NAME).unlink(missing_ok=True)
        for folder in (directory, *directory.parents) if made is not None else ():
            try:
                folder.rmdir()  # only ever an empty folder
            except OSError:
                break
            if folder == made:
                break


# ------------------------------------------------------------------ what a run dir holds
#: the key that lets a command write into a folder holding other files: into a new subfolder
EXISTING_KEY = "paths.existing_run_dir"

#: overrides that do not make a run another command's: where it is (re)started and from what, how Hydra runs it
#: (``hydra/launcher=joblib``: Hydra records its own overrides apart from the command's), and the time budget of
#: each call (``trainer.max_time``: a job cut by it goes on at the next call, under that call's budget)
NOT_COMPARED = ("hydra.", "hydra/", "ckpt_path=", f"{EXISTING_KEY}=", "trainer.max_time=", "++trainer.max_time=")
EXISTING_CHOICES = ("refuse", "subdir")


def existing_files(directory: Path) -> list[str]:
    """The top-level names in ``directory`` that hold files, besides its lock file and stale mate temp files."""

    def holds_files(entry: Path) -> bool:
        if entry.is_dir() and not entry.is_symlink():
            return any(holds_files(child) for child in entry.iterdir())
        return entry.name != LOCK_NAME and not is_stale_temp(entry)

    return sorted(entry.name for entry in directory.iterdir() if holds_files(entry)) if directory.is_dir() else []


def recorded_command(directory: Path) -> tuple[str, list[str]] | None:
    """``(command, overrides)`` Hydra recorded in ``directory/.hydra`` (read as data with limits), or None."""
    from mate_cli.config.yaml_data import read_yaml

    files = directory / ".hydra" / "hydra.yaml", directory / ".hydra" / "overrides.yaml"
    try:  # a missing file is a MateError too
        job = read_yaml(files[0], "", interpolations=True)["hydra"]["job"]["name"]
        overrides = read_yaml(files[1], "", interpolations=True) or []
    except (MateError, KeyError, TypeError):
        return None
    return (str(job), [str(o) for o in overrides]) if isinstance(overrides, list) else None


def recorded_sweep(directory: Path) -> tuple[str, list[str] | None] | None:
    """``(command, overrides)`` of the sweep Hydra recorded in ``directory``: its ``multirun.yaml``, else (a sweeper
    that writes none) a job folder's ``.hydra`` with overrides None (they are the job's, not the sweep's); or None."""
    from mate_cli.config.yaml_data import read_yaml

    try:  # a missing file is a MateError too
        hydra = read_yaml(directory / "multirun.yaml", "", interpolations=True)["hydra"]
        overrides = hydra["overrides"]["task"] or []
        if isinstance(overrides, list):
            return str(hydra["job"]["name"]), [str(o) for o in overrides]
    except (MateError, KeyError, TypeError):
        pass
    jobs = (recorded_command(job) for job in sorted(directory.iterdir()) if job.is_dir())
    return next(((job[0], None) for job in jobs if job is not None), None)


def sweep_changes(recorded: list[str], overrides: list[str]) -> str:
    """How ``overrides`` differ from the ``recorded`` ones of a sweep (:func:`compared`), as ``seed=1,2 was seed=1,2,3;
    lr=1e-4 was not given``; empty when they do not."""
    before, now = dict(_split(o) for o in compared(recorded)), dict(_split(o) for o in compared(overrides))
    parts = [
        f"{key}={now[key]} was {f'{key}={before[key]}' if key in before else 'not given'}"
        if key in now else f"{key}={before[key]} is not given now"
        for key in sorted(set(before) | set(now), key=lambda k: (k not in now, k))
        if before.get(key) != now.get(key)
    ]  # fmt: skip
    return "; ".join(parts)


def _split(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key, value


def compared(overrides: list[str]) -> list[str]:
    """``overrides`` as two commands are compared: without the ones that say where a run goes, and each value as Hydra
    reads it whether quoted or not (``path='/x'`` is ``path=/x``: Hydra records the quoted form it was handed)."""
    return [_unquoted(o) for o in overrides if not o.startswith(NOT_COMPARED)]


def _unquoted(override: str) -> str:
    key, sep, value = override.partition("=")
    if sep and len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1]
    return f"{key}{sep}{value}"


def claim(
    directory: str | os.PathLike,
    command: str,
    overrides: list[str],
    existing: str = "refuse",
    resuming: bool = False,
    sweep: bool = False,
) -> Path:
    """Take the ``hydra.run.dir=`` (``sweep``: ``hydra.sweep.dir=``) ``directory`` for ``mate <command> <overrides>``;
    returns the folder to write into: ``directory``, or (``existing="subdir"``, files there) a new
    ``<directory>/<command or multirun>-<time>-<hex>``. A folder whose recorded run is this command (:func:`compared`)
    with no ``metrics.json`` is its interrupted run, taken again (train/pretrain over a ``last.ckpt``: when
    ``resuming``). A sweep's folder holding this sweep (the same overrides in its ``multirun.yaml``; an Optuna sweep
    writes none) is taken again: the sweep continues (:mod:`mate_cli.run.sweep`); another sweep of the command there is
    a `MateError` naming what changed. Another process's folder, or other files with ``existing="refuse"``, is a
    `MateError`."""
    key = SWEEP_KEY if sweep else "hydra.run.dir"
    directory = Path(directory).expanduser().resolve()
    if is_ddp_child():
        return directory
    if not (found := existing_files(directory)):
        made = next((folder for folder in (*reversed(directory.parents), directory) if not folder.exists()), None)
        lock_made = not (directory / LOCK_NAME).exists()
        take(directory, key)
        _CLAIMED[directory] = (made, lock_made)
        return directory
    if (directory / LOCK_NAME).is_file():  # a mate run dir: a live holder is named (its lock file unchanged)
        _locked(directory, "r", key).close()
        recorded = None if sweep else recorded_command(directory)  # a sweep's folder is no run to take again
        same = recorded is not None and recorded[0] == command and compared(recorded[1]) == compared(overrides)
        if same and not (directory / "metrics.json").exists():
            checkpointed = command in ("train", "pretrain") and (directory / "checkpoints" / "last.ckpt").is_file()
            if resuming or not checkpointed:
                take(directory)
                (directory / "FAILED").unlink(missing_ok=True)  # taken again: its outcome is the new run's
                return directory
            raise MateError(
                f"{directory} holds this command's interrupted run and its checkpoints/last.ckpt; resume "
                f"it there with ckpt_path={directory}, or drop hydra.run.dir= to start a new run"
            )
    earlier = recorded_sweep(directory) if sweep else None
    if earlier is not None and earlier[0] == command:  # this sweep run again: it continues (mate_cli.run.sweep)
        if earlier[1] is not None and (changed := sweep_changes(earlier[1], overrides)):
            raise MateError(
                f"{key}={directory} holds a sweep of `mate {command} -m` with other settings ({changed}); run it "
                f"again as it ran to continue it, or pass a new {key}=<folder> for this one"
            )
        take(directory, key)
        return directory
    if existing == "subdir":
        name = "multirun" if sweep else command
        inner = directory / f"{name}-{time.strftime('%Y-%m-%d_%H-%M-%S')}-{secrets.token_hex(3)}"
        take(inner, key)
        _CLAIMED[inner] = (inner, True)
        return inner
    shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
    raise MateError(
        f"{key}={directory} already holds files ({shown}) that this command did not write; "
        f"drop {key}= for a new {'sweep' if sweep else 'run'} dir, or add {EXISTING_KEY}=subdir to write into a new "
        "folder inside it (nothing there is overwritten)"
    )
