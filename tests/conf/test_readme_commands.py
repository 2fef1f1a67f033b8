"""Every `mate train` and `mate bench` line of the README's "Reproducing the paper" table
composes (real Hydra) and builds its data and model; placeholders point at the bundled
data, hub ids at the bundled MiniLM."""

from __future__ import annotations

import re
import shlex

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate

from mate_cli.paths import CONF_DIR, REPO_ROOT
from tests.conf.test_compose import compose_train


def paper_commands() -> list[list[str]]:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Reproducing the paper", 1)[1].split("\n## ", 1)[0]
    commands = [shlex.split(c) for c in re.findall(r"\| `(mate [^`]+)` \|", section)]
    assert len(commands) >= 12
    return commands


def fill(args: list[str]) -> list[str]:
    """Placeholders -> the bundled sample; hub ids -> the bundled MiniLM (no network here)."""
    args = [a for a in args if a != "-m"]
    for name in ("sqa", "wtq", "tabfact"):
        args = [a.replace(f"<{name}_root>", str(REPO_ROOT / "data" / f"{name}_sample")) for a in args]
    args = [a.replace("<root>", str(REPO_ROOT / "data" / "hybridqa_sample")) for a in args]
    return [re.sub(r"^model\.encoder\.pretrained=.*", "model.encoder.pretrained=minilm", a) for a in args]


@pytest.mark.parametrize("command", [c for c in paper_commands() if c[1] == "train"], ids=lambda c: " ".join(c[2:5]))
def test_each_training_command_composes_and_builds(command, tmp_path):
    args = fill(command[2:])
    if "+sweep=" in " ".join(args):  # the sweep's first job
        sweep = next(a for a in args if a.startswith("+sweep="))
        first = compose_train(args, tmp_path).hydra.sweeper.params
        args = [a for a in args if a != sweep] + [f"{k}={str(v).split(',')[0]}" for k, v in first.items()]
    cfg = compose_train(args, tmp_path)
    instantiate(cfg.dataset, cache_dir=str(tmp_path / "cache"))
    instantiate(cfg.model)


@pytest.mark.parametrize("command", [c for c in paper_commands() if c[1] == "bench"], ids=lambda c: " ".join(c[2:]))
def test_each_bench_command_composes(command):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("bench", overrides=command[2:])
    assert cfg.bench.levels and cfg.bench.modes
