"""Masked-LM pre-training (MATE §3.2, App. A.1): encoder + BERT's MLM head (:mod:`mate_cli.modeling.mlm`).

Logged on the held-out tables: ``val/mlm_loss`` and ``val/mlm_accuracy``, means over every predicted word piece of the
split however batched (under DDP, the validation inside fit sees Lightning's padded split, a few examples twice; the
final validation sees each once)."""

from __future__ import annotations

import logging
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MeanMetric

from mate_cli.data.masking import IGNORE
from mate_cli.data.records import MaskedBatch
from mate_cli.lit_modules.base import EncoderTaskModule
from mate_cli.modeling.mlm import MaskedLMHead, load_mlm_head, mlm_state_dict

log = logging.getLogger(__name__)


class MaskedLMModule(EncoderTaskModule):
    """``pretrained``: the encoder's checkpoint; its ``cls.predictions`` tensors, if any, start the head."""

    def __init__(
        self,
        encoder: nn.Module,
        optimizer: Callable,
        scheduler: Callable | None = None,
        pretrained: str | None = None,
        **extra,
    ) -> None:
        super().__init__(encoder, optimizer, scheduler, **extra)
        self.save_hyperparameters(ignore=["encoder", "optimizer", "scheduler"])
        self.head = MaskedLMHead(encoder.config, encoder.embeddings.word_embeddings)
        loaded = load_mlm_head(self.head, pretrained) if pretrained else []
        fresh = "no cls.predictions in the checkpoint; BERT initialisation, decoder tied to the word embeddings"
        log.info("masked-LM head: %s", f"loaded {len(loaded)} tensors from {pretrained}" if loaded else fresh)
        self.val_loss, self.val_accuracy = MeanMetric(), MeanMetric()

    def forward(self, batch: MaskedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits [predictions, vocab], targets [predictions])`` at the masked positions."""
        hidden = self.encode(batch.input_ids, batch.layout)
        picked = batch.labels != IGNORE
        return self.head(hidden[picked]).float(), batch.labels[picked]

    def training_step(self, batch: MaskedBatch, batch_idx: int) -> torch.Tensor:
        logits, targets = self(batch)
        loss = F.cross_entropy(logits, targets) if len(targets) else logits.sum() * 0.0
        self.log("train/loss", loss, batch_size=len(batch), sync_dist=True)
        if len(targets):
            self.log_train_metric("mlm_accuracy", logits.argmax(-1) == targets, len(batch))
        return loss

    def validation_step(self, batch: MaskedBatch, batch_idx: int) -> None:
        logits, targets = self(batch)
        if not len(targets):
            return
        count = torch.tensor(float(len(targets)), device=logits.device)
        self.val_loss.update(F.cross_entropy(logits, targets), weight=count)
        self.val_accuracy.update((logits.argmax(-1) == targets).float().mean(), weight=count)
        self.log("val/mlm_loss", self.val_loss, prog_bar=True, batch_size=len(batch))
        self.log("val/mlm_accuracy", self.val_accuracy, prog_bar=True, batch_size=len(batch))

    def export_pretrained(self, directory, tokenizer=None):
        """Encoder + MLM head as a ``transformers.TapasForMaskedLM`` directory
        (``model.encoder.pretrained`` reads it)."""
        return self.encoder.save_pretrained(
            directory, tokenizer=tokenizer, extra_state=mlm_state_dict(self.head), prefix="tapas."
        )
