"""Test-wide settings: offline everything, outputs and caches in temp dirs."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLE_ROOT = REPO_ROOT / "data" / "hybridqa_sample"


@pytest.fixture(scope="session")
def sample_root() -> Path:
    return SAMPLE_ROOT


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from mate_cli.modeling.checkpoints import bundled_model_dir

    return Path(bundled_model_dir())
