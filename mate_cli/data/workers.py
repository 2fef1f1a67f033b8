"""What the data layer's worker processes do at the signals a mate command stops at (:mod:`mate_cli.signals`; the
main process handles them: :mod:`mate_cli.callbacks.interrupts`): a ``DataLoader`` worker leaves stopping to the main
process (:func:`loader_worker_start`); a preprocessing pool worker takes the default actions (its start in
:mod:`mate_cli.data.preprocess`)."""

from __future__ import annotations

import os
import signal

from mate_cli.signals import SIGNALS


def loader_worker_start(worker_id: int) -> None:  # noqa: ARG001 - DataLoader's worker_init_fn signature
    """``worker_init_fn`` of mate's ``DataLoader``s: end at SIGTERM with status 0, as torch's own handler's "killed by
    signal" would fail the main process, and ignore the other :data:`SIGNALS` (the main process, signalled with its
    group, finishes its batch and stops the workers)."""
    for signum in SIGNALS:
        signal.signal(signum, _end_worker if signum == signal.SIGTERM else signal.SIG_IGN)


def _end_worker(signum: int, frame) -> None:  # noqa: ARG001 - signal handler signature
    os._exit(0)
