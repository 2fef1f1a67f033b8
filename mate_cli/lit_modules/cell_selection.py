"""PointR stage 1: encoder + cell head and loss (:mod:`mate_cli.modeling.heads`), Hits@1/3/5."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from mate_cli.data.records import Batch
from mate_cli.lit_modules.base import EvaluatedTaskModule, stage_metrics
from mate_cli.metrics.retrieval import hits_at_k
from mate_cli.modeling.heads import CellSelectionHead, first_candidate_loss, mml_loss

HITS_K = (1, 3, 5)


class CellSelectionModule(EvaluatedTaskModule):
    """``mml``: MML over all candidate cells (the paper's), else cross-entropy to the first candidate."""

    def __init__(
        self, encoder: nn.Module, optimizer: Callable, scheduler: Callable | None = None, mml: bool = True, **extra
    ) -> None:
        super().__init__(encoder, optimizer, scheduler, **extra)
        self.save_hyperparameters(ignore=["encoder", "optimizer", "scheduler"])
        self.head = CellSelectionHead(encoder.config.hidden_size, encoder.config.initializer_range)
        self.loss_fn = mml_loss if mml else first_candidate_loss
        self.metrics = stage_metrics("loss", *(f"hits@{k}" for k in HITS_K))

    def forward(self, batch: Batch) -> torch.Tensor:
        """Cell logits ``[batch, cells + 1]``."""
        hidden = self.encode(batch.input_ids, batch.layout)
        return self.head(hidden, batch.layout, batch.cell_mask.shape[1] - 1)

    def _step(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self(batch)
        return logits, self.loss_fn(logits, batch.cell_mask, batch.candidate_mask)

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        logits, loss = self._step(batch)
        self.log("train/loss", loss, batch_size=len(batch), sync_dist=True)
        hits = hits_at_k(logits.detach(), batch.cell_mask, batch.candidate_mask, 1)
        self.log_train_metric("hits@1", hits, len(batch))
        return loss

    def _eval_step(self, batch: Batch, stage: str) -> None:
        logits, loss = self._step(batch)
        # weighted by the examples with a candidate: the split's mean however batched, exact under DDP (unlike a
        # sync_dist mean, whose integer batch-size count Lightning divides by the world size)
        weight = (batch.candidate_mask & batch.cell_mask).any(dim=-1).sum()
        self.update_logged(stage, "loss", loss.detach(), weight=weight, batch_size=len(batch))
        for k in HITS_K:
            hits = hits_at_k(logits, batch.cell_mask, batch.candidate_mask, k).float()
            self.update_logged(stage, f"hits@{k}", hits, batch_size=len(batch), prog_bar=k == 1)
