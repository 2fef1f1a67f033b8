"""What exact resume needs beyond Lightning's own state (docs/runs.md, "Resuming, and what a run dir holds"):
:class:`ResumeState` saves and restores the RNG states and the training examples consumed this epoch, which the sampler
then skips; :class:`ContinuousCSVLog` keeps a resumed run's CSV log continuous with the earlier run's."""

from __future__ import annotations

import csv
import io
import logging
import random
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.loggers import CSVLogger

from mate_cli.data.sampler import EpochShuffle
from mate_cli.io import atomic_write_csv
from mate_cli.trainer.lightning_internals import ended_with_its_epochs_last_batch, epoch_ended_and_counted
from mate_cli.trainer.lightning_internals import finishing_the_saved_epoch, iterate_training_data_again
from mate_cli.trainer.lightning_internals import pending_log_row, reopen_cut_epoch, start_the_epoch_afresh
from mate_cli.trainer.lightning_internals import training_loaders


log = logging.getLogger(__name__)

STATE_KEY = "mate_resume"
#: the CSV log row of a checkpoint's own batch (see :meth:`ContinuousCSVLog.on_save_checkpoint`)
PENDING_ROW_KEY = "mate_csv_pending_row"

#: what a resumed run says, instead of Lightning's mid-epoch warning (:mod:`mate_cli.silenced`)
RESTORED = (
    "weights, optimiser, scheduler, step, RNG states and the position in the epoch are restored, "
    "so training continues exactly where the checkpoint left it"
)


def unrestored(checkpoint: dict, model) -> list[str]:
    """What resuming from ``checkpoint`` cannot restore, as ``mate train`` says it (empty: it continues exactly): the
    RNG states and epoch position without :class:`ResumeState` (another tool, an older mate), the schedule."""
    missing = []
    if STATE_KEY not in checkpoint:
        missing.append("the RNG states and the position in the epoch (the epoch starts again)")
    if getattr(model, "scheduler", None) is not None and not checkpoint.get("lr_schedulers"):
        missing.append("the learning-rate schedule (it starts again from its first step)")
    return missing


def rng_states() -> dict[str, Any]:
    """Every generator's state as tensors and plain lists (``torch.load(weights_only=True)`` reads them)."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    states = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def epoch_shuffles(loaders) -> list[EpochShuffle]:
    """The :class:`EpochShuffle` samplers of ``loaders`` (a ``DistributedSampler``, which Lightning keeps under DDP)."""
    samplers = [getattr(loader, "sampler", None) for loader in loaders]
    samplers += [getattr(getattr(loader, "batch_sampler", None), "sampler", None) for loader in loaders]
    return list(dict.fromkeys(sampler for sampler in samplers if isinstance(sampler, EpochShuffle)))


class ResumeState(L.Callback):
    def __init__(self) -> None:
        self.examples_this_epoch = 0
        self._resume: dict | None = None

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.examples_this_epoch = 0  # not called when Lightning resumes mid-epoch

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.examples_this_epoch += len(batch)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        checkpoint[STATE_KEY] = {
            "rng": rng_states(),
            "epoch": trainer.current_epoch,
            "examples_this_epoch": self.examples_this_epoch,
            "world_size": trainer.world_size,  # examples_this_epoch counts one rank's share
        }

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        """Before Lightning restores its loops from ``checkpoint``: a run that ended inside an epoch goes on in it; one
        saved after its epoch's last batch starts the next epoch at its start (saved once fit had ended, at
        ``max_epochs``, its position would otherwise be read as one inside the next epoch)."""
        self._resume = checkpoint.get(STATE_KEY)
        if self._resume is None:
            return
        self._resume = {**self._resume, "next_epoch_afresh": epoch_ended_and_counted(checkpoint)}
        if reopen_cut_epoch(checkpoint):
            self._resume = {**self._resume, "epoch": checkpoint["epoch"]}
        elif ended_with_its_epochs_last_batch(checkpoint):
            self._resume = {**self._resume, "examples_this_epoch": 0}

    def on_train_start(self, trainer, pl_module) -> None:
        """After the loaders exist and before the first batch: restore RNG and position, and the learning rate."""
        forget_other_runs_checkpoints(trainer)
        state, self._resume = self._resume, None
        if state is None:
            return
        rates_from_schedule(trainer)
        if state.get("next_epoch_afresh"):
            start_the_epoch_afresh(trainer)
        samplers = epoch_shuffles(training_loaders(trainer))
        for sampler in samplers:  # the resumed epoch's order: Lightning sets it only after the iteration has begun
            sampler.set_epoch(trainer.current_epoch)
        inside = state["epoch"] == trainer.current_epoch and bool(state["examples_this_epoch"])
        # the earlier run made the iterator its next batch comes from before its checkpoint (inside an epoch, or one
        # Lightning finishes without a batch), else after it, from the RNG it saved
        made_before = inside or finishing_the_saved_epoch(trainer)
        if inside:
            self.examples_this_epoch = state["examples_this_epoch"]
            consumed = state["examples_this_epoch"] * state.get("world_size", 1)  # every rank's share
            for sampler in samplers:
                sampler.skip_next(consumed)
        if not made_before:
            set_rng_states(state["rng"])
        if samplers or not made_before:  # loader workers drew the epoch's first indices already: again, past the skip
            iterate_training_data_again(trainer)
        if made_before:  # last: a new loader iterator draws its workers' base seed from torch's RNG
            set_rng_states(state["rng"])


def rates_from_schedule(trainer: L.Trainer) -> None:
    """Each optimiser's learning rates as its restored schedule gives them at the restored step. The optimiser's state
    holds the rates the earlier run's schedule set, which a schedule of another length (a resume with a new
    ``trainer.max_steps``) would otherwise only replace after the first resumed step; with the same schedule this sets
    the same numbers."""
    for config in trainer.lr_scheduler_configs:
        schedule = config.scheduler
        if isinstance(schedule, torch.optim.lr_scheduler.LambdaLR):
            groups = schedule.optimizer.param_groups
            for group, base, rate in zip(groups, schedule.base_lrs, schedule.lr_lambdas):
                group["lr"] = base * rate(schedule.last_epoch)
            schedule._last_lr = [group["lr"] for group in groups]


def forget_other_runs_checkpoints(trainer: L.Trainer) -> None:
    """Forget the checkpoint paths a resumed ``ModelCheckpoint`` restored from outside its folder, which Lightning
    would otherwise report, or rotate out (delete), as this run's."""
    for callback in trainer.checkpoint_callbacks:
        folder = Path(callback.dirpath).resolve() if getattr(callback, "dirpath", None) else None

        def own(path: str) -> bool:
            return bool(path) and folder is not None and Path(path).resolve().parent == folder

        if not own(callback.best_model_path):
            callback.best_model_path, callback.best_model_score = "", None
        callback.best_k_models = {path: value for path, value in callback.best_k_models.items() if own(path)}
        for name in ("kth_best_model_path", "last_model_path"):
            if not own(getattr(callback, name)):
                setattr(callback, name, "")


