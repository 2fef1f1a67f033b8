"""Attention backends. Importing this package registers every backend module that exists.

The interface and the registry live in :mod:`mate_cli.modeling.attention.base`; one
module per backend (dense, none, mate, sat, linformer, table_etc). A backend module
that is not present is skipped; one that is present but broken raises.
"""

from __future__ import annotations

import importlib
import importlib.util

from mate_cli.modeling.attention.base import REGISTRY, AttentionBackend, register

BACKEND_MODULES = ("dense", "none", "mate", "sat", "linformer", "table_etc")

for _name in BACKEND_MODULES:
    if importlib.util.find_spec(f"{__name__}.{_name}") is not None:
        importlib.import_module(f"{__name__}.{_name}")

__all__ = ["REGISTRY", "AttentionBackend", "register", "BACKEND_MODULES"]
