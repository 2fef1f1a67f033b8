"""Which run a resume continues, and whether it may (docs/runs.md, "Resuming, and what a run dir holds"): the path
resolved (:func:`resolve_resume_path`), the config compared (:func:`changed_on_resume`), checkpoints written whole
after a kill (:class:`AtomicCheckpointIO`), and the earlier run's W&B run continued (:func:`continue_wandb_run`). The
callbacks that carry the state across live in :mod:`mate_cli.callbacks.resume_state`."""

from __future__ import annotations

import glob
import logging
import secrets
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from omegaconf import OmegaConf

from mate_cli.callbacks import interrupts
from mate_cli.run import lock as run_lock
from mate_cli.config.schema import REFERENCE, ABSENT, dotted_keys, lookup
from mate_cli.errors import MateError
from mate_cli.io import atomic_open, os_error_in, write_failure
from mate_cli.config.naming import dir_name_start
from mate_cli.config.yaml_data import read_run_config


log = logging.getLogger(__name__)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes by temp file and rename (a kill mid-write leaves the previous checkpoint whole); loads weights-only, and a
    checkpoint already loaded and checked (:meth:`preload`) is handed over, not read again."""

    def __init__(self) -> None:
        super().__init__()
        self._preloaded: tuple[str, dict] | None = None

    def preload(self, path: str | Path, checkpoint: dict) -> None:
        """``checkpoint``, as read from ``path``: what the next load of ``path`` returns."""
        self._preloaded = (str(Path(path).resolve()), checkpoint)

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        try:
            with atomic_open(path, "wb") as handle:
                torch.save(checkpoint, handle)
            interrupts.saved(checkpoint, path)
        except (OSError, RuntimeError) as err:  # torch reports a failed write as "unexpected pos ..."
            if os_error_in(err) is None:
                raise
            fix = (
                "free space there (the last whole checkpoint is kept), then resume with "
                f"ckpt_path={Path(path).parent.parent}"
            )
            raise MateError(write_failure(path, err, fix)) from err

    def load_checkpoint(self, path, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        from mate_cli.pretrained import load_weights_only

        preloaded, self._preloaded = self._preloaded, None
        if preloaded is not None and preloaded[0] == str(Path(path).resolve()):
            return preloaded[1]
        return load_weights_only(path, "resume from a checkpoint written by `mate train` or `mate pretrain`")


def resolve_resume_path(
    value: str | None, output_root: Path, experiment_name: str, this_run: Path | None = None
) -> str | None:
    """The checkpoint to resume (None: start fresh): a ``.ckpt`` file, a run dir's ``last.ckpt``, or ``last``."""
    if value in (None, ""):
        return None
    if str(value) == "last":
        return newest_run(output_root, experiment_name, this_run)
    path = Path(str(value)).expanduser()
    if path.is_dir():
        path = path / "checkpoints" / "last.ckpt" if (path / "checkpoints").is_dir() else path / "last.ckpt"
    if not path.is_file():
        raise MateError(f"ckpt_path={value}: no checkpoint at {path}; pass a .ckpt file, a run dir or `last`")
    if path.parent.name == "checkpoints":
        run_lock.check_not_running(run_dir_of(path), f"ckpt_path={value}")
    if is_weights_only_checkpoint(path):
        run = f"ckpt_path={run_dir_of(path)}" if path.parent.name == "checkpoints" else "a last.ckpt"
        raise MateError(
            f"ckpt_path={value}: {path.name} holds the weights only (a best checkpoint: no optimiser "
            f"state to continue from); resume from its run's last.ckpt: {run}"
        )
    return str(path)


def started(run: Path) -> float:
    """When ``run`` started: its ``.hydra/config.yaml``'s time (a resume in place writes it again), else the folder's;
    not the time in its name, which is local to the time zone it ran in."""
    config = run / ".hydra" / "config.yaml"
    return (config if config.is_file() else run).stat().st_mtime


