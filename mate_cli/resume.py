"""Runs that resume exactly, and checkpoints that are whole after a kill.

- :class:`ResumeState`: a callback that stores, in every checkpoint, the RNG states
  (Python, NumPy, torch CPU and CUDA) and how many training batches of the current
  epoch were consumed, and on resume restores the RNG and makes the training sampler
  (:class:`~mate_cli.data.sampler.EpochShuffle`) skip those batches. Lightning itself
  restores the weights, optimiser, scheduler, step and epoch.
- :class:`AtomicCheckpointIO`: checkpoints are written to a temp file next to the
  target (inside the run dir) and renamed, so a kill mid-write leaves the previous
  checkpoint whole and no stray file elsewhere.
- :func:`resolve_resume_path`: what ``mate train ckpt_path=`` means: a checkpoint
  file, a run dir (its ``checkpoints/last.ckpt``), or ``last`` (the newest run of the
  same experiment).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from mate_cli.data.sampler import EpochShuffle
from mate_cli.errors import MateError
from mate_cli.io import atomic_open, os_error_in, write_failure

STATE_KEY = "mate_resume"


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
    """The :class:`EpochShuffle` samplers of ``loaders`` (a ``DistributedSampler``: Lightning
    uses it as it is under DDP, so it is the loader's own sampler)."""
    found = []
    for loader in loaders:
        for sampler in (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
            if isinstance(sampler, EpochShuffle) and sampler not in found:
                found.append(sampler)
    return found


def training_samplers(trainer: L.Trainer) -> list[EpochShuffle]:
    combined = trainer.fit_loop._combined_loader
    return epoch_shuffles(combined.flattened if combined is not None else [])


class ResumeState(L.Callback):
    """Saves and restores what Lightning does not: RNG states and the position in the epoch."""

    def __init__(self) -> None:
        self.examples_this_epoch = 0
        self._resume: dict | None = None

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.examples_this_epoch = 0  # not called when Lightning resumes mid-epoch

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.examples_this_epoch += len(batch)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        checkpoint[STATE_KEY] = {
            "rng": rng_states(), "epoch": trainer.current_epoch, "examples_this_epoch": self.examples_this_epoch,
            "world_size": trainer.world_size,  # examples_this_epoch counts one rank's share
        }

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        self._resume = checkpoint.get(STATE_KEY)

    def on_train_start(self, trainer, pl_module) -> None:
        """After the loaders exist and before the first batch: restore RNG and position."""
        state, self._resume = self._resume, None
        if state is None:
            return
        if state["epoch"] == trainer.current_epoch and state["examples_this_epoch"]:
            self.examples_this_epoch = state["examples_this_epoch"]
            consumed = state["examples_this_epoch"] * state.get("world_size", 1)  # every rank's share
            for sampler in training_samplers(trainer):
                sampler.skip_next(consumed)
        set_rng_states(state["rng"])


class AtomicCheckpointIO(TorchCheckpointIO):
    """``torch.save`` into a temp file beside the target, fsync, then one rename."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        try:
            with atomic_open(path, "wb") as handle:
                torch.save(checkpoint, handle)
        except (OSError, RuntimeError) as err:  # torch reports a failed write as "unexpected pos ..."
            if os_error_in(err) is None:
                raise
            fix = ("free space there (the last whole checkpoint is kept), then resume with "
                   f"ckpt_path={Path(path).parent.parent}")
            raise MateError(write_failure(path, err, fix)) from err

    def load_checkpoint(self, path, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        """The checkpoint to resume from, weights-only (:func:`load_weights_only`)."""
        from mate_cli.modeling.checkpoints import load_weights_only

        return load_weights_only(path, "resume from a checkpoint written by `mate train` or `mate pretrain`")


def resolve_resume_path(value: str | None, output_root: Path, experiment_name: str) -> str | None:
    """The checkpoint ``ckpt_path=`` names (None: start fresh).

    Args:
        value: a ``.ckpt`` file, a run dir, or ``last``.
        output_root: where ``mate train`` runs live (``$MATE_OUTPUT_DIR/train`` or ``outputs/train``).
        experiment_name: for ``last``: the newest run dir of that experiment (named
            ``<time>-<experiment_name>-<attention>-...``, see ``run_name`` in conf/train.yaml).
    """
    if value in (None, ""):
        return None
    if str(value) == "last":
        runs = sorted(
            (p for p in output_root.glob(f"*-{experiment_name}-*") if (p / "checkpoints" / "last.ckpt").is_file()),
            key=lambda p: p.name,
        )
        if not runs:
            raise MateError(
                f"ckpt_path=last: no run of experiment {experiment_name!r} with checkpoints/last.ckpt under {output_root}; "
                "pass ckpt_path=<run dir or .ckpt file>"
            )
        return str(runs[-1] / "checkpoints" / "last.ckpt")
    path = Path(str(value)).expanduser()
    if path.is_dir():
        path = path / "checkpoints" / "last.ckpt" if (path / "checkpoints").is_dir() else path / "last.ckpt"
    if not path.is_file():
        raise MateError(f"ckpt_path={value}: no checkpoint at {path}; pass a .ckpt file, a run dir or `last`")
    return str(path)
