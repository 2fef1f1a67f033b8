"""A trained run rebuilt from its checkpoint (config, weights, device) for ``mate eval``, ``mate predict`` and
PointR; the one check of a checkpoint before it is resumed or loaded; ``init_from``."""

from __future__ import annotations

import contextlib
import json
import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import lightning
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from mate_cli.config.check import check_dotlist
from mate_cli.config.recorded import add_recorded_options
from mate_cli.errors import MateError
from mate_cli.pretrained import load_tokenizer, load_weights_only
from mate_cli.callbacks.divergence import non_finite_tensors
from mate_cli.callbacks.resume_state import STATE_KEY, rng_states, set_rng_states
from mate_cli.config.run_targets import checked_run_config
from mate_cli.config.yaml_data import read_run_config
from mate_cli.run.task_directory import check_head_loaded, describe, task_directory, task_run_config

log = logging.getLogger(__name__)


#: how a run's encoder ran, not what it computes: a rebuilt run (eval, predict, PointR) starts without them, as
#: ``torch.compile`` needs a compiler the evaluating machine may lack; its ``overrides=`` may set them again
HOW_IT_RAN = {"model.encoder.compile": False, "model.encoder.compile_mode": None}


def load_run_config(ckpt_path: str | Path, overrides: Sequence[str] | None = None, trust: bool = False) -> DictConfig:
    """The config of the run that wrote ``ckpt_path`` (``../../resolved_config.yaml``) with the dotlist ``overrides``
    (checked against its keys and types) merged in, checked by
    :func:`mate_cli.config.run_targets.checked_run_config`."""
    ckpt = check_checkpoint(run_checkpoint(ckpt_path))
    config = ckpt.resolve().parent.parent / "resolved_config.yaml"
    if not config.is_file():
        raise MateError(
            f"{config} is missing: ckpt_path must point inside a `mate train` run dir (…/checkpoints/*.ckpt)"
        )
    fix = "pass a checkpoint whose run dir `mate train` wrote"
    lift = " (if you wrote this config yourself, pass trust_run_config=true)"
    cfg = read_run_config(config, fix, interpolations=trust, lift=lift)
    recorded_functions(cfg, config)
    for key, value in HOW_IT_RAN.items():  # before the overrides, which may set them again
        if OmegaConf.select(cfg, key, default=None) not in (None, value):
            OmegaConf.update(cfg, key, value)
    if overrides:
        check_dotlist(OmegaConf.to_container(cfg, resolve=False), list(overrides), "overrides", config)
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
    return checked_run_config(cfg, config, trust)


def dataset_here(cfg: DictConfig, cache_dir: str | None) -> DictConfig:
    """The run's ``dataset`` node; where the run's ``paths.cache_dir`` does not exist here (a run dir copied from
    another machine), a ``dataset.cache_dir`` under it moves under this command's ``cache_dir``."""
    dataset, recorded = cfg.dataset, str(OmegaConf.select(cfg, "paths.cache_dir", default=""))
    kept = str(dataset.get("cache_dir") or "")
    if not cache_dir or not recorded or Path(recorded).is_dir() or not Path(kept).is_relative_to(recorded):
        return dataset
    dataset.cache_dir = str(Path(cache_dir) / Path(kept).relative_to(recorded))  # in place: interpolations resolve
    return dataset


def recorded_functions(cfg: DictConfig, config: Path) -> None:
    """The options added since the run was trained, at the values its function had
    (:data:`mate_cli.config.recorded.RECORDED_BEFORE`: MATE's ``global_rows``, the table tasks'
    ``head.at_least_one_cell``), given to ``cfg`` where it lacks them (in place), each said once in the log."""
    said: set[str] = set()

    def added(key: str, value) -> None:
        if key not in said:
            said.add(key)
            log.info("%s records no %s: rebuilt with %s, its run's function", config, key, value)

    add_recorded_options(cfg, added)


