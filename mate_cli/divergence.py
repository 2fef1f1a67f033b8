"""Non-finite numbers are never a silent result: :class:`StopOnNonFiniteLoss` stops training at the first non-finite
loss, before its backward pass (weights and checkpoints stay finite), naming the step and question ids; checkpoints
with non-finite weights are refused (:func:`mate_cli.runs.check_checkpoint_fits`); :func:`non_finite_metrics` names
what ``mate train``/``eval`` warn of and ``mate report`` counts as failed. Inputs beyond float32:
:mod:`mate_cli.data.numbers`."""

from __future__ import annotations

import math
from typing import Mapping

import lightning as L
import torch

from mate_cli.errors import MateError


def non_finite_tensors(state: Mapping[str, object]) -> list[str]:
    return [
        key
        for key, value in state.items()
        if isinstance(value, torch.Tensor) and value.is_floating_point() and not bool(torch.isfinite(value).all())
    ]


def non_finite_metrics(metrics: Mapping[str, object]) -> list[str]:
    return sorted(
        key
        for key, value in metrics.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isfinite(value)
    )


class StopOnNonFiniteLoss(L.Callback):
    def __init__(self) -> None:
        self._ids: list[str] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._ids = [str(q) for q in getattr(batch, "question_ids", None) or []]

    def on_before_backward(self, trainer, pl_module, loss: torch.Tensor) -> None:
        if bool(torch.isfinite(loss.detach()).all()):
            return
        shown = ", ".join(self._ids[:8]) + (f" and {len(self._ids) - 8} more" if len(self._ids) > 8 else "")
        batch = f" on the batch of questions {shown}" if shown else ""
        raise MateError(
            f"the training loss is {float(loss.detach().float().mean())} at step {trainer.global_step + 1}"
            f"{batch} (no weights were updated with it); check those examples' answers and table "
            "values, or lower model.optimizer.lr"
        )
