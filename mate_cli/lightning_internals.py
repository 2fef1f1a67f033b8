"""The Lightning internals exact resume (:mod:`mate_cli.resume`) reads, and nothing else does: no public API gives
them. ``tests/test_lightning_internals.py`` trains a real Trainer and fails when an installed Lightning moves one."""

from __future__ import annotations

from typing import Any

import lightning as L


def training_loaders(trainer: L.Trainer) -> list[Any]:
    """The training dataloaders of the running fit, flattened ([] before they exist)."""
    combined = trainer.fit_loop._combined_loader
    return list(combined.flattened) if combined is not None else []


def pending_log_row(trainer: L.Trainer) -> dict | None:
    """The row Lightning logs for the current training batch right after ``on_train_batch_end`` (with ``epoch`` and
    ``step``: the batches that stepped the optimiser), or None when it logs none."""
    connector = trainer._logger_connector
    if not trainer.training or not connector.should_update_logs or trainer.fit_loop._should_accumulate():
        return None
    values = {k: float(v) for k, v in connector.metrics["log"].items()}
    step = trainer.fit_loop.epoch_loop._batches_that_stepped
    return {**values, "epoch": trainer.current_epoch, "step": step} if values else None
