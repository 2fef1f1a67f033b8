"""The signals a mate command stops at, each with the exit status of a command it stops (128 + the signal): the main
process handles them (:mod:`mate_cli.callbacks.interrupts`), a sweep passes them on to its jobs
(:mod:`mate_cli.run.sweep`), and the data layer's worker processes leave them to the main one
(:mod:`mate_cli.data.workers`)."""

from __future__ import annotations

import signal

#: the signals handled (those this platform has), with the exit status of a command they stop
SIGNALS = {
    signum: 128 + signum
    for signum in (
        getattr(signal, name, None) for name in ("SIGHUP", "SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGXCPU")
    )
    if signum is not None
}