class ContinuousCSVLog(L.Callback):
    """A CSV log a resume continues: flushed with every checkpoint, so no row before it waits in a buffer; a resumed
    run's starts with the earlier run's rows before the restored step, the checkpoint's batch row included, written
    as soon as the logger exists (:meth:`continue_earlier`), so that no later stop can lose them."""

    def __init__(self, earlier_run_dir: str | Path | None = None) -> None:
        self.earlier = None if earlier_run_dir is None else Path(earlier_run_dir)
        # read now: resumed in place, the run dir is this run's too, and Lightning's CSV logger deletes a metrics file
        # it finds there when it starts
        self._earlier_logs = {
            path: path.read_text(encoding="utf-8")
            for path in (self.earlier.rglob("metrics.csv") if self.earlier is not None else ())
            if path.is_file()
        }

    @staticmethod
    def _csv_loggers(trainer) -> list:
        return [logger for logger in trainer.loggers if isinstance(logger, CSVLogger)] if trainer.is_global_zero else []

    def continue_earlier(self, trainer, checkpoint: dict | None) -> None:
        """Start each CSV logger's file with the earlier rows before ``checkpoint``'s step, before any data is
        prepared or anything logged, so that a stop from here on keeps them; a resume with nothing left to train,
        whose training loop and its hooks Lightning skips, has them too."""
        if self.earlier is None or checkpoint is None:
            return
        for logger in self._csv_loggers(trainer):
            self._continue(logger.experiment, Path(logger.save_dir), checkpoint)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        for logger in self._csv_loggers(trainer):
            logger.save()
        # Lightning logs this batch's row after an every-n-steps checkpoint: keep it, as a kill may come first
        try:
            pending = pending_log_row(trainer)
        except Exception:  # noqa: BLE001 - a Lightning internal moved (its test says which): the row is lost, never wrong
            pending = None
        if pending:
            checkpoint[PENDING_ROW_KEY] = pending

    def _continue(self, writer, save_dir: Path, checkpoint: dict) -> None:
        """Seed ``writer``'s still-empty metrics file with the earlier log's rows before the checkpoint's step."""
        step = int(checkpoint.get("global_step", 0))
        earlier = self.earlier / Path(writer.metrics_file_path).relative_to(save_dir)
        if earlier not in self._earlier_logs:
            log.info("no CSV log at %s to continue; this run's starts at step %d", earlier, step)
            return
        reader = csv.DictReader(io.StringIO(self._earlier_logs[earlier], newline=""))
        fields = set(reader.fieldnames or [])
        rows = [row for row in reader if _step(row) is not None and _step(row) < step]  # `step` is logged again
        pending = checkpoint.get(PENDING_ROW_KEY)
        if pending and not any(_step(row) == pending["step"] and not set(pending) - {k for k, v in row.items() if v}
                               for row in rows):  # fmt: skip
            rows.append({k: repr(v) if isinstance(v, float) else str(v) for k, v in pending.items()})
            fields |= set(pending)
        header = sorted(fields)  # Lightning's order: it appends rows in sorted-key order
        atomic_write_csv(writer.metrics_file_path, header, rows)
        writer.metrics_keys = header
        log.info("CSV log: continues %s (%d rows before step %d)", earlier, len(rows), step)


def _step(row: dict) -> int | None:
    """A CSV log row's step; None for a row a kill cut short."""
    try:
        whole = None not in row and None not in row.values()  # a cut line has fewer (or more) fields
        return int(float(row.get("step") or "")) if whole else None
    except ValueError:
        return None
