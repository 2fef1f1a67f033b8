"""tools/learn.sh, the GPU's learning runs, on the CPU: every table task's recipe for a few steps on its bundled
sample, the trivial baselines, the table and the pack; a run without metrics.json (what a budget's SIGTERM leaves)
is resumed from its last.ckpt by the next call; a sweep (LEARN_SWEEP) trains beside them in a folder of its own, for
the tasks its entry names; a task chained to another (LEARN_INIT) waits for that run, then starts from its weights;
two lanes (LEARN_LANES) train MATE and dense at the same time, and a time limit's TERM to the script's process group
stops both runs with their last.ckpt and still writes the table. The script and its `mate` processes are the point."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time

import pytest
import yaml

from tests.helpers import REPO_ROOT
from tests.inprocess import run_captured

TINY = ("trainer.max_steps=2 trainer.val_check_interval=2 trainer.check_val_every_n_epoch=null dataset.max_length=128 "
        "dataset.batch_size=4 dataset.eval_batch_size=8 trainer.limit_val_batches=2")  # fmt: skip


def learn(
    out,
    tasks: str,
    args: str = TINY,
    status: int = 0,
    init: str = "wtq1024=sqa",
    attentions="mate",
    lanes="1",
    seeds="1",
    **more: str,
) -> subprocess.CompletedProcess:
    done = subprocess.run(
        ["bash", "tools/learn.sh"], cwd=REPO_ROOT, env=settings(out, tasks, args, init, attentions, lanes, seeds) | more,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == status, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def settings(out, tasks: str, args: str, init: str, attentions: str, lanes: str, seeds: str) -> dict:
    return {**os.environ, "PYTHON": sys.executable, "LEARN_OUT": str(out), "LEARN_HARDWARE": "cpu", "LEARN_SEEDS": seeds,
            "LEARN_TASKS": tasks, "LEARN_ATTENTIONS": attentions, "LEARN_ARGS": f"{args} dataset.cache_dir={out / 'cache'}",
            "LEARN_INIT": init, "LEARN_LANES": lanes}  # fmt: skip


def test_learn_runs_each_task_tabulates_it_beside_its_baselines_resumes_a_cut_run_and_chains_one(tmp_path):
    """Over 20 s: six short `mate train` processes (two side by side), four `mate baseline`, a `mate synthesize`."""
    out = tmp_path / "learn"
    # wtq1024 starts from sqa's run: taken once that is complete; beside them the synthetic statements (TabFact's
    # recipe on `mate synthesize`'s output) at another rate, in a folder of its own (the entry's own task, not
    # LEARN_SWEEP_TASKS's)
    sweep = "synth:model.optimizer.lr=1e-4"
    first = learn(out, "wtq1024 sqa tabfact", LEARN_SWEEP=sweep, LEARN_SWEEP_TASKS="sqa")
    swept = tmp_path / "learn_synth_model.optimizer.lr_1e-4"
    assert f"learn: sweep {sweep}: exit 0 ({out / 'sweep_synth_model.optimizer.lr_1e-4.log'})" in first.stdout
    runs = sorted(path.name for path in swept.iterdir() if re.fullmatch(r"[a-z0-9]+_[a-z]+_s\d+", path.name))
    assert runs == ["synth_mate_s1"]  # its tasks alone
    config = yaml.safe_load((swept / "synth_mate_s1" / "resolved_config.yaml").read_text())
    assert config["model"]["optimizer"]["lr"] == pytest.approx(1e-4) and config["experiment_name"] == "tabfact_mate"
    assert (
        config["dataset"]["root"] == str(swept / "synth_data") and (swept / "synth_data" / "synthesize.json").is_file()
    )
    swept_table = (swept / "learn.md").read_text(encoding="utf-8")
    assert " model.optimizer.lr=1e-4; init: " in swept_table  # its settings
    # the words of a synthetic statement alone tell nothing: each is written once entailed and once refuted
    assert "| synth | mate | 1: 0." in swept_table and "0.500 (statement only)" in swept_table, swept_table
    # its table and pack beside the recipes', for gpu_run.sh
    gathered = out / "learn_synth_model.optimizer.lr_1e-4.md"
    assert gathered.read_text(encoding="utf-8") == swept_table
    assert (out / "learn_runs_synth_model.optimizer.lr_1e-4.tar.gz").is_file()
    assert "up to 2 at a time" in (out / "learn.md").read_text(encoding="utf-8")  # one lane here, one beside
    lines = first.stdout.splitlines()
    assert lines.index("learn: sqa_mate_s1: exit 0 (" + str(out / "sqa_mate_s1.log") + ")") < next(
        number for number, line in enumerate(lines) if line.startswith("learn: wtq1024_mate_s1: exit 0")
    ), first.stdout
    waits = learn(out, "wtq1024", seeds="2")  # its source is not in this call: nothing to wait for
    assert "learn: wtq1024_mate_s2: not started (waits for sqa_mate_s2 to complete)" in waits.stdout, waits.stdout
    assert not (out / "wtq1024_mate_s2").exists()

    (out / "tabfact_mate_s1" / "metrics.json").unlink()  # as if the budget had ended it after a checkpoint
    again = learn(out, "sqa wtq1024 tabfact")
    assert "learn: tabfact_mate_s1: exit 0 (resumed)" in again.stdout and "sqa_mate_s1" not in again.stdout
    assert "wtq1024_mate_s1" not in again.stdout, again.stdout  # complete: not trained again
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
    # the same weights, the other decoding: each run's final validation logged it
    at_least_one = {task: rows[task].split("|")[7].strip() for task in rows}
    for task in ("sqa", "wtq1024"):
        final = json.loads((out / f"{task}_mate_s1" / "metrics.json").read_text(encoding="utf-8"))
        assert at_least_one[task] == f"1: {final['val/accuracy_at_least_one_cell']:.3f}", table
    assert at_least_one["tabfact"] == "-", table
    assert "Runs of data: the bundled samples; hardware: cpu; args: trainer.max_steps=2" in table, table
    questions = table.split("Q1 / Q2 / Q3 / one cell / several (")[1]  # SQA's runs only: the others have no sequences
    assert "wtq" not in questions and "tabfact" not in questions, table
    sqa = json.loads((out / "sqa_mate_s1" / "metrics.json").read_text(encoding="utf-8"))
    keys = ["val/accuracy_q1", "val/accuracy_q2", "val/accuracy_q3"]
    keys += ["val/accuracy_single_cell_answers", "val/accuracy_multi_cell_answers"]
    assert "sqa mate seed 1: " + " / ".join(f"{sqa[key]:.3f}" for key in keys) in questions, table
    assert "; init: wtq1024=sqa." in table, table
    with tarfile.open(out / "learn_runs.tar.gz") as pack:
        names = set(pack.getnames())
    assert {"./tabfact_mate_s1/metrics.json", "./tabfact_mate_s1/csv/metrics.csv", "./baseline_wtq/metrics.json",
            "./sqa_mate_s1.log", "./wtq1024_mate_s1/metrics.json", "./sweep_synth_model.optimizer.lr_1e-4.log"} <= names  # fmt: skip
    assert not any(name.endswith(".ckpt") for name in names)

    refused = learn(out, "tabfact", args=TINY.replace("max_steps=2", "max_steps=3"), status=2)  # other settings
    assert "holds runs of other settings" in refused.stderr and refused.stdout == "", refused.stderr
    bad = learn(tmp_path / "chain", "wtq", status=2, init="wtq")  # starts from whose run? refused, no folder made
    assert "LEARN_INIT: 'wtq' is no <task>=" in bad.stderr and not (tmp_path / "chain").exists()
    bad = learn(tmp_path / "lanes", "wtq", status=2, lanes="two")
    assert "LEARN_LANES: 'two' is no number" in bad.stderr and not (tmp_path / "lanes").exists()
    bad = learn(tmp_path / "twice", "wtq", status=2, LEARN_SWEEP="model.optimizer.lr=1e-4 model.optimizer.lr=1e-4")
    assert "would share the folder" in bad.stderr and not (tmp_path / "twice").exists(), bad.stderr
    for entry in ("tabfcat:model.optimizer.lr=1e-4", "tabfact:", "sqa:wtq:model.optimizer.lr=1e-4"):
        bad = learn(tmp_path / "typo", "wtq", status=2, LEARN_SWEEP=entry)
        assert f"'{entry}' is no <tasks>:<override>" in bad.stderr and not (tmp_path / "typo").exists(), bad.stderr


def test_carried_synth_corpora_are_named_in_the_table_chain_and_runs_on_another_are_not_resumed(tmp_path, monkeypatch):
    """Over 20 s: three `mate synthesize` in this process (the samples' training tables), two short `mate train`
    processes, two `mate baseline` and refused calls. A carried corpus (make gpu-synth's LEARN_DATA/synth) says which
    grammar drew it; a second one (LEARN_DATA/synth2) is its own task, here started from the first's run, scored
    against its own statement-only model."""
    monkeypatch.setenv("MATE_CACHE_DIR", str(tmp_path / "cache"))
    corpus, second = tmp_path / "data" / "synth", tmp_path / "data" / "synth2"
    tables = ["dataset.tables=train", "dataset.sources.hybridqa=null"]
    first_stage = ["selects=[first,last]", "max_conditions=0", "orders=false", "refuted=absent_value"]
    lookups = ["selects=[none,first,last]", "max_conditions=1", "orders=false"]
    assert run_captured("synthesize", tables + first_stage, corpus).returncode == 0
    assert run_captured("synthesize", tables + lookups, second).returncode == 0
    out = tmp_path / "learn"
    learn(out, "synth synth2", init="synth2=synth", LEARN_DATA=str(tmp_path / "data"))
    table = (out / "learn.md").read_text()
    rows = {
        line.split("|")[1].strip(): line for line in table.splitlines() if re.match(r"^\| synth\d* \| mate \|", line)
    }
    assert set(rows) == {"synth", "synth2"} and all(" 1: 0." in row for row in rows.values()), table
    assert '; synth: {"max_conditions": 0, "max_rows": 30, "orders": false, "refuted": "absent_value", ' in table, table
    assert '; synth2: {"max_conditions": 1, "max_rows": 30, "orders": false, "refuted": "shuffled_copy", ' in table
    # each corpus scored against its own words-only model (a shuffled copy's words tell nothing)
    for task, root in (("synth", corpus), ("synth2", second)):
        assert yaml.safe_load((out / f"baseline_{task}" / ".hydra" / "config.yaml").read_text())["dataset"]["root"] == (
            str(root)
        )
        only = json.loads((out / f"baseline_{task}" / "metrics.json").read_text())["val/accuracy_statement_only"]
        assert f"{only:.3f} (statement only)" in rows[task], table
    assert "0.500 (statement only)" in rows["synth2"], table
    config = yaml.safe_load((out / "synth2_mate_s1" / "resolved_config.yaml").read_text())
    assert config["dataset"]["root"] == str(second) and config["init_from"] == str(out / "synth_mate_s1")
    # the same folder, the first corpus rewritten by the same grammar from fewer tables (the same settings, other
    # statements): its runs are not resumed on it
    before = (out / "settings.txt").read_text()
    fewer = [*tables, *first_stage, "dataset.sources.sqa=null"]
    assert run_captured("synthesize", fewer, corpus).returncode == 0
    refused = learn(out, "synth synth2", init="synth2=synth", status=2, LEARN_DATA=str(tmp_path / "data"))
    digest = hashlib.sha256((corpus / "tokenized_data" / "train_examples.json").read_bytes()).hexdigest()[:12]
    assert "holds runs of other settings" in refused.stderr and digest not in before, refused.stderr
    assert (out / "settings.txt").read_text() == before
    (corpus / "tokenized_data" / "train_examples.json").unlink()  # a corpus cut short: named, nothing run
    cut = learn(tmp_path / "cut", "synth", init="", status=2, LEARN_DATA=str(tmp_path / "data"))
    assert cut.stderr.count("\n") == 1 and "is no whole mate synthesize corpus" in cut.stderr, cut.stderr
    assert not (tmp_path / "cut").exists()
    # a further corpus is only ever carried: without it, one line naming the make target, nothing run (a sweep's too)
    for tasks, sweep in (("synth3", ""), ("synth2", "synth3:trainer.max_steps=1")):
        missing = learn(
            tmp_path / "missing", tasks, init="", status=2, LEARN_DATA=str(tmp_path / "data"), LEARN_SWEEP=sweep
        )
        assert missing.stderr.count("\n") == 1 and "make gpu-synth SYNTH_NAME=synth3" in missing.stderr, missing.stderr
        assert not (tmp_path / "missing").exists()


def test_two_lanes_train_side_by_side_and_a_time_limits_term_stops_both_with_their_checkpoints(tmp_path):
    """MATE and dense of TabFact in two lanes; once both train, TERM to the script's process group, as `timeout`
    sends it: each run gets one TERM and saves last.ckpt, no process is left, and the table (both runs not complete,
    their minutes marked as a shared device's) and the pack are written; exit 143. About 20 s."""
    out = tmp_path / "learn"
    long = TINY.replace("max_steps=2", "max_steps=1000").replace("val_check_interval=2", "val_check_interval=1000")
    long += " trainer.log_every_n_steps=1 callbacks.progress_log.every_n_seconds=0"  # no validation to stop in
    script = subprocess.Popen(
        ["bash", "tools/learn.sh"], cwd=REPO_ROOT, env=settings(out, "tabfact", long, "", "mate dense", "2", "1"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    logs = [out / f"tabfact_{attention}_s1.log" for attention in ("mate", "dense")]
    try:
        deadline = time.monotonic() + 300
        while not all(log.is_file() and "progress: step" in log.read_text(encoding="utf-8") for log in logs):
            assert script.poll() is None and time.monotonic() < deadline, [log.read_text()[-2000:] for log in logs]
            time.sleep(1)
        os.killpg(script.pid, signal.SIGTERM)
        output, _ = script.communicate(timeout=180)
    finally:
        if script.poll() is None:
            os.killpg(script.pid, signal.SIGKILL)
        left = subprocess.run(["pkill", "-KILL", "-f", str(out)], capture_output=True).returncode == 0
    assert not left, "a run outlived the script"
    assert script.returncode == 143, output[-3000:]
    for attention in ("mate", "dense"):
        assert f"learn: tabfact_{attention}_s1: stopped by a signal" in output, output[-3000:]
        assert (out / f"tabfact_{attention}_s1" / "checkpoints" / "last.ckpt").is_file()
        assert not (out / f"tabfact_{attention}_s1" / "metrics.json").exists()
    spans = {log.name: last_call_span(log) for log in logs}
    (mate, dense) = spans.values()
    assert mate[0] < dense[1] and dense[0] < mate[1], spans  # at the same time
    table = (out / "learn.md").read_text(encoding="utf-8")
    rows = [line for line in table.splitlines() if line.startswith("| tabfact | ")]
    assert len(rows) == 2 and all("(not complete)" in row and row.split("|")[-2].strip().endswith("*") for row in rows)
    assert "up to 2 at a time" in table, table
    with tarfile.open(out / "learn_runs.tar.gz") as pack:
        assert "./tabfact_dense_s1/csv/metrics.csv" in pack.getnames()


def last_call_span(log) -> tuple[str, str]:
    """The first and last log time of the last `mate train` call appended to a run's log."""
    call = log.read_text(encoding="utf-8").split("overrides: ")[-1]
    times = re.findall(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\]", call, flags=re.MULTILINE)
    assert len(times) >= 2, call[-2000:]
    return times[0], times[-1]
