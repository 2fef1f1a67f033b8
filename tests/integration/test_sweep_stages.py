"""Stages chained by matching jobs: ``init_from=sweep:<dir>`` and ``model.encoder.pretrained=sweep:<dir>``.

- Two stages (the SQA sample, then the WikiTQ sample with ``init_from=sweep:<first>``): each second-stage job starts
  from the first-stage run of its own attention and seed, and records it; zero, several or unfinished matches are one
  line; `mate report` of the second stage is one configuration whose numbers are the jobs' metrics.json.
- A `mate pretrain` sweep's run of the same seed is the encoder a training run starts from.
"""

from __future__ import annotations

import csv
import json
import re
import statistics

import pytest
import yaml

from tests.helpers import jobs_of, mate_env, run_mate
from tests.inprocess import run_command

STAGE = ["dataset.max_length=128", "trainer.max_steps=1", "trainer.limit_val_batches=1", "dataset.eval_batch_size=16",
         "logger=csv"]  # fmt: skip


def test_a_second_stage_starts_each_job_from_the_first_stages_run_of_its_attention_and_seed(tmp_path):
    """Over 30 s: six one-step runs, two sweeps (the basic launcher), and the second's report."""
    env = mate_env(tmp_path / "out", tmp_path / "cache")
    first, second = tmp_path / "sqa", tmp_path / "wtq"
    ran = run_mate(["train", "-m", "experiment=sqa_mate", "dataset=sqa_sample", *STAGE, "attention=mate,dense",
                    "seed=1,2", f"hydra.sweep.dir={first}"], env)  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    ran = run_mate(["train", "-m", "experiment=wtq_mate", "dataset=wtq_sample", *STAGE, "attention=mate", "seed=1,2",
                    f"init_from=sweep:{first}", f"hydra.sweep.dir={second}"], env)  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    sources = {}
    for job in jobs_of(first):
        overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
        sources[tuple(o for o in overrides if o.startswith(("attention=", "seed=")))] = job
    for job in jobs_of(second):
        overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
        own = tuple(o for o in overrides if o.startswith(("attention=", "seed=")))
        started = yaml.safe_load((job / "resolved_config.yaml").read_text())["init_from"]
        assert started == str(sources[own]), (own, started)
        assert json.loads((job / "metrics.json").read_text())["started_from"] == started
    assert len(jobs_of(second)) == 2
    # zero or several matches, or a match that has not finished: one line naming them
    from mate_cli.errors import MateError
    from mate_cli.run.stages import matching_run

    value = f"sweep:{first}"
    with pytest.raises(MateError, match=r"no job of .* has attention=mate, seed=3 \(its jobs ran attention in "):
        matching_run(value, "init_from", {"attention": "mate", "seed": "3"})
    with pytest.raises(MateError, match=r"2 jobs of .* match seed=1 .*; they differ in attention: set attention in"):
        matching_run(value, "init_from", {"seed": "1"})
    unfinished = sources[("attention=dense", "seed=1")]
    (unfinished / "metrics.json").rename(unfinished / "metrics.json.kept")
    with pytest.raises(MateError, match=rf"the matching job {re.escape(str(unfinished))} has not finished"):
        matching_run(value, "init_from", {"attention": "dense", "seed": "1"})
    # the report: one configuration, both seeds, though each seed started from its own run; its numbers are the
    # jobs' metrics.json
    (configuration,) = run_command("report", [f"path={second}", "plots=false"], tmp_path / "report")
    assert len(configuration.counted()) == 2 and configuration.key["attention"] == "mate"
    scores = [json.loads((job / "metrics.json").read_text())["val/accuracy"] for job in jobs_of(second)]
    with open(tmp_path / "report" / "report.csv", newline="") as handle:
        (row,) = list(csv.DictReader(handle))
    assert float(row["val/accuracy_median"]) == pytest.approx(statistics.median(scores))
    assert (float(row["val/accuracy_min"]), float(row["val/accuracy_max"])) == pytest.approx((min(scores), max(scores)))
    assert row["runs_ok"] == "2"


def test_a_pretraining_sweeps_run_of_the_same_seed_is_the_encoder_a_training_run_starts_from(tmp_path):
    """Over 30 s: a `mate pretrain` sweep of two seeds, then one run with model.encoder.pretrained=sweep:<it> (in
    process): the encoder it loads is the export of the pre-training run of its seed."""
    env = mate_env(tmp_path / "out", tmp_path / "cache")
    folder = tmp_path / "pretrain"
    ran = run_mate(["pretrain", "-m", "seed=1,2", "logger=csv", "trainer.max_steps=2", "trainer.val_check_interval=2",
                    "dataset.batch_size=4", "dataset.eval_masks=1", f"hydra.sweep.dir={folder}"], env)  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    (seed2,) = [
        job for job in jobs_of(folder) if "seed=2" in yaml.safe_load((job / ".hydra/overrides.yaml").read_text())
    ]
    run = tmp_path / "train"
    run_command("train", ["logger=csv", "trainer.max_steps=1", "dataset.limit_questions=4", "dataset.max_length=128",
                          "validate_best=false", "seed=2", f"model.encoder.pretrained=sweep:{folder}"],
                run)  # fmt: skip
    config = yaml.safe_load((run / "resolved_config.yaml").read_text())
    assert config["model"]["encoder"]["pretrained"] == str(seed2 / "encoder")
