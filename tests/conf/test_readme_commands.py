"""Every `mate train`, `mate pretrain` and `mate bench` line of the README's "Reproducing the
paper" table composes (real Hydra) and builds its data and model; placeholders point at the
bundled data (a corpus file written from it), hub ids at the bundled MiniLM, and the
pre-trained encoders the ablation fine-tunes from are MiniLM saved as `mate pretrain` saves."""

from __future__ import annotations

import re
import shlex

import pytest
from hydra.utils import instantiate

from mate_cli.paths import REPO_ROOT
from tests.inprocess import compose_command


def paper_commands() -> list[list[str]]:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Reproducing the paper", 1)[1].split("\n## ", 1)[0]
    commands = [shlex.split(c) for c in re.findall(r"\| `(mate [^`]+)` \|", section)]
    assert len(commands) >= 12
    return commands


CORPUS = (
    '{"text": "Kent wards", "table": {"header": ["ward", "people"], "rows": [["Beaver", "5,512"]]}}\n'
    '{"text": "Rivers", "table": {"header": ["river", "km"], "rows": [["Stour", "96"], ["Medway", "113"]]}}\n'
)


def fill(args: list[str], tmp_path=None) -> list[str]:
    """Placeholders -> the bundled sample; hub ids -> the bundled MiniLM (no network here)."""
    args = [a for a in args if a != "-m"]
    if tmp_path is not None and any("<corpus.jsonl>" in a for a in args):
        (tmp_path / "corpus.jsonl").write_text(CORPUS, encoding="utf-8")
        args = [a.replace("<corpus.jsonl>", str(tmp_path / "corpus.jsonl")) for a in args]
    for name in ("sqa", "wtq", "tabfact"):
        args = [a.replace(f"<{name}_root>", str(REPO_ROOT / "data" / f"{name}_sample")) for a in args]
    args = [a.replace("<root>", str(REPO_ROOT / "data" / "hybridqa_sample")) for a in args]
    return [re.sub(r"^model\.encoder\.pretrained=.*", "model.encoder.pretrained=minilm", a) for a in args]


@pytest.mark.parametrize("command", [c for c in paper_commands() if c[1] == "train"], ids=lambda c: " ".join(c[2:5]))
def test_each_training_command_composes_and_builds(command, tmp_path, request):
    if "+sweep=sparse_pretrain" in command:
        request.getfixturevalue("pretrained_runs")  # tests/conftest.py
    args = fill(command[2:])
    if "+sweep=" in " ".join(args):  # the sweep's first job
        sweep = next(a for a in args if a.startswith("+sweep="))
        first = compose_command("train", args, tmp_path).hydra.sweeper.params
        args = [a for a in args if a != sweep] + [f"{k}={str(v).split(',')[0]}" for k, v in first.items()]
    cfg = compose_command("train", args, tmp_path)
    instantiate(cfg.dataset, cache_dir=str(tmp_path / "cache"))
    instantiate(cfg.model)


def test_the_table_has_pretraining_commands():
    assert [c for c in paper_commands() if c[1] == "pretrain"]


@pytest.mark.parametrize("command", [c for c in paper_commands() if c[1] == "pretrain"], ids=lambda c: " ".join(c[2:4]))
def test_each_pretraining_command_composes_and_builds(command, tmp_path):
    cfg = compose_command("pretrain", fill(command[2:], tmp_path), tmp_path)
    datamodule = instantiate(cfg.dataset, cache_dir=str(tmp_path / "cache"))
    datamodule.setup("fit")
    assert datamodule.stats["train"]["examples"] >= 1
    assert cfg.trainer.max_steps == 1_000_000 and cfg.dataset.max_length == 128
    instantiate(cfg.model)


@pytest.mark.parametrize("command", [c for c in paper_commands() if c[1] == "bench"], ids=lambda c: " ".join(c[2:]))
def test_each_bench_command_composes(command):
    cfg = compose_command("bench", command[2:])
    assert cfg.bench.levels and cfg.bench.modes
