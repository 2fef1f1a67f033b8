"""Progress as log lines where stdout is not a terminal (Rich's bar draws nothing there): one every
``every_n_seconds`` or ``every_n_steps`` steps (batches in evaluation), whichever comes first, and at ``max_steps`` or
an evaluation loop's last batch; in a terminal none unless ``always``. In training a line waits for the next step that
logs (``trainer.log_every_n_steps``), where the host reads the loss anyway: reading it on another step would make the
host wait for the GPU. :class:`RichProgressBar` is Lightning's bar, likewise."""

from __future__ import annotations

import logging
import sys
import time

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar as _RichProgressBar

from mate_cli.trainer.lightning_internals import is_log_step

log = logging.getLogger(__name__)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {seconds:02d}s"


class _Clock:
    """When the last line was logged, and what was counted since."""

    def __init__(self, step: int = 0) -> None:
        self.start = self.time = time.monotonic()
        self.step, self.examples = step, 0

    def due(self, every_s: float, every_steps: int | None, step: int) -> bool:
        return time.monotonic() - self.time >= every_s or bool(every_steps and step - self.step >= every_steps)

    def lap(self, step: int) -> tuple[float, float, str]:
        """``(steps/s, examples/s, elapsed)`` since the last line, which this one becomes."""
        now = time.monotonic()
        seconds = max(now - self.time, 1e-9)
        rates = ((step - self.step) / seconds, self.examples / seconds, _duration(now - self.start))
        self.time, self.step, self.examples = now, step, 0
        return rates


class ProgressLog(L.Callback):
    def __init__(self, every_n_seconds: float = 60.0, every_n_steps: int | None = None, always: bool = False) -> None:
        self.every_n_seconds = float(every_n_seconds)
        self.every_n_steps = int(every_n_steps) if every_n_steps else None
        self.always = bool(always)
        self._active = False
        self._train = self._eval = _Clock()

    def _on(self, trainer) -> bool:
        return trainer.is_global_zero and (self.always or not sys.stdout.isatty())

    def on_train_start(self, trainer, pl_module) -> None:
        self._active = self._on(trainer)
        self._train = _Clock(trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self._active:
            return
        clock, step = self._train, trainer.global_step
        clock.examples += len(batch)
        last = trainer.max_steps is not None and 0 < trainer.max_steps <= step
        if not (last or is_log_step(trainer) and clock.due(self.every_n_seconds, self.every_n_steps, step)):
            return
        rate, examples, elapsed = clock.lap(step)
        total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        loss = trainer.callback_metrics.get("train/loss")
        parts = [f"step {step}/{total}" if total else f"step {step}", f"epoch {trainer.current_epoch}"]
        if loss is not None:
            parts.append(f"train/loss {float(loss):.4f}")
        parts += [f"{examples:.1f} examples/s", f"{rate:.2f} steps/s", f"elapsed {elapsed}"]
        if total and rate > 0:
            parts.append(f"{_duration((total - step) / rate)} left")
        log.info("progress: %s", ", ".join(parts))

    def _eval_batch_end(self, trainer, batch, batch_idx: int, dataloader_idx: int, stage: str) -> None:
        if not self._on(trainer) or trainer.sanity_checking:
            return
        clock, done = self._eval, batch_idx + 1
        clock.examples += len(batch)
        batches = trainer.num_val_batches if stage == "validation" else trainer.num_test_batches
        total = batches[dataloader_idx] if dataloader_idx < len(batches) else None
        total = int(total) if isinstance(total, (int, float)) and total != float("inf") else None
        last = total is not None and done >= total
        if not (clock.due(self.every_n_seconds, self.every_n_steps, done) or last):
            return
        rate, examples, elapsed = clock.lap(done)
        where = f"{stage} batch {done}/{total}" if total else f"{stage} batch {done}"
        parts = [where, f"{examples:.1f} examples/s", f"elapsed {elapsed}"]
        if total and rate > 0 and not last:
            parts.append(f"{_duration((total - done) / rate)} left")
        log.info("progress: %s", ", ".join(parts))

    def on_validation_start(self, trainer, pl_module) -> None:
        self._eval = _Clock()

    on_test_start = on_validation_start

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._eval_batch_end(trainer, batch, batch_idx, dataloader_idx, "validation")

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._eval_batch_end(trainer, batch, batch_idx, dataloader_idx, "test")


class RichProgressBar(_RichProgressBar):
    """Lightning's Rich progress bar, with the training loss (``train/loss``, logged without ``prog_bar``) updated on
    the steps that log instead of after every step, where reading it would make the host wait for the GPU; a run
    bounded by steps alone (``trainer.max_epochs=-1``) shows "Epoch 3", not Lightning's "Epoch 3/-2"."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._shown: dict = {}
        self._in_step = False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._in_step = True
        try:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        finally:
            self._in_step = False

    def _get_train_description(self, current_epoch: int) -> str:
        if (epochs := self.trainer.max_epochs) is None or epochs >= 0:
            return super()._get_train_description(current_epoch)
        return f"Epoch {current_epoch}".ljust(len(self.validation_description))  # padded as Lightning's: no flicker

    def get_metrics(self, trainer, pl_module) -> dict:
        if self._in_step and not is_log_step(trainer) and self._shown:
            return self._shown
        metrics = super().get_metrics(trainer, pl_module)
        if (loss := trainer.callback_metrics.get("train/loss")) is not None:
            metrics["train/loss"] = float(loss)
        self._shown = metrics
        return metrics
