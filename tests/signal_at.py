"""A Lightning callback for tests: a real signal to this process at a chosen training batch."""

from __future__ import annotations

import os
import signal

import lightning as L


class SignalAt(L.Callback):
    """Sends this process ``signum`` once, as training batch ``batch`` starts (as a scheduler's time limit may):
    ``+callbacks.signal_at._target_=tests.signal_at.SignalAt +callbacks.signal_at.batch=2``."""

    def __init__(self, batch: int, signum: int = int(signal.SIGTERM)) -> None:
        self.batch, self.signum, self.sent = batch, signum, False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == self.batch and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signum)
