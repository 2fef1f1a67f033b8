"""The learn step of tools/gpu_run.sh, run on a CPU as docs/results.md prints that call, on the bundled samples with a
tiny budget: per table task its trivial baselines and one sweep of MATE and dense (WikiTQ's jobs started from the
SQA run of their attention), then `mate report` of them all, copied beside the step's log with the runs' small files.
The script and its `mate` processes are the point."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tarfile

import yaml

from tests.helpers import REPO_ROOT

TINY = ("trainer.max_steps=1 trainer.val_check_interval=1 trainer.check_val_every_n_epoch=null dataset.max_length=128 "
        "dataset.batch_size=4 dataset.eval_batch_size=8 trainer.limit_val_batches=1")  # fmt: skip


def printed_cpu_call() -> list[str]:
    """The CPU call of the learn step as docs/results.md prints it."""
    text = (REPO_ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    (line,) = [line.strip() for line in text.splitlines() if line.strip().startswith("GPU_STEPS=learn LEARN_HARDWARE")]
    return shlex.split(line)


def test_the_printed_learn_step_runs_on_a_cpu_with_the_samples_and_writes_the_table(tmp_path):
    """Over 60 s: three baselines, three sweeps of two one-step jobs, TabFact's two scored with shuffled tables, a
    report."""
    words = printed_cpu_call()
    settings = dict(word.split("=", 1) for word in words if re.match(r"^[A-Z_]+=", word))
    command = [word for word in words if not re.match(r"^[A-Z_]+=", word)]
    assert command == ["bash", "tools/gpu_run.sh"] and settings == {"GPU_STEPS": "learn", "LEARN_HARDWARE": "cpu"}
    gpu, learn = tmp_path / "gpu", tmp_path / "learn"
    env = {**os.environ, **settings, "PYTHON": sys.executable, "GPU_OUT": str(gpu), "LEARN_OUT": str(learn),
           "LEARN_SEEDS": "1", "LEARN_JOBS": "1",
           "LEARN_ARGS": f"{TINY} dataset.cache_dir={tmp_path / 'cache'}"}  # fmt: skip
    for name in ("LEARN_DATA", "E2E_DATA", "LEARN_TASKS", "LEARN_INIT", "LEARN_ATTENTIONS"):
        env.pop(name, None)
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    log = (gpu / "learn.log").read_text() if (gpu / "learn.log").is_file() else ""
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:] + log[-4000:]
    assert re.match(r"learn: exit 0 in \d+ s", (gpu / "steps.txt").read_text())
    for task in ("sqa", "wtq", "tabfact"):
        assert (learn / f"baseline_{task}" / "metrics.json").is_file(), task
        jobs = sorted(p for p in (learn / task).iterdir() if p.is_dir())
        assert len(jobs) == 2 and all((job / "metrics.json").is_file() for job in jobs), task

    def attention(job):
        return yaml.safe_load((job / "resolved_config.yaml").read_text())["attention"]["_target_"]

    sqa = {attention(job): job for job in (learn / "sqa").iterdir() if job.is_dir()}
    assert len(sqa) == 2
    for job in (p for p in (learn / "wtq").iterdir() if p.is_dir()):
        started = yaml.safe_load((job / "resolved_config.yaml").read_text())["init_from"]
        assert started == str(sqa[attention(job)]), job.name
    shuffled = sorted(p.name for p in (learn / "tabfact_shuffled").iterdir())  # each TabFact job, its tables shuffled
    assert shuffled == ["0", "1"] and all((learn / "tabfact_shuffled" / n / "metrics.json").is_file() for n in shuffled)
    table = (gpu / "learn.md").read_text()
    assert "val/accuracy_shuffled_tables" in table
    for experiment in ("sqa_mate", "wtq_mate", "tabfact_mate"):
        assert len(re.findall(rf"^\|[^\n]*\| {experiment} \| (mate|dense) \|", table, re.M)) == 2, (experiment, table)
    with tarfile.open(gpu / "learn_runs.tar.gz") as pack:
        names = pack.getnames()
    assert sum(name.endswith("/metrics.json") for name in names) == 11, names  # six jobs, two evals, three baselines
