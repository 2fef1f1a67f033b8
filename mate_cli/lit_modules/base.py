"""What every task module shares: the encoder, and the optimiser and schedule from yaml."""

from __future__ import annotations

from typing import Callable

import lightning as L
from torch import nn

from mate_cli.lit_modules.optim import configure


class EncoderTaskModule(L.LightningModule):
    """A task on top of the :class:`~mate_cli.modeling.encoder.TableEncoder`.

    Args:
        encoder: the encoder (built by Hydra from ``conf/model/encoder``).
        optimizer: ``optimizer(parameter_groups)`` (a Hydra partial, e.g. AdamW).
        scheduler: ``scheduler(optimizer, total_steps=)`` (a Hydra partial) or None.

    BERT's pooler takes no part in the token-level tasks (it only travels with an
    exported encoder), so it is frozen unless the task reads [CLS] through it
    (``uses_pooler``: TAPAS's aggregation and entailment heads): DDP would otherwise wait
    for its gradients.
    """

    #: whether the task's heads read the pooled [CLS] (then the pooler trains)
    uses_pooler = False

    def __init__(self, encoder: nn.Module, optimizer: Callable, scheduler: Callable | None = None) -> None:
        super().__init__()
        #: ``start/val/*``: the starting checkpoint's validation metrics (``validate_start``),
        #: kept in every checkpoint so a resumed run still reports them
        self.start_metrics: dict[str, float] = {}
        self.encoder = encoder
        self.optimizer, self.scheduler = optimizer, scheduler
        if hasattr(encoder, "pooler") and not self.uses_pooler:
            encoder.pooler.requires_grad_(False)

    def configure_optimizers(self):
        return configure(self, self.optimizer, self.scheduler)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["mate_start_metrics"] = dict(self.start_metrics)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.start_metrics = dict(checkpoint.get("mate_start_metrics", {}))

    def export_pretrained(self, directory, tokenizer=None):
        """Write the encoder as a ``transformers.TapasModel`` directory (``export_encoder=true``);
        a module whose head travels with it (masked-LM pre-training) writes that too."""
        return self.encoder.save_pretrained(directory, tokenizer=tokenizer)
