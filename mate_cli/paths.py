"""Where the repository's config tree and bundled data live, and Hydra resolvers.

``conf/`` and ``data/`` sit at the repository root next to the package (the
project is installed editable); ``MATE_CONF_DIR`` overrides the config location.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

from omegaconf import OmegaConf

REPO_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = Path(os.environ.get("MATE_CONF_DIR", REPO_ROOT / "conf"))


def name_parts(*parts) -> list[str]:
    """The parts that say something: not None, not empty, not ``null``/``none``."""
    return [str(p) for p in parts if p is not None and str(p).strip() and str(p).lower() not in ("null", "none")]


def run_group(experiment: str) -> str:
    """The W&B group: the experiment, or ``<experiment>-<sweep dir name>`` for a multirun job."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        return f"{experiment}-{Path(HydraConfig.get().sweep.dir).name}"
    return str(experiment)


def output_root() -> Path:
    """Where runs live: ``MATE_OUTPUT_DIR`` or ``outputs`` (as ``conf/hydra/default.yaml``)."""
    return Path(os.environ.get("MATE_OUTPUT_DIR") or "outputs")


def pretrained_run(experiment: str) -> str:
    """The ``encoder/`` of the newest finished ``mate pretrain`` run of ``experiment``
    (``pretrain_mate``, ``pretrain_dense``, ...): ``${mate.pretrained:<experiment>}``.

    Looks in ``<output root>/pretrain/<time>-<experiment>-...`` and in the jobs of
    ``<output root>/multirun/pretrain/<time>/`` whose ``resolved_config.yaml`` names that
    experiment; newest by start time. A run's ``resolved_config.yaml`` records the directory;
    pass ``model.encoder.pretrained=<dir>`` to pin another.
    """
    from mate_cli.errors import MateError

    root = output_root()
    found = [(p.name[:19], p) for p in (root / "pretrain").glob(f"*-{experiment}-*")]
    for job in (root / "multirun" / "pretrain").glob("*/*"):
        config = job / "resolved_config.yaml"
        if config.is_file() and f"\nexperiment_name: {experiment}\n" in "\n" + config.read_text(encoding="utf-8"):
            found.append((f"{job.parent.name}/{job.name}", job))
    finished = sorted((key, p) for key, p in found if (p / "encoder" / "config.json").is_file())
    if not finished:
        attention = str(experiment).removeprefix("pretrain_")
        raise MateError(f"no finished `mate pretrain` run of experiment {experiment!r} (with encoder/) under {root}; "
                        f"run `mate pretrain attention={attention}` first, or set model.encoder.pretrained=<dir>")
    return str(finished[-1][1].resolve() / "encoder")


def slug(text) -> str | None:
    """A name part safe in a directory name: ``CC-1024 DoT(s-256-l)`` -> ``CC-1024_DoT_s-256-l``."""
    if text is None:
        return None
    return re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9.=-]+", "_", str(text))).strip("_") or None


def dot_name(pruning, max_length, selection, size, pretrained, top_k, task, loss) -> str:
    """DoT's notation for a run, from its config (:func:`mate_cli.modeling.dot.paper_name`)."""
    from mate_cli.modeling.dot import paper_name

    return paper_name(pruning, max_length, selection, pretrained or size, top_k, task, loss)


#: six hex digits drawn once per process: the end of default run dir names, so two runs
#: started in the same second (a retried job) never share a directory
PROCESS_TAG = secrets.token_hex(3)


def register_resolvers() -> None:
    """Register the ``${mate.*:}`` resolvers (idempotent): ``repo_root``; ``join`` (the parts
    that say something, joined by ``-``: run names); ``tags`` (the same parts as a list);
    ``group`` (:func:`run_group`); ``pretrained`` (:func:`pretrained_run`); ``slug`` (:func:`slug`);
    ``dot_name`` (:func:`dot_name`); ``unique`` (:data:`PROCESS_TAG`)."""
    resolvers = {
        "mate.unique": lambda: PROCESS_TAG,
        "mate.repo_root": lambda: str(REPO_ROOT),
        "mate.join": lambda *parts: "-".join(name_parts(*parts)),
        "mate.tags": lambda *parts: name_parts(*parts),
        "mate.group": run_group,
        "mate.pretrained": pretrained_run,
        "mate.slug": slug,
        "mate.dot_name": dot_name,
    }
    for name, function in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, function)


def cache_dir() -> Path:
    """``MATE_CACHE_DIR`` or ``<repo>/.cache/mate`` (the same default as ``conf/paths/default.yaml``)."""
    return Path(os.environ.get("MATE_CACHE_DIR") or REPO_ROOT / ".cache" / "mate")


def keep_tool_caches() -> None:
    """Point matplotlib's config and font cache and torch's compiler cache at mate's cache
    (``<cache>/matplotlib``, ``<cache>/torchinductor``) instead of ``~/.cache``,
    ``~/.config`` and ``/tmp``; a variable the user set is kept. Called before the command
    is imported: both read it once, on import."""
    os.environ.setdefault("MPLCONFIGDIR", str(cache_dir() / "matplotlib"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir() / "torchinductor"))
