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


def register_resolvers() -> None:
    """Register ``${mate.repo_root:}`` (idempotent)."""
    if not OmegaConf.has_resolver("mate.repo_root"):
        OmegaConf.register_new_resolver("mate.repo_root", lambda: str(REPO_ROOT))


def cache_dir() -> Path:
    """``MATE_CACHE_DIR`` or ``<repo>/.cache/mate`` (the same default as ``conf/paths/default.yaml``)."""
    return Path(os.environ.get("MATE_CACHE_DIR") or REPO_ROOT / ".cache" / "mate")
