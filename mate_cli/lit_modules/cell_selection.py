"""PointR stage 1 as a LightningModule: encoder + cell head, MML loss, Hits@1/3/5.

Thin wiring only: the encoder (any attention backend) and the head are built by
Hydra and handed in; the loss lives in :mod:`mate_cli.modeling.heads`, the metric in
:mod:`mate_cli.metrics.retrieval`. Optimiser: AdamW with a linear warm-up
(``warmup_ratio`` of the total steps, paper: 5%) then linear decay to 0, as BERT.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import nn

from mate_cli.data.schema import Batch
from mate_cli.metrics.retrieval import HitsAtK
from mate_cli.modeling.heads import CellSelectionHead, first_candidate_loss, mml_loss

HITS_K = (1, 3, 5)


class CellSelectionModule(L.LightningModule):
    """Cell selection: ``P(c) = softmax_c(mean_{t in c} w·h_t)``.

    Args:
        encoder: a :class:`~mate_cli.modeling.encoder.TableEncoder`.
        mml: train with MML over all candidates (paper) or CE to the first candidate.
        lr, weight_decay, warmup_ratio, adam_eps: optimiser settings.
    """

    def __init__(
        self,
        encoder: nn.Module,
        mml: bool = True,
        lr: float = 1e-5,
        weight_decay: float = 0.01,
        warmup_ratio: float = 0.05,
        adam_eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["encoder"])
        self.encoder = encoder
        self.head = CellSelectionHead(encoder.config.hidden_size, encoder.config.initializer_range)
        self.loss_fn = mml_loss if mml else first_candidate_loss
        self.val_hits = nn.ModuleDict({f"hits@{k}": HitsAtK(k) for k in HITS_K})
        self.test_hits = nn.ModuleDict({f"hits@{k}": HitsAtK(k) for k in HITS_K})

    def forward(self, batch: Batch) -> torch.Tensor:
        """Cell logits ``[batch, cells + 1]``."""
        hidden = self.encoder(batch.input_ids, batch.layout)
        return self.head(hidden, batch.layout, batch.cell_mask.shape[1] - 1)

    def _step(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self(batch)
        return logits, self.loss_fn(logits, batch.cell_mask, batch.candidate_mask)

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        _, loss = self._step(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch))
        return loss

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._eval_step(batch, "val", self.val_hits)

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._eval_step(batch, "test", self.test_hits)

    def _eval_step(self, batch: Batch, stage: str, hits: nn.ModuleDict) -> None:
        logits, loss = self._step(batch)
        self.log(f"{stage}/loss", loss, batch_size=len(batch))
        for name, metric in hits.items():
            metric.update(logits, batch.cell_mask, batch.candidate_mask)
            self.log(f"{stage}/{name}", metric, prog_bar=name == "hits@1", batch_size=len(batch))

    def predict_step(self, batch: Batch, batch_idx: int) -> dict:
        logits = self(batch)
        probs = torch.softmax(logits.masked_fill(~batch.cell_mask, float("-inf")), dim=-1)
        return {"question_ids": batch.question_ids, "probs": probs, "cell_coords": batch.cell_coords}

    def configure_optimizers(self):
        from transformers import get_linear_schedule_with_warmup

        no_decay = ("bias", "LayerNorm.weight", "layer_norm.weight")
        groups = [
            {"params": [p for n, p in self.named_parameters() if not n.endswith(no_decay)],
             "weight_decay": self.hparams.weight_decay},
            {"params": [p for n, p in self.named_parameters() if n.endswith(no_decay)], "weight_decay": 0.0},
        ]
        optimizer = torch.optim.AdamW(groups, lr=self.hparams.lr, eps=self.hparams.adam_eps)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = int(round(self.hparams.warmup_ratio * total))
        scheduler = get_linear_schedule_with_warmup(optimizer, warmup, total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
