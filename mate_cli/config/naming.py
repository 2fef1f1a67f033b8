"""Run and folder names, tags and groups, and the ``${mate.*:}`` Hydra resolvers that build them from a config
(``conf/train.yaml``'s ``run_name``, ``hydra.run.dir``, the W&B group and tags)."""

from __future__ import annotations

import hashlib
import re
import secrets
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from mate_cli.errors import MateError
from mate_cli.paths import REPO_ROOT, output_root


def name_parts(*parts) -> list[str]:
    """The parts that say something: not None, not empty, not ``null``/``none``."""
    return [str(p) for p in parts if p is not None and str(p).strip() and str(p).lower() not in ("null", "none")]


#: overrides a run name leaves out: those it already shows, and those that say where or how a run goes
NOT_IN_NAME = ("experiment", "attention", "attention.variant", "dataset", "seed", "tags", "ckpt_path", "hardware",
               "hparams_search", "sweep", "export_encoder", "validate_start", "validate_best", "profile_steps",
               "trainer.max_time")  # fmt: skip
#: nor anything in these groups
NOT_IN_NAME_GROUPS = ("hydra", "paths", "logger", "callbacks", "extras", "report")
#: path values that say what ran (which encoder, which weights), shown by :func:`what_path`; other paths say where, and
#: stay out
WHAT_PATHS = ("model.encoder.pretrained", "init_from")


def what_path(value: str) -> str:
    """A hub id or a run's encoder/checkpoint as a name part: its last two parts, a run's ``encoder/`` or
    ``checkpoints/`` dropped for the run dir (``google_tapas-base``, ``pretrain_<run dir>``,
    ``<sweep time>_0-attention=mate``, ``train_<run dir>_last.ckpt``)."""
    parts = value.rstrip("/").split("/")
    if parts[-1] == "encoder":
        parts = parts[:-1]
    elif parts[-1].endswith(".ckpt") and parts[-2:-1] == ["checkpoints"]:
        return "_".join([*parts[:-2][-2:], parts[-1]])
    return "_".join(parts[-2:])


#: the most characters the overrides add to a run name (the rest is a hash of them)
NAME_OVERRIDES_MAX = 96


def override_parts(overrides) -> list[str]:
    """A job's overrides (``${hydra:overrides.task}``) as the ``key=value`` parts of its name and tags, keyed by the
    key's last part (``model.optimizer.lr=3e-05`` -> ``lr=3e-05``) unless two share one; left out: :data:`NOT_IN_NAME`,
    :data:`NOT_IN_NAME_GROUPS`, paths (``/``) but :data:`WHAT_PATHS`, lists and mappings, which a tag cannot show."""
    pairs = []
    for item in overrides or ():
        key, sep, value = str(item).partition("=")
        key = key.lstrip("+~")
        grouped = any(key == g or key.startswith((g + ".", g + "/")) for g in NOT_IN_NAME_GROUPS)
        if not sep or key in NOT_IN_NAME or grouped:
            continue
        value = value.strip().strip("'\"")
        if key in WHAT_PATHS and "/" in value:
            value = what_path(value)
        if "/" in value or value.startswith(("[", "{")):
            continue
        pairs.append((key, slug(value) or "null"))
    last = [key.rsplit(".", 1)[-1] for key, _ in pairs]
    return [f"{short if last.count(short) == 1 else key}={value}" for (key, value), short in zip(pairs, last)]


def overrides_name(overrides) -> str:
    """:func:`override_parts` as ``lr=3e-05,radius=84``, cut to :data:`NAME_OVERRIDES_MAX` with a hash."""
    text = ",".join(override_parts(overrides))
    if len(text) > NAME_OVERRIDES_MAX:
        # no ~: Hydra refuses it unquoted
        text = f"{text[: NAME_OVERRIDES_MAX - 9]}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"
    return text


#: the longest folder-name part made from a run name or a job's overrides, in bytes: with the time (or job number)
#: before it and the hex digits after it, the name stays under the 255 bytes file systems allow
MAX_DIR_NAME_BYTES = 200


def capped(text: str) -> str:
    """``text`` as a folder-name part (``/`` -> ``_``): whole up to :data:`MAX_DIR_NAME_BYTES` bytes of UTF-8, else cut
    (never inside a character) and ended by ``-`` and 8 hex digits of a hash of the whole."""
    text = str(text).replace("/", "_")
    encoded = text.encode()
    if len(encoded) <= MAX_DIR_NAME_BYTES:
        return text
    head = encoded[: MAX_DIR_NAME_BYTES - 9].decode(errors="ignore")
    return f"{head}-{hashlib.sha256(encoded).hexdigest()[:8]}"


