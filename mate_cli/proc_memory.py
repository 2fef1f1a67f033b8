"""This process's memory as Linux's ``/proc`` tells it: a field of a ``/proc`` file, and the peak RSS (``VmHWM``),
which ``/proc/self/clear_refs`` resets to the current RSS. Used by ``mate bench`` too: imports nothing heavy."""

from __future__ import annotations

from pathlib import Path

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def proc_field(path: str | Path, key: str) -> str | None:
    """The value of the first ``key: value`` line of a ``/proc`` file; None where the file or the key is missing."""
    try:
        with open(path, encoding="utf-8") as handle:
            return next((v.strip() for k, _, v in (line.partition(":") for line in handle) if k.strip() == key), None)
    except OSError:  # pragma: no cover
        return None


def status_kb(key: str) -> int | None:
    """``key`` of ``/proc/self/status`` in KiB (``VmRSS``, ``VmHWM``); None off Linux."""
    value = proc_field(STATUS, key)  # "123 kB"
    return None if value is None else int(value.split()[0])


def reset_peak_rss() -> bool:
    """``VmHWM`` back to the current RSS; False where the system does not offer it."""
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True
