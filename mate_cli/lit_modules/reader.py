"""PointR stage 2 as a LightningModule: encoder + span head, cross-entropy to the gold span.

Thin wiring: the encoder (built by Hydra, ``attention: dense``) and the
:class:`~mate_cli.modeling.span.SpanHead`; the loss and decoding live in
:mod:`mate_cli.modeling.span`, EM/F1 in :mod:`mate_cli.metrics.hybridqa`.
Validation reports ``val/em`` and ``val/f1`` (percent, the official script's scale) of
the decoded span against the answer, on the gold cell of each question.
Optimiser (paper App. A, reader stage): AdamW, lr 5e-5, linear warm-up over 1% of the
steps then linear decay to 0, weight decay on everything but biases and LayerNorms.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import nn
from torchmetrics import MeanMetric

from mate_cli.data.reader import ReaderBatch
from mate_cli.metrics.hybridqa import exact_match, f1_score
from mate_cli.modeling.span import SpanHead, span_loss


class ReaderModule(L.LightningModule):
    """Span reader: ``P(s) = softmax_{valid s} MLP([h_start(s); h_end(s)])``.

    Args:
        encoder: a :class:`~mate_cli.modeling.encoder.TableEncoder` (dense attention).
        max_span_length: longest answer span, in word pieces.
        mlp_hidden: width of the span MLP's hidden layer (default: the encoder's hidden size).
        lr, weight_decay, warmup_ratio, adam_eps: optimiser settings.
    """

    def __init__(
        self,
        encoder: nn.Module,
        max_span_length: int = 30,
        mlp_hidden: int | None = None,
        lr: float = 5e-5,
        weight_decay: float = 0.01,
        warmup_ratio: float = 0.01,
        adam_eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["encoder"])
        self.encoder = encoder
        self.head = SpanHead(
            encoder.config.hidden_size, max_span_length, mlp_hidden, getattr(encoder.config, "initializer_range", 0.02)
        )
        self.val_em, self.val_f1 = MeanMetric(), MeanMetric()
        self.test_em, self.test_f1 = MeanMetric(), MeanMetric()

    def forward(self, batch: ReaderBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scores, valid)``, each ``[batch, seq, max_span_length]``."""
        hidden = self.encoder(batch.input_ids, batch.layout)
        return self.head(hidden, batch.context_mask, batch.start_ok, batch.end_ok)

    def training_step(self, batch: ReaderBatch, batch_idx: int) -> torch.Tensor:
        scores, valid = self(batch)
        loss, used = span_loss(scores, valid, batch.gold_start, batch.gold_end)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch))
        self.log("train/gold_used", used.float().mean(), batch_size=len(batch))
        return loss

    def validation_step(self, batch: ReaderBatch, batch_idx: int) -> None:
        self._eval_step(batch, "val", self.val_em, self.val_f1)

    def test_step(self, batch: ReaderBatch, batch_idx: int) -> None:
        self._eval_step(batch, "test", self.test_em, self.test_f1)

    def _eval_step(self, batch: ReaderBatch, stage: str, em: MeanMetric, f1: MeanMetric) -> None:
        scores, valid = self(batch)
        loss, used = span_loss(scores, valid, batch.gold_start, batch.gold_end)
        if bool(used.any()):
            self.log(f"{stage}/loss", loss, batch_size=int(used.sum()))
        start, end, _ = self.head.decode(scores, valid)
        preds = batch.texts(start, end)
        em.update(torch.tensor([100.0 * exact_match(a, p) for a, p in zip(batch.answers, preds)]))
        f1.update(torch.tensor([100.0 * f1_score(a, p) for a, p in zip(batch.answers, preds)]))
        self.log(f"{stage}/em", em, batch_size=len(batch))
        self.log(f"{stage}/f1", f1, prog_bar=True, batch_size=len(batch))

    @torch.no_grad()
    def predict_batch(self, batch: ReaderBatch) -> list[dict]:
        """``[{"question_id", "pred", "prob", "start", "end"}]`` for one batch (eval mode is the caller's)."""
        scores, valid = self(batch)
        start, end, prob = self.head.decode(scores, valid)
        texts = batch.texts(start, end)
        return [
            {"question_id": q, "pred": t, "prob": float(p), "start": int(s), "end": int(e)}
            for q, t, p, s, e in zip(batch.question_ids, texts, prob, start, end)
        ]

    def predict_step(self, batch: ReaderBatch, batch_idx: int) -> list[dict]:
        return self.predict_batch(batch)

    def configure_optimizers(self):
        return adamw_with_warmup(
            self, self.hparams.lr, self.hparams.weight_decay, self.hparams.warmup_ratio, self.hparams.adam_eps
        )


def adamw_with_warmup(module: L.LightningModule, lr: float, weight_decay: float, warmup_ratio: float, eps: float):
    """AdamW (no decay on biases/LayerNorm) + linear warm-up then linear decay, stepped per batch."""
    from transformers import get_linear_schedule_with_warmup

    no_decay = ("bias", "LayerNorm.weight", "layer_norm.weight")
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in named if not n.endswith(no_decay)], "weight_decay": weight_decay},
        {"params": [p for n, p in named if n.endswith(no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=lr, eps=eps)
    total = max(1, int(module.trainer.estimated_stepping_batches))
    scheduler = get_linear_schedule_with_warmup(optimizer, int(round(warmup_ratio * total)), total)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
