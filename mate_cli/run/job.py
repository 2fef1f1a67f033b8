"""A command's job around its task: :func:`run_task` holds the run dir, turns a `MateError`, a full disk or a signal
into one line, ``FAILED`` and an exit status, checks the accelerator first, and keeps W&B's folders in the run dir;
the job's run dir, overrides and group choices as Hydra set them."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys
from pathlib import Path
from typing import Callable

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from mate_cli.console import log_to_files
from mate_cli.errors import MateError, find_in_chain
from mate_cli.io import atomic_write_text, os_error_in, write_failure
from mate_cli.run import lock as run_lock
from mate_cli.run import sweep

#: written into the run dir of a run that failed: the one-line error
FAILED_MARKER = "FAILED"

#: this process's command line, the tasks' ``sys.argv`` (:func:`mate_cli.cli.run_hydra_app` says why)
COMMAND_LINE: list[str] = []


def run_task(task: Callable[[DictConfig], object], cfg: DictConfig):
    """Run ``task(cfg)`` holding the run dir: a `MateError` or full disk is one line and exit 2, a signal 128 + its
    number (:mod:`mate_cli.callbacks.interrupts`), a lost DDP rank its exit status (:mod:`mate_cli.callbacks.ranks`);
    any failure leaves its one line in ``FAILED`` and the run's log."""
    from mate_cli.callbacks import interrupts

    if COMMAND_LINE:
        sys.argv = list(COMMAND_LINE)
    if HydraConfig.initialized():  # else no run dir: tests call tasks directly
        try:
            run_lock.take(run_dir())
        except MateError as err:  # another process's run dir: nothing is written into it
            print(f"mate: error: {err}", file=sys.stderr)
            sys.exit(MateError.exit_code)
        keep_tool_files_in(run_dir())
        if sweep.not_started():  # a job of a sweep a signal stopped does not start
            return None
    interrupts.install(run_dir() / FAILED_MARKER if HydraConfig.initialized() else None, not run_lock.is_ddp_child())
    try:
        check_accelerator(cfg)
        return task(cfg)
    except (Exception, KeyboardInterrupt, SystemExit) as err:  # noqa: BLE001 - re-raised unless handled below
        stopped = find_in_chain(err, interrupts.Interrupted)
        crash = isinstance(err, Exception) and not (find_mate_error(err) or full_disk(err))
        # Lightning's own SIGTERM exit; or its handler raised before mate's ran (a DDP broadcast to a rank that ended)
        if stopped is None and interrupts.signalled(settle=0.2 if crash else 0.0):
            stopped = interrupts.interrupted()
        if stopped is None and crash:
            stopped = interrupts.stopping()  # a lost DDP rank (mate_cli.callbacks.ranks), whose loss raised this error
        if stopped is not None:
            line = str(stopped) + interrupts.requeue_note(stopped.signum)
            stopped = interrupts.Interrupted(stopped.signum, line, stopped.exit_code)
            record_failure(f"mate: {stopped}", stopped.exit_code)
            tell(f"mate: {stopped}")
            interrupts.told(stopped)
            with contextlib.suppress(Exception):  # the interruption is what the user must hear about
                finish_wandb_run(stopped.exit_code)
            if sweep.in_worker():  # the job ends, not the worker: the launcher lets the others save and stop
                return None
            sys.exit(stopped.exit_code)
        if not isinstance(err, Exception):
            raise
        user_error = find_mate_error(err) or full_disk(err)
        line = f"mate: error: {user_error}" if user_error else f"mate: failed: {type(err).__name__}: {err}"
        record_failure(" ".join(line.split()), MateError.exit_code if user_error else 1)
        if user_error is None:
            raise
        tell(line)
        sys.exit(MateError.exit_code)
    finally:
        interrupts.done()


def finish_wandb_run(exit_code: int | None = None) -> Path | None:
    """Close this job's W&B run, if one ran, recording ``exit_code`` (releasing its id: it can be resumed at once), and
    return its folder."""
    wandb = sys.modules.get("wandb")  # never imported: no W&B logger ran (logger=csv)
    if wandb is None or wandb.run is None:
        return None
    folder = Path(wandb.run.dir).parent
    wandb.finish(exit_code=exit_code)
    return folder


_WANDB_DIRS = {"WANDB_CACHE_DIR": "cache", "WANDB_CONFIG_DIR": "config", "WANDB_DATA_DIR": "data",
               "WANDB_ARTIFACT_DIR": "artifacts"}  # fmt: skip
#: where third-party tools write, as the user set it before mate started (kept when set)
_USER_TOOL_DIRS = {name: os.environ.get(name) for name in _WANDB_DIRS}


