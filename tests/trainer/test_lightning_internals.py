"""The Lightning internals exact resumption and the sync-free training step read, and the order of the signal
handlers Lightning composes (:mod:`mate_cli.trainer.lightning_internals`), and the Rich bar's method mate's bar
overrides, on a real Trainer: each test fails when an installed Lightning moves one of them."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

import csv

from lightning.pytorch.loggers import CSVLogger

from mate_cli.trainer.lightning_internals import is_log_step, iterate_training_data_again, pending_log_row
from mate_cli.trainer.lightning_internals import reopen_cut_epoch, training_loaders


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


def fit(tmp_path, max_steps: int = 4, **trainer_args) -> tuple[Seen, DataLoader]:
    loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)
    seen = Seen()
    trainer = L.Trainer(
        default_root_dir=tmp_path,
        max_steps=max_steps,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[seen],
        **{"logger": False, **trainer_args},
    )
    trainer.fit(Tiny(), loader)
    seen.trainer = trainer
    return seen, loader


def test_the_fit_loop_hands_out_the_training_loader(tmp_path):
    seen, loader = fit(tmp_path)
    assert seen.loaders == [loader]


class From:
    """Indices from ``start`` on, read as the iteration begins."""

    def __init__(self, size: int) -> None:
        self.size, self.start = size, 0

    def __iter__(self):
        return iter(range(self.start, self.size))

    def __len__(self) -> int:
        return self.size


class Moved(L.Callback):
    def __init__(self, sampler: From) -> None:
        self.sampler, self.firsts = sampler, []

    def on_train_start(self, trainer, pl_module) -> None:
        self.sampler.start = 4  # as a resume sets its sampler's position
        iterate_training_data_again(trainer)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.firsts.append(int(batch[0][0, 0]))


def test_the_training_iteration_started_again_reads_a_position_set_in_on_train_start(tmp_path):
    """With a loader worker, Lightning's iteration has drawn the first indices before ``on_train_start``; started again,
    it reads the sampler as that hook left it."""
    sampler = From(8)
    data = TensorDataset(torch.arange(8.0)[:, None].repeat(1, 2))
    loader = DataLoader(data, batch_size=2, sampler=sampler, num_workers=1, persistent_workers=True)
    moved = Moved(sampler)
    trainer = L.Trainer(default_root_dir=tmp_path, max_epochs=1, enable_checkpointing=False, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[moved])  # fmt: skip
    trainer.fit(Tiny(), loader)
    assert moved.firsts == [4, 6]


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


def test_a_checkpoint_of_a_fit_ended_inside_an_epoch_is_put_back_inside_it(tmp_path):
    """Fit ended by max_steps after 3 of the epoch's 4 batches: Lightning saves the epoch as completed (epoch 1), and
    reopening it gives the state of a checkpoint saved inside epoch 0; after the epoch's last batch it stays closed."""
    for steps, reopened, epoch in ((3, True, 0), (4, False, 1)):
        seen, _ = fit(tmp_path, max_steps=steps)
        seen.trainer.save_checkpoint(tmp_path / "end.ckpt")
        checkpoint = torch.load(tmp_path / "end.ckpt", weights_only=True)
        assert checkpoint["epoch"] == 1
        assert reopen_cut_epoch(checkpoint) is reopened and checkpoint["epoch"] == epoch
        progress = checkpoint["loops"]["fit_loop"]["epoch_progress"]["current"]
        assert (progress["ready"], progress["processed"], progress["completed"]) == (1, epoch, epoch)
        assert reopen_cut_epoch(checkpoint) is False  # once: now it is under way


class Scheduled(Tiny):
    """A linear decay to 0 over the fit's steps, as ``linear_warmup``: its shape depends on ``max_steps``."""

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        total = self.trainer.estimated_stepping_batches
        decay = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: max(0.0, 1 - step / total))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": decay, "interval": "step"}}


class Rates(L.Callback):
    def __init__(self) -> None:
        self.rates = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.rates.append((trainer.global_step, trainer.current_epoch, trainer.optimizers[0].param_groups[0]["lr"]))


