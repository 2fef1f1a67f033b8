"""Progress as log lines where the progress bar draws nothing.

Under ``nohup``, a cluster's job log or any stdout that is not a terminal, Rich's progress
bar stays silent, so a long run printed nothing between its model summary and its final
table. This callback then logs one line every ``every_n_seconds`` of training (and at the
last step): the step reached of ``max_steps``, the epoch, the last ``train/loss``, the
steps per second since the previous line and the time left at that rate. In a terminal
it stays quiet (the bar shows the same), unless ``always`` is set.
"""

from __future__ import annotations

import logging
import sys
import time

import lightning as L

log = logging.getLogger(__name__)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {seconds:02d}s"


class ProgressLog(L.Callback):
    """One log line of training progress every ``every_n_seconds`` when stdout is not a terminal."""

    def __init__(self, every_n_seconds: float = 60.0, always: bool = False) -> None:
        self.every_n_seconds = float(every_n_seconds)
        self.always = bool(always)
        self._active = False

    def on_train_start(self, trainer, pl_module) -> None:
        self._active = trainer.is_global_zero and (self.always or not sys.stdout.isatty())
        self._last_time, self._last_step = time.monotonic(), trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self._active:
            return
        now, step = time.monotonic(), trainer.global_step
        last = trainer.max_steps is not None and 0 < trainer.max_steps <= step
        if now - self._last_time < self.every_n_seconds and not last:
            return
        rate = (step - self._last_step) / max(now - self._last_time, 1e-9)
        total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        loss = trainer.callback_metrics.get("train/loss")
        parts = [f"step {step}/{total}" if total else f"step {step}", f"epoch {trainer.current_epoch}"]
        if loss is not None:
            parts.append(f"train/loss {float(loss):.4f}")
        parts.append(f"{rate:.2f} steps/s")
        if total and rate > 0:
            parts.append(f"{_duration((total - step) / rate)} left")
        log.info("progress: %s", ", ".join(parts))
        self._last_time, self._last_step = now, step
