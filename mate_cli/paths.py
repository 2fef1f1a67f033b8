"""Where ``conf/`` (or ``MATE_CONF_DIR``) and the bundled data live (the repository root, installed editable), where
runs go, and the cache folders. Run and folder names and the ``${mate.*:}`` resolvers: :mod:`mate_cli.config.naming`."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = Path(os.environ.get("MATE_CONF_DIR", REPO_ROOT / "conf"))


def output_root() -> Path:
    """Where runs live: ``MATE_OUTPUT_DIR`` or ``outputs`` (as ``conf/hydra/default.yaml``)."""
    return Path(os.environ.get("MATE_OUTPUT_DIR") or "outputs")


def cache_dir() -> Path:
    """``MATE_CACHE_DIR`` or ``<repo>/.cache/mate`` (the same default as ``conf/paths/default.yaml``)."""
    return Path(os.environ.get("MATE_CACHE_DIR") or REPO_ROOT / ".cache" / "mate")


def keep_tool_caches() -> None:
    """matplotlib's, torch compiler's and Triton's caches under :func:`cache_dir`, not ``~`` or ``/tmp``, unless the
    user set them; called before the command is imported, as they read the variables on import."""
    os.environ.setdefault("MPLCONFIGDIR", str(cache_dir() / "matplotlib"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir() / "torchinductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(cache_dir() / "triton"))
