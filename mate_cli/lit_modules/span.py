"""PointR stage 2: encoder + span head (:mod:`mate_cli.modeling.span`); ``<stage>/em`` and ``<stage>/f1`` (percent) of
the decoded span on each question's gold cell."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from mate_cli.data.span import SpanBatch
from mate_cli.lit_modules.base import EvaluatedTaskModule, stage_metrics
from mate_cli.metrics.hybridqa import exact_match, f1_score
from mate_cli.modeling.span import SpanHead, span_loss


class SpanModule(EvaluatedTaskModule):
    """``max_span_length`` in word pieces; ``mlp_hidden``: the span MLP's width (None: the encoder's hidden size)."""

    def __init__(
        self,
        encoder: nn.Module,
        optimizer: Callable,
        scheduler: Callable | None = None,
        max_span_length: int = 30,
        mlp_hidden: int | None = None,
        **extra,
    ) -> None:
        super().__init__(encoder, optimizer, scheduler, **extra)
        self.save_hyperparameters(ignore=["encoder", "optimizer", "scheduler"])
        self.head = SpanHead(
            encoder.config.hidden_size, max_span_length, mlp_hidden, getattr(encoder.config, "initializer_range", 0.02)
        )
        self.metrics = stage_metrics("em", "f1", "loss")

    def forward(self, batch: SpanBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scores, valid)``, each ``[batch, seq, max_span_length]``."""
        hidden = self.encode(batch.input_ids, batch.layout)
        return self.head(hidden, batch.context_mask, batch.start_ok, batch.end_ok)

    def training_step(self, batch: SpanBatch, batch_idx: int) -> torch.Tensor:
        scores, valid = self(batch)
        loss, used = span_loss(scores, valid, batch.gold_start, batch.gold_end)
        self.log("train/loss", loss, batch_size=len(batch), sync_dist=True)
        self.log("train/gold_used", used.float().mean(), batch_size=len(batch), sync_dist=True)
        em, f1 = self.scores(batch, scores, valid)
        self.log_train_metric("em", em, len(batch))
        self.log_train_metric("f1", f1, len(batch))
        return loss

    def _eval_step(self, batch: SpanBatch, stage: str) -> None:
        scores, valid = self(batch)
        loss, used = span_loss(scores, valid, batch.gold_start, batch.gold_end)
        # the mean over the examples with a usable gold span; updated for every batch (weight 0 when none is
        # usable), since under DDP every rank must log the same keys
        self.update_logged(stage, "loss", loss.detach(), weight=used.sum(), batch_size=len(batch))
        em, f1 = self.scores(batch, scores, valid)
        self.update_logged(stage, "em", em, batch_size=len(batch))
        self.update_logged(stage, "f1", f1, batch_size=len(batch), prog_bar=True)

    @torch.no_grad()
    def scores(self, batch: SpanBatch, scores: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per example, EM and F1 (0-100, official HybridQA normalisation) of the decoded span."""
        start, end, _ = self.head.decode(scores.detach(), valid)
        pairs = list(zip(batch.answers, batch.texts(start, end)))
        em = torch.tensor([100.0 * exact_match(a, p) for a, p in pairs])
        return em, torch.tensor([100.0 * f1_score(a, p) for a, p in pairs])

    @torch.no_grad()
    def predict_batch(self, batch: SpanBatch) -> list[dict]:
        """``[{"question_id", "pred", "prob", "start", "end"}]`` for one batch (eval mode is the caller's)."""
        scores, valid = self(batch)
        start, end, prob = self.head.decode(scores, valid)
        texts = batch.texts(start, end)
        return [
            {"question_id": q, "pred": t, "prob": float(p), "start": int(s), "end": int(e)}
            for q, t, p, s, e in zip(batch.question_ids, texts, prob, start, end)
        ]
