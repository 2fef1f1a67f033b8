"""Attention backends (interface and registry: :mod:`.backend`; docs/architecture.md, "Add an attention backend").
Importing this package registers every module of ``BACKEND_MODULES`` that is present; a broken one raises."""

from __future__ import annotations

import importlib
import importlib.util

from mate_cli.modeling.attention.backend import REGISTRY, AttentionBackend, register

BACKEND_MODULES = ("dense", "none", "mate", "sat", "linformer", "table_etc")

for _name in BACKEND_MODULES:
    if importlib.util.find_spec(f"{__name__}.{_name}") is not None:
        importlib.import_module(f"{__name__}.{_name}")

__all__ = ["REGISTRY", "AttentionBackend", "register", "BACKEND_MODULES"]
