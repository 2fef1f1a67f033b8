"""The Lightning internals exact resumption and the sync-free training step read
(:mod:`mate_cli.lit_modules.lightning_internals`), on a real Trainer: each test fails when an installed
Lightning moves one of them."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

import csv

from lightning.pytorch.loggers import CSVLogger

from mate_cli.lit_modules.lightning_internals import is_log_step, pending_log_row, training_loaders


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        loss = self.layer(x).pow(2).mean()
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Seen(L.Callback):
    def __init__(self) -> None:
        self.loaders, self.rows, self.losses, self.logs = None, [], [], []

    def on_train_start(self, trainer, pl_module) -> None:
        self.loaders = training_loaders(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.rows.append(pending_log_row(trainer))
        self.logs.append(is_log_step(trainer))
        self.losses.append(float(outputs["loss"]))


def fit(tmp_path, **trainer_args) -> tuple[Seen, DataLoader]:
    loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)
    seen = Seen()
    trainer = L.Trainer(
        default_root_dir=tmp_path,
        max_steps=4,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[seen],
        **{"logger": False, **trainer_args},
    )
    trainer.fit(Tiny(), loader)
    return seen, loader


def test_the_fit_loop_hands_out_the_training_loader(tmp_path):
    seen, loader = fit(tmp_path)
    assert seen.loaders == [loader]


def test_the_row_about_to_be_logged_holds_the_batch_values_and_its_step(tmp_path):
    seen, _ = fit(tmp_path, log_every_n_steps=1)
    assert [row["step"] for row in seen.rows] == [0, 1, 2, 3]  # the step column Lightning writes
    assert [row["epoch"] for row in seen.rows] == [0] * 4
    assert [row["train/loss"] for row in seen.rows] == seen.losses
    seen, _ = fit(tmp_path, log_every_n_steps=2)
    assert [row is None for row in seen.rows] == [True, False, True, False]  # rows on steps 1 and 3 only


def test_a_logging_step_is_one_whose_values_the_logger_writes(tmp_path):
    seen, _ = fit(tmp_path, log_every_n_steps=3, logger=CSVLogger(tmp_path, name="csv", version=0))
    with open(tmp_path / "csv" / "version_0" / "metrics.csv", newline="") as handle:
        written = [int(row["step"]) for row in csv.DictReader(handle) if row.get("train/loss")]
    assert [i for i, logs in enumerate(seen.logs) if logs] == written == [2]
