"""TabFact: encoder + TAPAS's entailment classifier on the pooled sequence (``model.pooling``).

Logged per evaluation: ``<stage>/loss``, ``<stage>/accuracy`` and, when the upstream simple/complex id lists are
present, ``<stage>/accuracy_simple`` and ``<stage>/accuracy_complex``."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from mate_cli.data.records import TaskBatch
from mate_cli.lit_modules.base import EvaluatedTaskModule, stage_metrics
from mate_cli.modeling import checkpoints
from mate_cli.modeling.tapas_heads import TapasClassificationHead

CHANNELS = ("simple", "complex")
VERDICTS = ("refuted", "entailed")


class EntailmentModule(EvaluatedTaskModule):
    """``pretrained``: the encoder's checkpoint; a TAPAS TabFact checkpoint's ``classifier`` loads from it."""

    uses_pooler = True
    supports_dot = True

    def __init__(
        self,
        encoder: nn.Module,
        optimizer: Callable,
        scheduler: Callable | None = None,
        num_labels: int = 2,
        pretrained: str | None = None,
        **extra,
    ) -> None:
        super().__init__(encoder, optimizer, scheduler, **extra)
        self.save_hyperparameters(ignore=["encoder", "optimizer", "scheduler", "dot"])
        config = encoder.config
        self.head = TapasClassificationHead(
            config.hidden_size, num_labels, config.initializer_range, config.hidden_dropout
        )
        if pretrained:
            checkpoints.load_head(self.head, pretrained, "task head")
        self.metrics = stage_metrics("loss", "accuracy", *(f"accuracy_{c}" for c in CHANNELS))
        self.predictions: list[dict] = []

    def forward(self, batch: TaskBatch) -> torch.Tensor:
        """``[batch, num_labels]`` logits (with DoT: from the kept tokens)."""
        return self.logits(self.prune(batch)[0])

    def logits(self, batch: TaskBatch) -> torch.Tensor:
        return self.head(self.pool(self.encode(batch.input_ids, batch.layout), batch.layout))

    def training_step(self, batch: TaskBatch, batch_idx: int) -> torch.Tensor:
        kept, pruned = self.prune(batch)
        logits = self.logits(kept)
        loss = nn.functional.cross_entropy(logits, batch.labels)
        self.log("train/loss", loss, batch_size=len(batch), sync_dist=True)
        self.log_train_metric("accuracy", logits.argmax(-1) == batch.labels, len(batch))
        return self.with_pruning_loss(loss, batch, pruned)

    def on_validation_epoch_start(self) -> None:
        self.predictions = []

    on_test_epoch_start = on_validation_epoch_start

    def _eval_step(self, batch: TaskBatch, stage: str) -> None:
        logits = self(batch)
        known = batch.labels >= 0
        if bool(known.any()):
            loss = nn.functional.cross_entropy(logits[known], batch.labels[known])
            self.update_logged(stage, "loss", loss.detach(), weight=known.sum(), batch_size=len(batch))
        predicted = logits.argmax(-1)
        correct = (predicted == batch.labels).float()
        self.update_logged(stage, "accuracy", correct[known], batch_size=len(batch), prog_bar=True)
        labelled = known.tolist()  # read once a batch, not once an example (on a GPU a read waits for the device)
        for channel in CHANNELS:
            if rows := [i for i, c in enumerate(batch.channels) if c == channel and labelled[i]]:
                self.update_logged(stage, f"accuracy_{channel}", correct[rows], batch_size=len(rows))
        self.predictions.extend(self.decode(batch, logits))

    def decode(self, batch: TaskBatch, logits: torch.Tensor) -> list[dict]:
        best = torch.softmax(logits.float(), dim=-1).max(-1)
        labels, probabilities = best.indices.tolist(), best.values.tolist()
        return [
            dict(question_id=q, table_id=t, label=k, verdict=VERDICTS[k], probability=p, gold=int(g))
            for q, t, p, k, g in zip(batch.question_ids, batch.table_ids, probabilities, labels, batch.labels.tolist())
        ]

    def predict_step(self, batch: TaskBatch, batch_idx: int) -> list[dict]:
        return self.decode(batch, self(batch))