def run_checkpoint(value: str | Path, key: str = "ckpt_path") -> Path:
    """The weights ``ckpt_path=`` names (docs/runs.md, "What ``ckpt_path=<run dir>`` means"): a file as it is; a run
    dir's best checkpoint (its ``metrics.json``), else its ``last.ckpt``. Resuming: :mod:`mate_cli.run.resume`."""
    path = Path(str(value)).expanduser()
    if not path.is_dir():
        return path
    with contextlib.suppress(OSError, ValueError, AttributeError):
        best = json.loads((path / "metrics.json").read_text(encoding="utf-8")).get("best_checkpoint")
        if best and (path / "checkpoints" / Path(best).name).is_file():
            return path / "checkpoints" / Path(best).name  # the run dir may have moved since
    if (path / "checkpoints" / "last.ckpt").is_file():
        return path / "checkpoints" / "last.ckpt"
    raise MateError(
        f"{key}={value}: a folder without checkpoints/last.ckpt or metrics.json's best checkpoint; "
        "pass a `mate train` run dir or one of its checkpoints/*.ckpt"
    )


def check_checkpoint(ckpt_path: str | Path) -> Path:
    """``ckpt_path`` as a path, after :func:`check_checkpoint_file` (`MateError` when missing or broken)."""
    ckpt = Path(str(ckpt_path))
    if not ckpt.is_file():
        raise MateError(f"checkpoint not found: {ckpt}; pass ckpt_path=<run dir> or <run dir>/checkpoints/<name>.ckpt")
    check_checkpoint_file(ckpt)
    return ckpt


def check_checkpoint_file(path: Path) -> None:
    """One `MateError` line unless ``path`` is a whole PyTorch checkpoint (a truncated zip loses its end directory)."""
    fix = "pass a checkpoint written by `mate train` (<run dir>/checkpoints/*.ckpt)"
    if path.stat().st_size == 0:
        raise MateError(f"{path} is empty; {fix}")
    if not zipfile.is_zipfile(path):
        raise MateError(f"{path} is not a complete PyTorch checkpoint (truncated, or another kind of file); {fix}")
    with zipfile.ZipFile(path) as archive:
        if not any(name.endswith("data.pkl") for name in archive.namelist()):
            raise MateError(f"{path} is a zip archive but not a PyTorch checkpoint; {fix}")


def check_checkpoint_fits(ckpt_path: str | Path, model: torch.nn.Module, key: str, resume: bool = False) -> dict:
    """The checkpoint, loaded weights-only, once it is whole, has exactly ``model``'s names and shapes, finite weights
    and (``resume``) a well-formed resume state; else one `MateError` line naming ``key``."""
    path = check_checkpoint(ckpt_path)
    fix = "pass a checkpoint written by `mate train` for this task"
    data, state = read_state(path, key, fix)
    expected = {name: tuple(value.shape) for name, value in model.state_dict().items()}
    found = {name: tuple(value.shape) for name, value in state.items() if isinstance(value, torch.Tensor)}
    differences = [f"lacks {name}" for name in sorted(expected.keys() - found.keys())]
    differences += [f"has {name}, which this model does not" for name in sorted(found.keys() - expected.keys())]
    differences += [
        f"has {name} of shape {found[name]}, not {expected[name]}"
        for name in sorted(expected.keys() & found.keys())
        if expected[name] != found[name]
    ]
    if count := len(differences):
        raise MateError(
            f"{key}={path} does not fit the model its config builds: it {differences[0]}"
            f"{f' (and {count - 1} more differences)' if count > 1 else ''}; it is a checkpoint of "
            f"another task or model: {fix}"
        )
    refuse_non_finite(state, path, key)
    if resume:
        check_resume_state(path, data)
        check_optimizer_groups(path, data, model)
    return data


def check_optimizer_groups(path: Path, data: dict, model: torch.nn.Module) -> None:
    """Refuse to resume an optimiser state of other parameter groups than ``model``'s (Lightning: a bare ValueError)."""
    from mate_cli.trainer.optim import parameter_groups

    if not hasattr(model, "own_rates"):
        return
    saved = [len(group["params"]) for group in data["optimizer_states"][0].get("param_groups", [])]
    now = [len(group["params"]) for group in parameter_groups(model, model.own_rates())]
    if saved and saved != now:
        raise MateError(
            f"ckpt_path={path}: its optimiser trained {len(saved)} parameter groups ({saved} parameters), this run's "
            f"model has {len(now)} ({now}): its settings differ from the run's (model.extra_lr, the frozen parts); "
            "resume with the run's own, as its resolved_config.yaml records them"
        )


