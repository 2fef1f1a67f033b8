"""tools/learn.sh, the GPU's learning runs, on the CPU: every table task's recipe for a few steps on its bundled
sample, the trivial baselines, the table and the pack; a run without metrics.json (what a budget's SIGTERM leaves)
is resumed from its last.ckpt by the next call; a task chained to another (LEARN_INIT) waits for that run, then starts
from its weights; two lanes (LEARN_LANES) train MATE and dense at the same time. The script and its `mate` processes
are the point."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

from tests.helpers import REPO_ROOT

TINY = ("trainer.max_steps=2 trainer.val_check_interval=2 trainer.check_val_every_n_epoch=null dataset.max_length=128 "
        "dataset.batch_size=4 dataset.eval_batch_size=8 trainer.limit_val_batches=2")  # fmt: skip


def learn(
    out, tasks: str, args: str = TINY, status: int = 0, init: str = "wtq1024=sqa", attentions="mate", lanes="1"
) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "LEARN_OUT": str(out), "LEARN_HARDWARE": "cpu", "LEARN_SEEDS": "1",
           "LEARN_TASKS": tasks, "LEARN_ATTENTIONS": attentions, "LEARN_ARGS": f"{args} dataset.cache_dir={out / 'cache'}",
           "LEARN_INIT": init, "LEARN_LANES": lanes}  # fmt: skip
    done = subprocess.run(
        ["bash", "tools/learn.sh"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == status, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_learn_runs_each_task_tabulates_it_beside_its_baselines_resumes_a_cut_run_and_chains_one(tmp_path):
    """Over 20 s: six short `mate train` processes (two side by side) and three `mate baseline` ones."""
    out = tmp_path / "learn"
    first = learn(out, "wtq1024 sqa tabfact")  # wtq1024 starts from sqa's run, which this call has not made yet
    assert "learn: wtq1024_mate_s1: not started (waits for sqa_mate_s1 to complete)" in first.stdout, first.stdout
    assert not (out / "wtq1024_mate_s1").exists()

    (out / "tabfact_mate_s1" / "metrics.json").unlink()  # as if the budget had ended it after a checkpoint
    again = learn(out, "sqa wtq1024 tabfact")
    assert "learn: tabfact_mate_s1: exit 0 (resumed)" in again.stdout and "sqa_mate_s1" not in again.stdout
    assert (out / "tabfact_mate_s1" / "metrics.json").is_file()
    assert len((out / "tabfact_mate_s1.seconds").read_text().splitlines()) == 2  # both calls' minutes count
    # nothing was left to train: the resume keeps the first call's learning curve and scores the final weights
    with open(out / "tabfact_mate_s1" / "csv" / "metrics.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert any(row["val/accuracy"] and int(row["step"]) < 2 for row in rows), rows  # before the resumed call's step
    assert "val/accuracy" in json.loads((out / "tabfact_mate_s1" / "metrics.json").read_text(encoding="utf-8"))
    chained = (out / "wtq1024_mate_s1.log").read_text(encoding="utf-8")
    assert f"init_from={out / 'sqa_mate_s1'}" in chained and "loaded encoder" in chained, chained[-3000:]

    table = (out / "learn.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.endswith("|") and "_" not in line}
    assert {"sqa", "wtq1024", "tabfact"} <= set(rows) and "(always answer" in rows["wtq1024"], table
    assert "(always refuted)" in rows["tabfact"] and "(statement only)" in rows["tabfact"], table
    assert all("1: 0." in rows[task] and "not complete" not in rows[task] for task in ("sqa", "wtq1024", "tabfact")), (
        table
    )
    top_cell = {task: rows[task].split("|")[6].strip() for task in rows}  # SQA's and WikiTQ's val/cell_top1
    assert top_cell["sqa"].startswith("1: 0.") and top_cell["wtq1024"].startswith("1: ") and top_cell["tabfact"] == "-"
    assert "Runs of data: the bundled samples; hardware: cpu; args: trainer.max_steps=2" in table, table
    assert "; init: wtq1024=sqa." in table, table
    with tarfile.open(out / "learn_runs.tar.gz") as pack:
        names = set(pack.getnames())
    assert {"./tabfact_mate_s1/metrics.json", "./tabfact_mate_s1/csv/metrics.csv", "./baseline_wtq/metrics.json",
            "./sqa_mate_s1.log", "./wtq1024_mate_s1/metrics.json"} <= names  # fmt: skip
    assert not any(name.endswith(".ckpt") for name in names)

    shutil.rmtree(out / "tabfact_mate_s1")  # trained again, beside dense's first run
    (out / "tabfact_mate_s1.log").unlink()
    beside = learn(out, "tabfact", attentions="mate dense", lanes="2")
    assert "learn: tabfact_mate_s1: exit 0 (" in beside.stdout and "tabfact_dense_s1: exit 0 (" in beside.stdout
    spans = {name: last_call_span(out / f"tabfact_{name}_s1.log") for name in ("mate", "dense")}
    assert spans["mate"][0] < spans["dense"][1] and spans["dense"][0] < spans["mate"][1], spans  # at the same time
    table = (out / "learn.md").read_text(encoding="utf-8")
    dense = next(line for line in table.splitlines() if line.startswith("| tabfact | dense |"))
    assert dense.split("|")[-2].strip().endswith("*") and "up to 2 at a time" in table, table

    refused = learn(out, "tabfact", args=TINY.replace("max_steps=2", "max_steps=3"), status=2)  # other settings
    assert "holds runs of other settings" in refused.stderr and refused.stdout == "", refused.stderr
    bad = learn(tmp_path / "chain", "wtq", status=2, init="wtq")  # starts from whose run? refused, no folder made
    assert "LEARN_INIT: 'wtq' is no <task>=" in bad.stderr and not (tmp_path / "chain").exists()
    bad = learn(tmp_path / "lanes", "wtq", status=2, lanes="two")
    assert "LEARN_LANES: 'two' is no number" in bad.stderr and not (tmp_path / "lanes").exists()


def last_call_span(log) -> tuple[str, str]:
    """The first and last log time of the last `mate train` call appended to a run's log."""
    call = log.read_text(encoding="utf-8").split("overrides: ")[-1]
    times = re.findall(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\]", call, flags=re.MULTILINE)
    assert len(times) >= 2, call[-2000:]
    return times[0], times[-1]
