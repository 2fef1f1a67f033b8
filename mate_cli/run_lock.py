"""One process per run directory: an OS lock on ``<run dir>/.mate.lock``.

Two runs writing one directory interleave their logs and metrics and leave both a
``metrics.json`` and a ``FAILED``. The first ``mate`` process in a run dir takes an
exclusive ``flock`` on its lock file and holds it until it exits (the OS releases it when
the process dies, kill -9 included, so a lock file never goes stale); a second process is
refused in one line. Default run dirs end in a per-process tag and never collide; the
lock is what stops two runs given the same ``hydra.run.dir=``.

The ranks > 0 of a DDP run are started by rank 0 into its run dir: they do not lock it.
On taking the lock, files a killed process left half-written (``.<name>.*.tmp`` beside
checkpoints and results) are removed: no live writer can own them then.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

from mate_cli.errors import MateError

log = logging.getLogger(__name__)

LOCK_NAME = ".mate.lock"

#: the lock files this process holds, open (closing one would release its lock)
_HELD: dict[Path, object] = {}


def is_ddp_child() -> bool:
    """A process that a launcher started as rank > 0 (Lightning sets ``LOCAL_RANK``;
    torchrun and SLURM set ``RANK``/``NODE_RANK`` too)."""
    return any(os.environ.get(name, "0").strip() not in ("", "0") for name in ("LOCAL_RANK", "NODE_RANK", "RANK"))


def take(run_dir: str | os.PathLike) -> bool:
    """Lock ``run_dir`` for this process (made if missing); False for a DDP rank > 0, which
    shares rank 0's. A run dir another process holds is a `MateError`."""
    directory = Path(run_dir).resolve()
    if directory in _HELD:
        return True
    if is_ddp_child():
        return False
    directory.mkdir(parents=True, exist_ok=True)
    handle = open(directory / LOCK_NAME, "a+")  # noqa: SIM115 - held open for the process's life
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise MateError(f"run dir {directory} is in use by another mate process (pid {holder}); wait for it to "
                        "finish, or drop hydra.run.dir= so this run gets a directory of its own") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    _HELD[directory] = handle
    remove_stale_temps(directory)
    return True


def remove_stale_temps(directory: Path) -> int:
    """Remove ``.<name>.*.tmp`` files (an atomic write a killed process never finished)
    in ``directory`` and its ``checkpoints/``; returns how many."""
    removed = 0
    for folder in (directory, directory / "checkpoints"):
        for tmp in folder.glob(".*.tmp") if folder.is_dir() else ():
            if tmp.is_file():
                tmp.unlink(missing_ok=True)
                removed += 1
    if removed:
        log.info("removed %d unfinished temp file(s) a killed run left in %s", removed, directory)
    return removed