def dir_name(run_name: str) -> str:
    """A run name as a folder name that pastes into ``ckpt_path=`` unquoted (Hydra refuses ``=`` and ``,``)."""
    return capped(str(run_name).replace("=", "").replace(",", "_"))


def dir_name_start(start: str) -> str:
    """What the :func:`dir_name` of every run name beginning with ``start`` begins with."""
    text = str(start).replace("=", "").replace(",", "_").replace("/", "_")
    return text.encode()[: MAX_DIR_NAME_BYTES - 9].decode(errors="ignore")


def tag_list(*parts) -> list[str]:
    """W&B tags: :func:`name_parts`, lists flattened, cut to W&B's 64 characters, duplicates dropped."""
    flat = []
    for part in parts:
        flat.extend(part if isinstance(part, (list, tuple)) or OmegaConf.is_list(part) else [part])
    return list(dict.fromkeys(tag[:64] for tag in name_parts(*flat)))


def run_group(experiment: str) -> str:
    """The W&B group: the experiment, or ``<experiment>-<sweep dir name>`` for a multirun job."""
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        return f"{experiment}-{Path(HydraConfig.get().sweep.dir).name}"
    return str(experiment)


def pretrained_run(experiment: str) -> str:
    """``${mate.pretrained:<experiment>}``: the ``encoder/`` of the newest finished ``mate pretrain`` run (or multirun
    job) of ``experiment`` under :func:`output_root`, by start time, never a ``debug=`` run."""
    root = output_root()
    found = [(p.name[:19], p) for p in (root / "pretrain").glob(f"*-{experiment}-*")]
    for job in (root / "multirun" / "pretrain").glob("*/*"):
        config = job / "resolved_config.yaml"
        if config.is_file() and f"\nexperiment_name: {experiment}\n" in "\n" + config.read_text(encoding="utf-8"):
            found.append((f"{job.parent.name}/{job.name}", job))
    finished = sorted((key, p) for key, p in found if (p / "encoder" / "config.json").is_file() and not _debug_run(p))
    if not finished:
        attention = str(experiment).removeprefix("pretrain_")
        raise MateError(
            f"no finished `mate pretrain` run of experiment {experiment!r} (with encoder/, not a debug= run) under "
            f"{root}; run `mate pretrain attention={attention}` first, or set model.encoder.pretrained=<dir>"
        )
    return str(finished[-1][1].resolve() / "encoder")


def _debug_run(run: Path) -> bool:
    """Whether Hydra recorded a ``debug=`` choice among the run's overrides."""
    overrides = run / ".hydra" / "overrides.yaml"
    if not overrides.is_file():
        return False
    return re.search(r"^- \+*debug=(?!null$)", overrides.read_text(encoding="utf-8"), re.M) is not None


def slug(text) -> str | None:
    """A name part safe in a directory name: ``CC-1024 DoT(s-256-l)`` -> ``CC-1024_DoT_s-256-l``."""
    if text is None:
        return None
    return re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9.=-]+", "_", str(text))).strip("_") or None


def dot_name(pruning, max_length, selection, size, pretrained, top_k, task, loss) -> str:
    """DoT's notation for a run, from its config (:func:`mate_cli.modeling.dot.paper_name`)."""
    from mate_cli.modeling.dot import paper_name

    return paper_name(pruning, max_length, selection, pretrained or size, top_k, task, loss)


#: ends default run dir names, so two runs started in the same second never share one
PROCESS_TAG = secrets.token_hex(3)


def register_resolvers() -> None:
    """Register the ``${mate.*:}`` resolvers (idempotent)."""
    resolvers = {
        "mate.unique": lambda: PROCESS_TAG,
        "mate.repo_root": lambda: str(REPO_ROOT),
        "mate.join": lambda *parts: "-".join(name_parts(*parts)),
        # lists as ListConfig: `--cfg job --resolve` (OmegaConf.resolve) refuses a plain list
        "mate.tags": lambda *parts: OmegaConf.create(tag_list(*parts)),
        "mate.overrides": overrides_name,
        "mate.dir_name": dir_name,
        "mate.capped": capped,
        "mate.override_tags": lambda overrides: OmegaConf.create(override_parts(overrides)),
        "mate.group": run_group,
        "mate.pretrained": pretrained_run,
        "mate.slug": slug,
        "mate.dot_name": dot_name,
    }
    for name, function in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, function)