def test_a_run_resumed_with_more_steps_goes_on_in_its_epoch_at_the_new_schedules_rates(tmp_path):
    """A 2-step fit of a 4-batch epoch, resumed with max_steps=4: its steps 2 and 3 run in epoch 0 at the rates of
    a 4-step fit, not at the 2-step schedule's last rate (0) and then in epoch 1."""
    from mate_cli.callbacks.resume_state import ResumeState

    def fit_steps(max_steps: int, ckpt_path=None) -> list:
        rates = Rates()
        trainer = L.Trainer(default_root_dir=tmp_path, max_steps=max_steps, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False,
                            callbacks=[ResumeState(), rates])  # fmt: skip
        trainer.fit(Scheduled(), DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2), ckpt_path=ckpt_path)
        if ckpt_path is None:
            trainer.save_checkpoint(tmp_path / f"{max_steps}.ckpt")
        return rates.rates

    fit_steps(2)
    assert fit_steps(4, tmp_path / "2.ckpt") == fit_steps(4)[2:] == [(2, 0, 0.1 * 0.5), (3, 0, 0.1 * 0.25)]


def test_the_rich_bar_of_a_run_bounded_by_steps_names_the_epoch_without_a_negative_last_one(tmp_path):
    """mate's bar overrides the Rich bar's training description: Lightning's own reads "Epoch 1/-2" at max_epochs=-1."""
    from mate_cli.callbacks.progress_log import RichProgressBar

    def descriptions(max_epochs: int) -> list:
        bar, shown = RichProgressBar(), []
        on_step = L.Callback()
        on_step.on_train_batch_end = lambda *_: shown.append([task.description.strip() for task in bar.progress.tasks])
        trainer = L.Trainer(default_root_dir=tmp_path, max_epochs=max_epochs, max_steps=3, logger=False,
                            enable_checkpointing=False, enable_model_summary=False,
                            callbacks=[bar, on_step])  # fmt: skip
        trainer.fit(Tiny(), DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2))
        return shown

    assert descriptions(-1) == [["Epoch 0"], ["Epoch 0"], ["Epoch 1"]]
    assert descriptions(5) == [["Epoch 0/4"], ["Epoch 0/4"], ["Epoch 1/4"]]  # a bounded run's as Lightning's


def test_lightnings_watch_of_the_ddp_processes_is_stopped_before_it_kills_rank_0():
    """Lightning's watch kills the main process with SIGKILL once a child failed; given its list of children, mate's
    ends it (a stand-in process here as the main one, and a failed child)."""
    import subprocess

    from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    from mate_cli.trainer.lightning_internals import stop_watching_children

    main, failed = subprocess.Popen(["sleep", "30"]), subprocess.Popen(["false"])
    children = [failed]
    watch = _ChildProcessObserver(main_pid=main.pid, child_processes=children, sleep_period=2.0)
    watch.start()
    stop_watching_children(children)  # before its first look, which would find the failed child
    try:
        failed.wait()
        watch.join(timeout=15)
        assert not watch.is_alive() and main.poll() is None
    finally:
        main.kill()
        main.wait()


def test_a_handler_put_first_hears_sigterm_before_lightnings_own_handler(tmp_path):
    """Lightning composes its SIGTERM handler (under DDP a broadcast, which raises when a rank is gone) before the one
    it found; put first, that one runs before Lightning's has marked the signal received."""
    import os
    import signal

    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from mate_cli.trainer.lightning_internals import call_first

    class Term(L.Callback):
        def __init__(self, first: bool) -> None:
            self.first, self.heard = first, []

        def hear(self, signum, frame) -> None:
            self.heard.append(self.trainer.received_sigterm)  # Lightning's handler ran already

        def on_train_start(self, trainer, pl_module) -> None:
            self.trainer = trainer
            if self.first:
                call_first(signal.SIGTERM, self.hear)

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if batch_idx == 1:
                os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    heard = {}
    try:
        for first in (False, True):
            term = Term(first)
            signal.signal(signal.SIGTERM, term.hear)
            trainer = L.Trainer(default_root_dir=tmp_path, max_steps=4, enable_checkpointing=False, logger=False,
                                enable_progress_bar=False, enable_model_summary=False, callbacks=[term])  # fmt: skip
            try:
                trainer.fit(Tiny(), DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2))
            except SIGTERMException:
                pass
            heard[first] = term.heard
    finally:
        signal.signal(signal.SIGTERM, before)
    assert heard == {False: [True], True: [False]}