def newest_run(output_root: Path, experiment_name: str, this_run: Path | None) -> str:
    """``ckpt_path=last``: the newest run dir of ``experiment_name`` under ``output_root`` but ``this_run``; refused,
    naming the newest resumable one, when it is still running or has no ``last.ckpt`` yet."""
    start = glob.escape(dir_name_start(f"{experiment_name}-"))  # a long run name is cut in its dir name
    own = this_run.resolve() if this_run is not None else None
    runs = sorted((p for p in output_root.glob(f"*-{start}*") if p.is_dir() and p.resolve() != own), key=started)
    if not (last := [p for p in runs if (p / "checkpoints" / "last.ckpt").is_file()]):
        raise MateError(
            f"ckpt_path=last: no run of experiment {experiment_name!r} with checkpoints/last.ckpt under {output_root}; "
            "pass ckpt_path=<run dir or .ckpt file>"
        )
    newest = runs[-1]
    older = next((p for p in reversed(last) if p != newest and run_lock.holder(p) is None), None)
    other = f"; to resume the one before it: ckpt_path={older}" if older else ""
    if (pid := run_lock.holder(newest)) is not None:
        raise MateError(
            f"ckpt_path=last: the newest run of experiment {experiment_name!r}, {newest}, is still "
            f"running (pid {pid}); wait for it to end, or stop it (it saves last.ckpt){other}"
        )
    if newest not in last:
        raise MateError(
            f"ckpt_path=last: the newest run of experiment {experiment_name!r}, {newest}, has no checkpoints/last.ckpt "
            f"yet (running elsewhere, or stopped before its first checkpoint){other}"
        )
    return str(newest / "checkpoints" / "last.ckpt")


def is_weights_only_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a Lightning ``save_weights_only`` checkpoint, from its pickle's keys, without loading it."""
    try:
        with zipfile.ZipFile(path) as archive:
            index = next((n for n in archive.namelist() if n.endswith("/data.pkl")), None)
            keys = archive.read(index) if index else b""
    except (zipfile.BadZipFile, OSError):
        return False
    return b"pytorch-lightning_version" in keys and b"state_dict" in keys and b"optimizer_states" not in keys


def run_dir_of(checkpoint: str | Path) -> Path:
    return Path(checkpoint).resolve().parent.parent


def continue_wandb_run(cfg, resume: str | None) -> None:
    """Set ``logger.wandb.id`` before the loggers are built: as given, else the resumed run's, else a new one."""
    wandb_cfg = OmegaConf.select(cfg, "logger.wandb", default=None)
    if wandb_cfg is None or wandb_cfg.get("id"):
        return
    earlier = None
    if resume:
        config = run_dir_of(resume) / "resolved_config.yaml"
        if config.is_file():
            run = read_run_config(config, "resume from a run dir that `mate train` wrote")
            earlier = OmegaConf.select(run, "logger.wandb.id", default=None)
        if earlier is None:
            log.info("%s records no W&B run id: the resumed run is a new W&B run", config)
    wandb_cfg.id = str(earlier) if earlier else secrets.token_hex(4)


#: what fixes the function a resumed run goes on computing, and its data and order; of them, a resume may change where
#: the data is (``dataset.sources.*``: only whether each is set) and how it is loaded. A key whose value here is another
#: key (``${seed}``, ``${attention}``) is compared through that one.
FIXED_ON_RESUME = ("seed", "attention", "model", "dataset")
NOT_COMPARED = ("dataset.root", "dataset.cache_dir", "dataset.num_workers", "dataset.eval_batch_size",
                "model.optimizer.fused")  # fmt: skip


def changed_on_resume(cfg, resume: str) -> list[str]:
    """``key (before -> now)`` for each value of :data:`FIXED_ON_RESUME` this command changes from the resumed run's
    ``resolved_config.yaml`` (read before this run writes its own: in place, it is the same file)."""
    config = run_dir_of(resume) / "resolved_config.yaml"
    if not config.is_file():
        return []
    before = OmegaConf.to_container(read_run_config(config, "resume from a run dir that `mate train` wrote"))
    now, raw = OmegaConf.to_container(cfg, resolve=True), OmegaConf.to_container(cfg, resolve=False)

    def compared(key: str) -> bool:
        parts = key.split(".")
        prefixes = (lookup(raw, ".".join(parts[:i])) for i in range(1, len(parts) + 1))
        return not key.startswith(NOT_COMPARED) and not any(isinstance(v, str) and REFERENCE.match(v) for v in prefixes)

    nodes = [(node, tree.get(node)) for node in FIXED_ON_RESUME for tree in (now, before)]
    keys = dict.fromkeys(key for node, value in nodes for key in (node, *dotted_keys(value, f"{node}.")))
    pairs = {key: (lookup(before, key), lookup(now, key)) for key in keys if compared(key)}
    for key, (old, new) in pairs.items():  # a source's location may move; dropping one changes the data
        if key.startswith("dataset.sources."):
            pairs[key] = tuple(v if v is None or v is ABSENT else "set" for v in (old, new))
    return [
        f"{key} ({'unset' if old is ABSENT else old} -> {'unset' if new is ABSENT else new})"
        for key, (old, new) in pairs.items()
        if old != new and not isinstance(old, dict) and not isinstance(new, dict)
    ]
