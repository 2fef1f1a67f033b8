"""Non-finite numbers are never a silent result: :class:`StopOnNonFiniteLoss` stops training at the first non-finite
loss, naming the step and question ids, with no weights updated by it; checkpoints with non-finite weights are refused
(:func:`mate_cli.run.rebuild.check_checkpoint_fits`); :func:`non_finite_metrics` names what ``mate train``/``eval``
warn of and ``mate report`` counts as failed."""

from __future__ import annotations

import math
from typing import Mapping

import lightning as L
import torch

from mate_cli.errors import MateError
from mate_cli.trainer.lightning_internals import is_log_step


def non_finite_tensors(state: Mapping[str, object]) -> list[str]:
    floats = {k: v for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}
    return [key for key, value in floats.items() if not bool(torch.isfinite(value).all())]


def non_finite_metrics(metrics: Mapping[str, object]) -> list[str]:
    numbers = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return sorted(key for key, value in numbers.items() if not math.isfinite(value))


def skips_steps_on_device(optimizer) -> bool:
    """Whether ``optimizer`` skips its update on a non-zero ``found_inf`` on the device (torch's fused Adam, AdamW).
    Its parameter groups decide, not its defaults: a resumed optimiser takes its groups' settings from the checkpoint,
    so a run configured fused that resumes a checkpoint written unfused (``fused=false``, or before the option
    existed) steps unfused, and torch's unfused step refuses a ``found_inf``."""
    return isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW) and all(
        bool(group.get("fused")) for group in optimizer.param_groups
    )


class StopOnNonFiniteLoss(L.Callback):
    """Keeps the training step free of host synchronisation: each loss's finiteness stays on the device, and an
    optimiser that can (:func:`skips_steps_on_device`) skips the update of a step whose loss is not finite. The flag
    is read where the host reads values anyway: on the steps that log, before any checkpoint is written and at the end
    of each epoch and of training; training then stops naming the first such step and its questions (under DDP on every
    rank: the flag is the maximum over the ranks). Another optimiser's loss is read before every update."""

    def __init__(self) -> None:
        self._ids: dict[int, list[str]] = {}  # step -> the batch's question ids, since the last check
        self._first: torch.Tensor | None = None  # the first non-finite step since the last check (-1: none)
        self._loss: torch.Tensor | None = None  # its loss
        self._bad: torch.Tensor | None = None  # this step's losses are not all finite

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._ids[trainer.global_step + 1] = [str(q) for q in getattr(batch, "question_ids", None) or []]

    def on_before_backward(self, trainer, pl_module, loss: torch.Tensor) -> None:
        loss = loss.detach()
        bad = ~torch.isfinite(loss).all()
        self._bad = bad if self._bad is None else self._bad | bad  # gradient accumulation: any of the step's losses
        if self._first is None:
            self._first = torch.full((), -1, dtype=torch.long, device=loss.device)
            self._loss = torch.zeros((), dtype=torch.float32, device=loss.device)
        new = bad & (self._first < 0)
        self._step_tensor = torch.full_like(self._first, trainer.global_step + 1)
        self._first = torch.where(new, self._step_tensor, self._first)
        self._loss = torch.where(new, loss.float().mean(), self._loss)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if self._bad is None:
            return
        if skips_steps_on_device(optimizer):
            bad = self._bad.float()
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                # every rank skips the step (their gradients were averaged), and every rank stops at the check
                torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
                elsewhere = (bad > 0) & (self._first < 0)  # another rank's loss: its value is not here
                self._first = torch.where(elsewhere, self._step_tensor, self._first)
                self._loss = torch.where(elsewhere, torch.full_like(self._loss, float("nan")), self._loss)
            optimizer.found_inf = bad
        else:
            self.check(trainer)
        self._bad = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if is_log_step(trainer):
            self.check(trainer)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.check(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        self.check(trainer)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        if trainer.training:
            self.check(trainer)

    def check(self, trainer) -> None:
        """Stop training (:class:`MateError`) if a loss since the last check was not finite (one synchronisation)."""
        first = -1 if self._first is None else int(self._first)
        if first < 0:
            self._ids = {}
            return
        ids = self._ids.get(first, [])
        shown = ", ".join(ids[:8]) + (f" and {len(ids) - 8} more" if len(ids) > 8 else "")
        batch = f" on the batch of questions {shown}" if shown else ""
        now = trainer.global_step
        found = f"; found at step {now}, the first check after it" if now > first else ""
        raise MateError(
            f"the training loss is {float(self._loss)} at step {first}{batch} (no weights were updated with it"
            f"{found}); check those examples' answers and table values, or lower model.optimizer.lr"
        )
