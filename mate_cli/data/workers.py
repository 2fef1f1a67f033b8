"""The signals a mate command stops at (:mod:`mate_cli.callbacks.interrupts` handles them in the main process), and what
the data layer's worker processes do at them: a ``DataLoader`` worker leaves stopping to the main process
(:func:`loader_worker_start`); a preprocessing pool worker takes the default actions (its start in
:mod:`mate_cli.data.preprocess`)."""

from __future__ import annotations

import os
import signal

#: the signals handled (those this platform has), with the exit status of a command they stop
SIGNALS = {
    signum: 128 + signum
    for signum in (
        getattr(signal, name, None) for name in ("SIGHUP", "SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGXCPU")
    )
    if signum is not None
}


def loader_worker_start(worker_id: int) -> None:  # noqa: ARG001 - DataLoader's worker_init_fn signature
    """``worker_init_fn`` of mate's ``DataLoader``s: end at SIGTERM with status 0, as torch's own handler's "killed by
    signal" would fail the main process, and ignore the other :data:`SIGNALS` (the main process, signalled with its
    group, finishes its batch and stops the workers)."""
    for signum in SIGNALS:
        signal.signal(signum, _end_worker if signum == signal.SIGTERM else signal.SIG_IGN)


def _end_worker(signum: int, frame) -> None:  # noqa: ARG001 - signal handler signature
    os._exit(0)