def read_state(path: Path, key: str, fix: str) -> tuple[dict, dict]:
    """``(checkpoint, its state_dict)``, loaded weights-only; one `MateError` line naming ``key`` when it has none."""
    data = load_weights_only(path, fix)
    state = data.get("state_dict") if isinstance(data, dict) else None
    if not isinstance(state, dict):
        raise MateError(f"{key}={path} holds no state_dict; {fix}")
    return data, state


def refuse_non_finite(state: dict, path: Path, key: str) -> None:
    if bad := non_finite_tensors(state):
        raise MateError(
            f"{key}={path} holds NaN or infinite weights ({bad[0]}"
            f"{f' and {len(bad) - 1} more tensors' if len(bad) > 1 else ''}): the run that wrote it "
            "diverged; use an earlier checkpoint of that run, or train again with a lower learning rate"
        )


def check_resume_state(path: Path, data: dict) -> None:
    """Refuse a checkpoint to resume from that lacks an optimiser state, was written by a Lightning before 2.0 (whose
    loop state this one cannot read), or holds a damaged resume state (its RNG states are tried on this process's
    generators, then put back). What a whole one may still lack: :func:`mate_cli.run.resume.unrestored`."""
    if not data.get("optimizer_states"):
        raise MateError(
            f"ckpt_path={path} holds no optimiser state to continue from; resume from a run's checkpoints/last.ckpt"
        )
    written = str(data.get("pytorch-lightning_version", ""))
    if written.split(".")[0].isdigit() and int(written.split(".")[0]) < 2:
        raise MateError(
            f"ckpt_path={path} was written by Lightning {written}, whose training state Lightning "
            f"{lightning.__version__} cannot continue; start from its weights instead: init_from={path}"
        )
    saved, now = data.get(STATE_KEY), rng_states()
    try:
        if saved is not None:
            int(saved["epoch"]), int(saved["examples_this_epoch"])
            set_rng_states(saved["rng"])
    except Exception as err:  # noqa: BLE001 - any damage to the entry
        raise MateError(
            f"ckpt_path={path}: its resume state ({STATE_KEY}) is damaged ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else 'unreadable'}); resume from another "
            "checkpoint of that run, or start again without ckpt_path"
        ) from None
    finally:
        set_rng_states(now)


def pick_device(accelerator: str | None) -> torch.device:
    """``cpu`` -> CPU; ``gpu``/``cuda`` -> CUDA (MateError if absent); anything else -> CUDA when available."""
    name = str(accelerator or "auto").lower()
    if name == "cpu":
        return torch.device("cpu")
    if name in ("gpu", "cuda"):
        if not torch.cuda.is_available():
            raise MateError("hardware=gpu but no CUDA device is visible; use hardware=cpu")
        return torch.device("cuda")
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


#: ``trainer.precision`` -> the autocast dtype of Lightning's MixedPrecision (what `mate eval`'s Trainer runs)
MIXED = {"bf16-mixed": torch.bfloat16, "bf16": torch.bfloat16, "16-mixed": torch.float16, "16": torch.float16}
#: on CPU Lightning runs float16 mixed precision as bfloat16 (its accelerator connector converts it)
CPU_MIXED = {**MIXED, "16-mixed": torch.bfloat16, "16": torch.bfloat16}


def autocast(device: torch.device, precision: str | None):
    """The forward context Lightning gives ``precision`` on ``device``, for the loops outside a Trainer."""
    text = str(precision or "32-true")
    if text in MIXED:
        return torch.autocast(device.type, dtype=(CPU_MIXED if device.type == "cpu" else MIXED)[text])
    if text not in ("32-true", "32"):
        raise MateError(
            f"trainer.precision={text} converts the weights, which `mate predict` and `mate pointr` do not do; "
            "use trainer.precision=bf16-mixed (or 16-mixed, 32-true)"
        )
    return contextlib.nullcontext()


@dataclass
class TrainedRun:
    """A trained model: its training run's config, the module (eval mode, on a device), its tokenizer."""

    cfg: DictConfig
    model: torch.nn.Module
    ckpt_path: str
    tokenizer: Any


