"""The Lightning internals that exact resume and the host-synchronisation-free training step read, the watch of DDP
ranks replaces, and the order of the signal handlers Lightning composes (no public API gives them);
``tests/trainer/test_lightning_internals.py`` fails when an installed Lightning moves one."""

from __future__ import annotations

import signal
from typing import Any

import lightning as L


def training_loaders(trainer: L.Trainer) -> list[Any]:
    """The training dataloaders of the running fit, flattened ([] before they exist)."""
    combined = trainer.fit_loop._combined_loader
    return list(combined.flattened) if combined is not None else []


def iterate_training_data_again(trainer: L.Trainer) -> None:
    """Start the running fit's training iteration over: Lightning creates it before ``on_train_start`` (and, resuming,
    uses it for the resumed epoch), and a loader with workers draws its first indices from the sampler right then, so
    a sampler's epoch or position set in ``on_train_start`` would otherwise reach only the next epoch. Batches already
    drawn are dropped (a persistent loader's workers finish them first); none has reached the training step yet."""
    fetcher = trainer.fit_loop._data_fetcher
    if fetcher is not None:
        iter(fetcher)


def pending_log_row(trainer: L.Trainer) -> dict | None:
    """The row Lightning logs for the current training batch right after ``on_train_batch_end`` (with ``epoch`` and
    ``step``: the batches that stepped the optimiser), or None when it logs none."""
    connector = trainer._logger_connector
    if not trainer.training or not connector.should_update_logs or trainer.fit_loop._should_accumulate():
        return None
    values = {k: float(v) for k, v in connector.metrics["log"].items()}
    step = trainer.fit_loop.epoch_loop._batches_that_stepped
    return {**values, "epoch": trainer.current_epoch, "step": step} if values else None


def is_log_step(trainer: L.Trainer) -> bool:
    """Whether the training batch that just ended is one Lightning logs (every ``trainer.log_every_n_steps``): the
    steps where the host reads logged values anyway. Call it in the training step or ``on_train_batch_end``."""
    return trainer.training and trainer._logger_connector.should_update_logs


def ended_with_its_epochs_last_batch(checkpoint: dict) -> bool:
    """Whether ``checkpoint`` was saved after its epoch's last batch ran (at that batch, the epoch's end or fit's): the
    epoch is whole, so nothing of it is left for a resume to skip to."""
    batches = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress") or {}
    return bool(batches.get("is_last_batch")) and bool(batches.get("current", {}).get("completed"))


def epoch_ended_and_counted(checkpoint: dict) -> bool:
    """Whether ``checkpoint`` was saved once its epoch had ended and Lightning had counted it (at ``max_epochs``, after
    fit): the next epoch is a new one."""
    epochs = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress", {}).get("current", {})
    counted = bool(epochs) and epochs.get("ready") == epochs.get("processed") == epochs.get("completed")
    return counted and ended_with_its_epochs_last_batch(checkpoint)


def start_the_epoch_afresh(trainer: L.Trainer) -> None:
    """Let the resumed fit's first epoch run as a new one. With ``trainer.max_steps`` set Lightning restarts its epoch
    loop even from a checkpoint whose epoch had ended (:func:`epoch_ended_and_counted`), and the restored batch counts
    then end the next epoch before its first batch: an epoch lost. Call it in ``on_train_start``."""
    loop = trainer.fit_loop.epoch_loop
    loop.restarting = False
    loop.reset_restart_stage()


def finishing_the_saved_epoch(trainer: L.Trainer) -> bool:
    """Whether the resumed fit first finishes the checkpoint's epoch without a batch (saved at the end of a validation
    after the epoch's last batch): Lightning then makes the next epoch's loader iterator itself."""
    return trainer.fit_loop.restarted_mid_epoch and trainer.fit_loop.epoch_loop.restarted_on_last


def reopen_cut_epoch(checkpoint: dict) -> bool:
    """Put a checkpoint saved after fit ended inside an epoch (``trainer.max_steps`` reached, a stop) back inside that
    epoch: Lightning counts the epoch as completed when fit ends, so a resume with more steps would start the next
    epoch and never see the rest of this one. True when ``checkpoint``'s loop state and ``epoch`` were rewritten."""
    loop = checkpoint.get("loops", {}).get("fit_loop", {})
    epochs, batches = loop.get("epoch_progress"), loop.get("epoch_loop.batch_progress")
    if not epochs or not batches or batches.get("is_last_batch", True) or not batches["current"]["completed"]:
        return False  # no batch run yet, or the epoch's last batch was: the epoch is whole
    if not epochs["current"]["completed"] or epochs["current"]["completed"] != epochs["current"]["ready"]:
        return False  # saved inside the epoch: under way already
    for counts in (epochs["total"], epochs["current"]):
        counts["processed"] -= 1
        counts["completed"] -= 1
    checkpoint["epoch"] -= 1
    return True


def stop_watching_children(children: list) -> None:
    """End Lightning's watch of the DDP processes ``children`` that this rank 0 started (a thread that polls them
    every 5 s and, once one has failed, kills them and rank 0 with SIGKILL, so that no ``FAILED`` is written):
    :class:`mate_cli.callbacks.ranks.WatchRanks` watches them instead. Given no processes to watch, its loop ends."""
    import threading

    from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    for thread in threading.enumerate():
        if isinstance(thread, _ChildProcessObserver) and thread._child_processes is children:
            thread._child_processes = []


def call_first(signum: int, handler) -> None:
    """Make ``handler`` the first of the handlers Lightning composed for ``signum`` around a fit, validate, test or
    predict (it keeps the one it found, after its own). Its own SIGTERM handler broadcasts under DDP, which raises
    when a rank is already gone: the handlers after it are then never called. Call it once Lightning has registered
    them (``on_train_start``); where ``signum``'s handler is no composition of Lightning's, nothing changes. One
    assignment, so that a signal meanwhile finds ``handler`` in the list."""
    handlers = getattr(signal.getsignal(signum), "signal_handlers", None)
    if isinstance(handlers, list) and handler in handlers:
        handlers[:] = [handler, *(other for other in handlers if other != handler)]
