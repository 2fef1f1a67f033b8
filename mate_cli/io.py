"""Atomic file writes: write to a temp file in the same folder, fsync, then rename.

The result gets the permissions an ordinary ``open(path, "w")`` would give it (0666
less the umask), not the 0600 of a temp file, so run dirs stay readable as a whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def default_mode() -> int:
    """``0o666`` less the process umask (read without changing it for good)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def publish(tmp: str | os.PathLike, path: str | os.PathLike) -> None:
    """Give the finished temp file ``tmp`` ordinary permissions and rename it to ``path``."""
    os.chmod(tmp, default_mode())
    os.replace(tmp, path)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w"):
    """Open a temp file beside ``path`` for writing; on success it becomes ``path`` in one rename.

    Readers see the old file or the whole new one; on an error (or a kill) the temp file
    is removed (or left as ``.<name>.*.tmp`` beside it, never elsewhere).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        publish(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` so readers see either the old file or the whole new one."""
    with atomic_open(path) as handle:
        handle.write(text)
    return Path(path)


def atomic_write_json(path: str | os.PathLike, data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
