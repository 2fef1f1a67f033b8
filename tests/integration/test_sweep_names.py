"""Sweep jobs that a dashboard tells apart: a heads-ablation sweep (`+sweep=heads_ablation`)
and a 2-trial Optuna search, 2 training steps a job, each job one offline W&B run whose
name and tags carry what was swept (read back from the W&B run files), with the user's
`tags=[dev]` added."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import mate_env, run_mate, wandb_run_summary

COMMON = ["train", "-m", "experiment=hybridqa_mate", "trainer.max_steps=2", "dataset.max_length=128",
          "dataset.eval_batch_size=16", "trainer.limit_val_batches=1", "tags=[dev]"]  # fmt: skip
SWEEPS = {
    "heads": ["+sweep=heads_ablation", "hydra.sweeper.params.seed=1"],
    "optuna": ["hparams_search=optuna", "hydra.sweeper.n_trials=2"],
}
#: the keys each sweep varies, as names and tags show them
SWEPT = {"heads": ("row_heads_ratio",), "optuna": ("lr", "warmup_ratio", "radius", "global_size")}


@pytest.fixture(scope="module", params=list(SWEEPS))
def sweep(request, tmp_path_factory) -> tuple[str, list[dict]]:
    """Over 20 s: a real multirun (its launcher and W&B names are the point)."""
    base = tmp_path_factory.mktemp(request.param)
    proc = run_mate([*COMMON, *SWEEPS[request.param]], mate_env(base / "out", base / "cache", HOME=str(base / "home")),
                    timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sweep_dir,) = (base / "out" / "multirun" / "train").iterdir()
    files = sorted(sweep_dir.glob("*/wandb/offline-run-*/run-*.wandb"))
    return request.param, [wandb_run_summary(path) for path in files]


def swept_values(text: str, keys: tuple[str, ...]) -> dict[str, str]:
    return {key: m[1] for key in keys if (m := re.search(rf"(?:^|[-,]){re.escape(key)}=([^,]+)", text))}


def test_each_job_is_named_and_tagged_by_what_was_swept(sweep):
    kind, runs = sweep
    assert len(runs) == {"heads": 3, "optuna": 2}[kind]
    names = [run["run"][0] for run in runs]
    assert len(set(names)) == len(names), names
    for run in runs:
        name, _, _, tags = run["run"]
        values = swept_values(name, SWEPT[kind])
        assert set(values) == set(SWEPT[kind]), name
        assert {f"{k}={v}" for k, v in values.items()} <= set(tags), (name, tags)
        assert "dev" in tags
    if kind == "heads":
        assert sorted(swept_values(n, SWEPT[kind])["row_heads_ratio"] for n in names) == ["0.0", "0.5", "1.0"]
    tag_sets = {tuple(sorted(run["run"][3])) for run in runs}
    assert len(tag_sets) == len(runs), "two jobs with the same tags"
