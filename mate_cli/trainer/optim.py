"""Every task module's ``configure_optimizers``; the optimiser and schedule are Hydra partials (``conf/model/``)."""

from __future__ import annotations

from typing import Callable

import lightning as L
import torch
from transformers import get_linear_schedule_with_warmup

#: parameter-name endings that get no weight decay (BERT's convention)
NO_DECAY = ("bias", "LayerNorm.weight", "layer_norm.weight")


def parameter_groups(module: torch.nn.Module, lr: dict[str, float] | None = None) -> list[dict]:
    """Trainable parameters, decayed (the optimiser's weight decay) and not (0); ``lr``: submodule name -> its own
    learning rate (its parameters in groups of their own, e.g. DT-Fixup's extra layers), the rest the optimiser's."""
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    own = {prefix: rate for prefix, rate in (lr or {}).items() if rate is not None}

    def owner(name: str) -> str | None:
        return next((prefix for prefix in own if name.startswith(prefix + ".")), None)

    groups = []
    for prefix in [None, *own]:
        rate = {} if prefix is None else {"lr": own[prefix]}
        params = [(n, p) for n, p in named if owner(n) == prefix]
        groups.append({"params": [p for n, p in params if not n.endswith(NO_DECAY)], **rate})
        groups.append({"params": [p for n, p in params if n.endswith(NO_DECAY)], "weight_decay": 0.0, **rate})
    return groups


def linear_warmup(optimizer: torch.optim.Optimizer, total_steps: int, warmup_ratio: float = 0.0):
    return get_linear_schedule_with_warmup(optimizer, int(round(warmup_ratio * total_steps)), total_steps)


def configure(
    module: L.LightningModule, optimizer: Callable, scheduler: Callable | None, lr: dict[str, float] | None = None
) -> dict:
    """``optimizer(groups)`` and ``scheduler(opt, total_steps=)`` (the trainer's estimate), stepped every step."""
    opt = optimizer(parameter_groups(module, lr))
    if getattr(opt, "_step_supports_amp_scaling", False):
        # torch's fused optimisers tell GradScaler they unscale gradients themselves, and Lightning's mixed precision
        # then refuses gradient clipping; stepped as any optimiser (GradScaler unscales first), they clip as usual
        del opt._step_supports_amp_scaling
    if scheduler is None:
        return {"optimizer": opt}
    total = max(1, int(module.trainer.estimated_stepping_batches))
    return {"optimizer": opt, "lr_scheduler": {"scheduler": scheduler(opt, total_steps=total), "interval": "step"}}