def load_trained(
    ckpt_path: str,
    overrides: Sequence[str] | None,
    expected: type | tuple[type, ...],
    key: str,
    device: torch.device,
    trust: bool = False,
) -> TrainedRun:
    """The run behind ``ckpt_path`` (:func:`run_checkpoint`) rebuilt with ``overrides``, its checked weights loaded,
    in eval mode on ``device``; refused unless its module is one of ``expected``. A TAPAS task directory
    (:mod:`mate_cli.run.task_directory`) stands for a run of its task; ``overrides`` are then `mate train`'s."""
    where = f"{key}.ckpt_path" if key in ("stage1", "stage2") else "ckpt_path"  # the key on the command line
    if (directory := task_directory(ckpt_path, where)) is not None:
        log.info("%s: %s", ckpt_path, describe(directory))
        cfg = task_run_config(directory, overrides or [])
        model = instantiate(cfg.model)
        if not isinstance(model, expected):
            raise MateError(f"{where}={ckpt_path} is a TAPAS {directory.task} model, not a run this command reads")
        check_head_loaded(directory, model)
        tokenizer = load_tokenizer(cfg.dataset.pretrained)
        return TrainedRun(cfg=cfg, model=model.eval().to(device), ckpt_path=directory.resolved, tokenizer=tokenizer)
    chosen = str(run_checkpoint(ckpt_path))
    if chosen != str(ckpt_path):
        log.info("%s=%s: loading %s", where, ckpt_path, chosen)
    ckpt_path = chosen
    cfg = load_run_config(ckpt_path, overrides, trust)
    target = str(cfg.get("model", {}).get("_target_", ""))
    names = [cls.__name__ for cls in (expected if isinstance(expected, tuple) else (expected,))]
    if target.rsplit(".", 1)[-1] not in names:  # exactly: GraphCellSelectionModule is no CellSelectionModule run
        wanted = " or ".join(names)
        fix = f"pass the checkpoint of a run that trained {wanted}"
        if target.rsplit(".", 1)[-1] in ("TableQAModule", "EntailmentModule") and key == "stage1":
            fix += " (a table-task run: `mate predict ckpt_path=<run dir> table=<file> question=...`, `mate eval`)"
        raise MateError(f"{where}={ckpt_path} is a run of {target or 'an unknown model'}, not {wanted}; {fix}")
    model = instantiate(cfg.model)
    model.load_state_dict(check_checkpoint_fits(ckpt_path, model, where)["state_dict"])
    model.eval().to(device)
    return TrainedRun(cfg=cfg, model=model, ckpt_path=str(ckpt_path), tokenizer=load_tokenizer(cfg.dataset.pretrained))


def init_weights_from(model: torch.nn.Module, value: str | Path, key: str = "init_from") -> str:
    """``init_from=``: copy in each tensor of that checkpoint (:func:`run_checkpoint`) whose name and shape match
    ``model``'s, refused when no encoder tensor does; the rest stay fresh. Returns the line that says which."""
    path, fix = run_checkpoint(value, key), "pass a `mate train` run dir or one of its checkpoints/*.ckpt"
    if not path.is_file():
        raise MateError(f"{key}={value}: no such checkpoint or run dir; {fix}")
    check_checkpoint_file(path)
    _, state = read_state(path, key, fix)
    own = model.state_dict()
    fits = {
        name: tensor
        for name, tensor in state.items()
        if name in own and isinstance(tensor, torch.Tensor) and tuple(tensor.shape) == tuple(own[name].shape)
    }
    if not any(name.startswith("encoder.") for name in fits):
        raise MateError(
            f"{key}={path} holds no encoder weight of this model's names and shapes: it is a run of "
            "another encoder (model.encoder.pretrained); start from a run of the same encoder"
        )
    refuse_non_finite(fits, path, key)
    model.load_state_dict(fits, strict=False)
    parts = []
    for module in dict.fromkeys(name.split(".", 1)[0] for name in own):
        names = [name for name in own if name.split(".", 1)[0] == module]
        fresh = [name.split(".", 1)[1] for name in names if name not in fits]
        loaded = len(names) - len(fresh)
        part = f"{module} {loaded}/{len(names)} tensors"
        if fresh and loaded:
            part += f" (fresh: {', '.join(fresh[:4])}{f' and {len(fresh) - 4} more' if len(fresh) > 4 else ''})"
        elif fresh:
            part += " (fresh)"
        parts.append(part)
    return f"{key}={path}: loaded {'; '.join(parts)}"
