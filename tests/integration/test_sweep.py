"""A real multirun: two jobs in parallel (joblib launcher), each its own W&B offline run
with its own config, name and summary, named after what ran; `mate report` reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import mate_env, run_mate, wandb_run_summary

ARGS = [
    "train", "-m", "experiment=hybridqa_mate", "seed=1,2", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
    "trainer.max_steps=2", "dataset.max_length=128", "dataset.eval_batch_size=16", "tags=[dev]",
]
#: what each run's name and tags add for the command line's other overrides (tags and hydra.* say nothing)
OVERRIDES = ["max_steps=2", "max_length=128", "eval_batch_size=16"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """Over 20 s: a real multirun (its launcher and W&B runs are the point)."""
    base = tmp_path_factory.mktemp("sweep")
    proc = run_mate(ARGS, mate_env(base / "out", base / "cache", HOME=str(base / "home")), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sweep_dir,) = (base / "out" / "multirun" / "train").iterdir()
    return sweep_dir


def test_each_job_is_one_wandb_run_with_its_own_config_and_summary(sweep):
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert len(jobs) == 2
    runs = []
    for job in jobs:
        (run_file,) = job.glob("wandb/offline-run-*/run-*.wandb")
        runs.append(wandb_run_summary(run_file))
    names = {r["run"][0] for r in runs}
    assert names == {f"hybridqa_mate-mate-bucketed-hybridqa_sample-seed{seed}-{','.join(OVERRIDES)}" for seed in (1, 2)}
    groups = {r["run"][1] for r in runs}
    assert groups == {f"hybridqa_mate-{sweep.name}"}
    assert {r["run"][2] for r in runs} == {"cell_selector"}
    assert {r["config"]["seed"] for r in runs} == {1, 2}
    assert sorted(tuple(r["run"][3]) for r in runs) == [
        ("hybridqa_mate", "mate", "bucketed", "hybridqa_sample", f"seed{seed}", *OVERRIDES, "dev") for seed in (1, 2)
    ]
    for job in jobs:
        assert json.loads((job / "metrics.json").read_text())["tags"] == ["dev"]
    for run in runs:
        for key in ("val/hits@1", "val/loss", "perf/examples_per_s", "perf/tokens_per_s", "perf/peak_mem_mb"):
            assert key in run["summary"], key
    assert runs[0]["summary"]["val/loss"] != runs[1]["summary"]["val/loss"]