def keep_tool_files_in(out: Path) -> None:
    """W&B's folders under ``<run dir>/wandb/``, not ``~``, unless the user set them (others: :mod:`mate_cli.paths`)."""
    for name, folder in _WANDB_DIRS.items():
        os.environ[name] = _USER_TOOL_DIRS[name] or str(out / "wandb" / folder)


def record_failure(line: str, exit_code: int) -> None:
    """``line`` into the run dir's ``FAILED`` and, with ``exit_code``, into the run's log files only. A DDP rank > 0
    writes its log alone: the run's ``FAILED`` and screen are rank 0's, which says where the run stands (a rank's
    line after it said that rank's share of a stop, say "before any checkpoints/last.ckpt was saved")."""
    try:
        folder = run_dir()
        if not run_lock.is_ddp_child():
            atomic_write_text(folder / FAILED_MARKER, line + "\n")
    except Exception:  # noqa: BLE001 - no run dir (Hydra not running): nothing to mark
        return
    log_to_files(f"{line} (exit status {exit_code})", logging.ERROR)


def tell(line: str) -> None:
    """``line`` on screen, unless this is a DDP rank > 0 (:func:`record_failure`)."""
    if not run_lock.is_ddp_child():
        print(line, file=sys.stderr)


def check_accelerator(cfg: DictConfig) -> None:
    """A GPU profile without a usable GPU, or device and node counts this machine cannot run: one line, up front."""
    trainer = cfg.get("trainer") if isinstance(cfg, DictConfig) else None
    accelerator = str(trainer.get("accelerator", "auto")).lower() if isinstance(trainer, DictConfig) else ""
    if isinstance(trainer, DictConfig):
        _check_counts(trainer, accelerator)
    if accelerator not in ("gpu", "cuda"):
        return
    import torch

    hardware = hydra_choices().get("hardware")
    what = f"trainer.accelerator={accelerator}"
    what = f"hardware={hardware} ({what})" if hardware else what
    if not torch.cuda.is_available():
        raise MateError(
            f"{what} needs a CUDA GPU, but torch finds none on this machine; "
            "run with hardware=cpu (or hardware=ddp_cpu for 2 CPU processes)"
        )
    devices, count = trainer.get("devices"), torch.cuda.device_count()
    if isinstance(devices, int) and devices > count:
        raise MateError(
            f"{what} with trainer.devices={devices}, but this machine has {count} GPU(s); "
            f"use trainer.devices={count} (or -1: all of them)"
        )
    precision = str(trainer.get("precision", ""))
    if precision.startswith("bf16") and not torch.cuda.is_bf16_supported():
        raise MateError(
            f"trainer.precision={precision}: {torch.cuda.get_device_name()} has no bfloat16; "
            "use trainer.precision=16-mixed (or 32-true)"
        )


def _check_counts(trainer: DictConfig, accelerator: str) -> None:
    """``trainer.devices`` and ``trainer.num_nodes``: whole numbers Lightning can start; on a CPU no more training
    processes than cores."""
    devices, nodes = trainer.get("devices", "auto"), trainer.get("num_nodes", 1)
    if isinstance(devices, bool) or isinstance(devices, int) and (devices == 0 or devices < -1):
        raise MateError(
            f"trainer.devices={devices} is no device count; use a number >= 1, -1 (all), auto, or a list of indices"
        )
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise MateError(f"trainer.num_nodes={nodes} is no node count; use a whole number >= 1")
    if accelerator == "cpu" and isinstance(devices, int) and devices > 1:
        from mate_cli.data.preprocess import available_cores

        cores = available_cores()
        if devices > cores:
            raise MateError(
                f"trainer.devices={devices} starts {devices} training processes on the CPU, but this machine has "
                f"{cores} core(s); use trainer.devices<={cores}"
            )


def hydra_choices():
    """This job's config-group choices (``hardware``, ``dataset``, ...); {} when Hydra is not running."""
    return HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}


def full_disk(err: BaseException) -> MateError | None:
    """A full disk in ``err``'s cause chain as one line naming the file and its folder's free space, else None."""
    cause = os_error_in(err)
    if cause is None or cause.errno != errno.ENOSPC:
        return None
    where = Path(cause.filename) if cause.filename else run_dir() / "?"
    return MateError(write_failure(where, cause, "free space there, then resume the run with ckpt_path=<run dir>"))


def find_mate_error(err: BaseException | None) -> MateError | None:
    """The `MateError` in ``err``'s cause chain (Hydra's instantiate and datasets wrap them)."""
    return find_in_chain(err, MateError)


def command_overrides() -> list[str]:
    """This job's overrides as typed (with a sweep's values), without the ``++`` mate puts before ``trainer.*`` keys."""
    if not HydraConfig.initialized():
        return []
    return [o[2:] if o.startswith("++trainer.") else o for o in HydraConfig.get().overrides.task]


def run_dir() -> Path:
    return Path(HydraConfig.get().runtime.output_dir)
