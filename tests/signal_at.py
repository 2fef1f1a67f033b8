"""Lightning callbacks for tests: real signals to this process at a chosen training batch."""

from __future__ import annotations

import os
import signal
import time

import lightning as L


class SignalAt(L.Callback):
    """Sends this process ``signum`` once, as training batch ``batch`` starts (as a scheduler's time limit may):
    ``+callbacks.signal_at._target_=tests.signal_at.SignalAt +callbacks.signal_at.batch=2``; with
    ``validation=<n>``, as that batch of the n-th validation inside fit starts."""

    def __init__(self, batch: int, signum: int = int(signal.SIGTERM), validation: int = 0) -> None:
        self.batch, self.signum, self.validation, self.sent, self.validations = batch, signum, validation, False, 0

    def _send(self, batch_idx: int) -> None:
        if batch_idx == self.batch and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signum)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if not self.validation:
            self._send(batch_idx)

    def on_validation_start(self, trainer, pl_module) -> None:
        self.validations += not trainer.sanity_checking

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if self.validation and self.validations == self.validation and not trainer.sanity_checking:
            self._send(batch_idx)


class SignalWithALostPeer(SignalAt):
    """:class:`SignalAt`, where Lightning's own SIGTERM handler then fails as under DDP when another rank has already
    ended (its broadcast raises "Connection reset by peer"): a handler that raises so runs right after Lightning's,
    or with ``first=true`` before every other one, mate's too.
    ``+callbacks.lost_peer._target_=tests.signal_at.SignalWithALostPeer +callbacks.lost_peer.batch=1``."""

    def __init__(self, batch: int, first: bool = False) -> None:
        super().__init__(batch)
        self.first = first

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == self.batch and not self.sent:  # every callback's on_train_start has ordered the handlers
            handlers = signal.getsignal(signal.SIGTERM).signal_handlers  # Lightning's, composed for this fit
            names = [getattr(handler, "__name__", "") for handler in handlers]
            assert "_sigterm_notifier_fn" in names, f"Lightning's SIGTERM handler is not among {names}"
            handlers.insert(0 if self.first else names.index("_sigterm_notifier_fn") + 1, _peer_gone)
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)


#: for each call of the failing handler, the signal mate's handler had received by then (None: it had not run)
PEER_GONE_SAW: list = []


def _peer_gone(signum, frame) -> None:
    from mate_cli.callbacks import interrupts

    PEER_GONE_SAW.append(interrupts.received())
    raise RuntimeError("Read error [127.0.0.1]:19165: Connection reset by peer")


class SignalThenForkForever(L.Callback):
    """As training batch ``batch`` starts: SIGTERM to this process, which stops training at the batch's end; but the
    batch never ends, forking children that exit at once, as a loader starting endless workers did. The second
    SIGTERM comes a little over ``REPEAT_S`` later from inside an at-fork hook, where a signal that arrives during a
    fork lands: Python prints the exception the handler raises there and forks on.
    ``+callbacks.fork_forever._target_=tests.signal_at.SignalThenForkForever +callbacks.fork_forever.batch=1``."""

    def __init__(self, batch: int) -> None:
        self.batch = batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        from mate_cli.callbacks.interrupts import REPEAT_S

        if batch_idx != self.batch:
            return
        second_at, sent = time.monotonic() + REPEAT_S + 0.5, []

        def before_fork() -> None:
            if not sent and time.monotonic() > second_at:
                sent.append(True)
                os.kill(os.getpid(), signal.SIGTERM)  # its handler runs here, inside the hook

        os.kill(os.getpid(), signal.SIGTERM)
        os.register_at_fork(before=before_fork)
        while True:
            child = os.fork()
            if child == 0:
                os._exit(0)
            os.waitpid(child, 0)
            time.sleep(0.01)


class SignalJobAt(L.Callback):
    """As training batch ``batch`` of sweep job ``job`` starts, in a run that starts at step 0 (not a resumed one):
    ``signum`` to this process's group (``group=true``), as a time limit or Ctrl-C reaches a sweep and all its
    processes, or to this job's process alone (a scheduler pre-empting one job):
    ``+callbacks.signal_job._target_=tests.signal_at.SignalJobAt +callbacks.signal_job.job=2
    +callbacks.signal_job.batch=1``."""

    def __init__(self, job: int, batch: int, signum: int = int(signal.SIGTERM), group: bool = True) -> None:
        self.job, self.batch, self.signum, self.group, self.fresh = job, batch, signum, group, False

    def on_train_start(self, trainer, pl_module) -> None:
        self.fresh = trainer.global_step == 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        from hydra.core.hydra_config import HydraConfig

        if self.fresh and batch_idx == self.batch and HydraConfig.get().job.num == self.job:
            self.fresh = False
            if self.group:
                os.killpg(os.getpgrp(), self.signum)
            else:
                os.kill(os.getpid(), self.signum)
