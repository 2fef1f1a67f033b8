"""A Lightning callback for tests: a real signal to this process at a chosen training batch."""

from __future__ import annotations

import os
import signal

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
