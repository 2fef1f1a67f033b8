"""Where the repository's config tree and bundled data live, and Hydra resolvers.

``conf/`` and ``data/`` sit at the repository root next to the package (the
project is installed editable); ``MATE_CONF_DIR`` overrides the config location.
"""

from __future__ import annotations

import os
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


def register_resolvers() -> None:
    """Register the ``${mate.*:}`` resolvers (idempotent): ``repo_root``; ``join`` (the parts
    that say something, joined by ``-``: run names); ``tags`` (the same parts as a list);
    ``group`` (:func:`run_group`)."""
    resolvers = {
        "mate.repo_root": lambda: str(REPO_ROOT),
        "mate.join": lambda *parts: "-".join(name_parts(*parts)),
        "mate.tags": lambda *parts: name_parts(*parts),
        "mate.group": run_group,
    }
    for name, function in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, function)


def cache_dir() -> Path:
    """``MATE_CACHE_DIR`` or ``<repo>/.cache/mate`` (the same default as ``conf/paths/default.yaml``)."""
    return Path(os.environ.get("MATE_CACHE_DIR") or REPO_ROOT / ".cache" / "mate")
