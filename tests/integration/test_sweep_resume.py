"""A sweep run again into its ``hydra.sweep.dir=`` continues it.

- 2 attentions x 2 seeds under joblib, two jobs at a time, the process group signalled (SIGTERM, as a time limit or
  Ctrl-C reaches it) during the third job's second batch, then the same command again: the finished jobs' files are
  untouched, the cut job resumes from its step, the fourth trains, and both end as their commands run whole.
  The sweep's process, its joblib workers and their signals are the point: real processes.
- A changed sweep is refused in one line naming the change.
- The same under submitit (one job cut by its own signal), and an Optuna search run again with its storage.
- ``trainer.max_time`` as each call's budget. Stages: test_sweep_stages.py.
"""

from __future__ import annotations

import hashlib
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import MATE, REPO_ROOT, jobs_of, mate_env, run_mate
from tests.inprocess import main_before_hydra, run_command

TINY = ["trainer.max_steps=4", "dataset.max_length=128", "dataset.eval_batch_size=16", "trainer.limit_val_batches=1",
        "logger=csv"]  # fmt: skip
SWEPT = ["attention=mate,dense", "seed=1,2"]
JOBLIB = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
#: the third job (attention=dense seed=1) signals its process group as its second batch starts; a resumed run does not
SIGNAL = ["+callbacks.signal_job._target_=tests.signal_at.SignalJobAt", "+callbacks.signal_job.job=2",
          "+callbacks.signal_job.batch=1"]  # fmt: skip
SWEEP = ["train", "-m", "experiment=hybridqa_mate", *TINY, *SWEPT, *SIGNAL]


def files_of(folder: Path) -> dict[str, tuple[str, int]]:
    """Each checkpoint and metrics file under ``folder``: its sha256 and mtime."""
    return {
        str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and (p.suffix == ".ckpt" or p.name == "metrics.json")
    }


@pytest.fixture(scope="module")
def cut_and_continued(module_tmp) -> dict:
    """Over 60 s: the sweep cut by SIGTERM, then run again; and the cut jobs' uncut reference runs."""
    base = module_tmp("sweep_resume")
    env = mate_env(base / "out", base / "cache", PYTHONPATH=str(REPO_ROOT))  # the jobs import tests.signal_at
    folder = base / "sweep"
    args = [*SWEEP, *JOBLIB, f"hydra.sweep.dir={folder}"]
    cut = subprocess.run([MATE, *args], env=env, capture_output=True, text=True, timeout=900, start_new_session=True)
    jobs = jobs_of(folder)
    found = {"cut": cut, "jobs": jobs, "folder": folder, "env": env}
    found["after_cut"] = {job.name: sorted(p.name for p in job.iterdir()) for job in jobs}
    found["failed"] = {job.name: (job / "FAILED").read_text() for job in jobs if (job / "FAILED").is_file()}
    found["finished_files"] = {job.name: files_of(job) for job in jobs if (job / "metrics.json").is_file()}
    found["again"] = run_mate(args, env, timeout=900)
    for seed in (1, 2):  # the commands of the two jobs the signal cut (attention=dense), each run whole
        found[f"reference{seed}"] = run_mate(
            ["train", "experiment=hybridqa_mate", *TINY, "attention=dense", f"seed={seed}",
             f"hydra.run.dir={base / f'reference{seed}'}"], env
        )  # fmt: skip
        found[f"reference{seed}_dir"] = base / f"reference{seed}"
    return found


def test_a_sweep_cut_by_sigterm_stops_in_one_line_with_its_third_job_checkpointed(cut_and_continued):
    cut, jobs = cut_and_continued["cut"], cut_and_continued["jobs"]
    assert cut.returncode == 128 + signal.SIGTERM, cut.stderr[-3000:]
    assert cut.stderr.strip().splitlines()[-1] == (
        f"mate: the sweep in {cut_and_continued['folder']} was stopped by SIGTERM: its finished jobs are kept, the cut "
        "ones saved their last.ckpt; run the same command again to continue it"
    )
    assert len(jobs) == 4
    after = cut_and_continued["after_cut"]
    assert all("metrics.json" in after[job.name] for job in jobs[:2]), after
    third = jobs[2].name
    assert "metrics.json" not in after[third] and "checkpoints" in after[third], after
    assert re.search(r"interrupted by SIGTERM at step [1-9]", cut_and_continued["failed"][third])
    assert (jobs[2] / "checkpoints" / "last.ckpt").is_file()


def test_run_again_it_keeps_the_finished_jobs_resumes_the_cut_one_and_trains_the_rest(cut_and_continued):
    again, jobs = cut_and_continued["again"], cut_and_continued["jobs"]
    assert again.returncode == 0, again.stderr[-3000:]
    assert jobs_of(cut_and_continued["folder"]) == jobs  # the same job folders, no new ones
    for name, files in cut_and_continued["finished_files"].items():  # done earlier: not trained again
        assert files_of(cut_and_continued["folder"] / name) == files, name
    for job in jobs:
        assert (job / "metrics.json").is_file() and not (job / "FAILED").exists(), job.name
    third = json.loads((jobs[2] / "metrics.json").read_text())
    assert third["resumed_from"] == str(jobs[2] / "checkpoints" / "last.ckpt")
    # the fourth, running beside the third, was signalled too: resumed if it had saved a last.ckpt, else started again
    fourth = json.loads((jobs[3] / "metrics.json").read_text())
    assert ("checkpoints" in cut_and_continued["after_cut"][jobs[3].name]) == ("resumed_from" in fourth)


def test_the_jobs_the_signal_cut_end_as_the_same_jobs_uncut(cut_and_continued):
    """The third job (resumed from its step) and the fourth (resumed, or started again where it had saved nothing)
    end with the metrics of their commands run whole; the first two were not trained again."""
    for seed, job in ((1, cut_and_continued["jobs"][2]), (2, cut_and_continued["jobs"][3])):
        reference = cut_and_continued[f"reference{seed}"]
        assert reference.returncode == 0, reference.stderr[-3000:]
        uncut = json.loads((cut_and_continued[f"reference{seed}_dir"] / "metrics.json").read_text())
        resumed = json.loads((job / "metrics.json").read_text())
        compared = [k for k in uncut if k.startswith(("val/", "train/loss"))]
        assert compared and {k: resumed[k] for k in compared} == pytest.approx(
            {k: uncut[k] for k in compared}, rel=1e-5
        )


def test_a_changed_sweep_in_the_same_folder_is_refused_naming_the_change(cut_and_continued, capsys, monkeypatch):
    folder = cut_and_continued["folder"]
    args = [*SWEEP[: -len(SIGNAL) - 1], "seed=1,3", *SIGNAL, *JOBLIB, f"hydra.sweep.dir={folder}"]
    code, _, err = main_before_hydra(args, capsys, monkeypatch)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    changed = "with other settings (seed=1,3 was seed=1,2)"
    assert f"hydra.sweep.dir={folder} holds a sweep of `mate train -m` {changed}" in err


def test_a_second_call_while_the_sweep_runs_is_refused_before_any_job_starts(cut_and_continued, capsys, monkeypatch):
    """Two calls at once never train one job twice: the sweep's folder is held by the first (here a process holding
    its lock as a running sweep does)."""
    folder = cut_and_continued["folder"]
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
         "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)", str(folder / ".mate.lock")],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        code, _, err = main_before_hydra([*SWEEP, *JOBLIB, f"hydra.sweep.dir={folder}"], capsys, monkeypatch)
    finally:
        holder.kill()
        holder.wait()
    assert code == 2 and f"sweep dir {folder} is in use by another mate process" in err, err


def test_max_time_is_each_calls_budget_a_run_it_cut_goes_on_and_the_minutes_add_up(tmp_path, caplog):
    """In process, about 15 s: a one-second budget cuts the run at a batch end with last.ckpt and no metrics.json;
    the same run resumed without a budget finishes, its time/fit_minutes counting both calls."""
    run = tmp_path / "run"
    tiny = ["experiment=hybridqa_mate", "dataset.max_length=128", "trainer.max_steps=12", "logger=csv",
            "validate_best=false", "trainer.limit_val_batches=1", "trainer.val_check_interval=12",
            "trainer.check_val_every_n_epoch=null"]  # fmt: skip
    assert run_command("train", [*tiny, "trainer.max_time=00:00:00:01"], run) == {}
    assert not (run / "metrics.json").exists() and (run / "checkpoints" / "last.ckpt").is_file()
    spent = [r.getMessage() for r in caplog.records if "trainer.max_time=00:00:00:01:" in r.getMessage()]
    assert spent and re.search(r"this call's training time is spent at step [1-9]\d*; checkpoints/last.ckpt", spent[0])
    step = int(re.search(r"at step (\d+)", spent[0])[1])
    assert step < 12
    metrics = run_command("train", [*tiny, f"ckpt_path={run}"], run)
    assert metrics["resumed_from"] == str(run / "checkpoints" / "last.ckpt")
    assert metrics["time/fit_minutes"] > 1 / 60  # the first call's second, and the second call's


def test_under_submitit_a_job_cut_by_its_own_signal_is_named_and_resumed_by_the_next_call(tmp_path):
    """Over 60 s: two jobs in their own processes (hydra/launcher=submitit_local); the second is sent SIGTERM alone,
    as a scheduler pre-empts one job: the sweep ends naming it, exit 1; the same command again leaves the first
    job's files as they were and resumes the second from its step."""
    env = mate_env(tmp_path / "out", tmp_path / "cache", PYTHONPATH=str(REPO_ROOT))
    folder = tmp_path / "sweep"
    alone = [
        *SIGNAL[:1],
        "+callbacks.signal_job.job=1",
        "+callbacks.signal_job.batch=1",
        "+callbacks.signal_job.group=false",
    ]
    args = ["train", "-m", "experiment=hybridqa_mate", *TINY, "seed=1,2", *alone, "hydra/launcher=submitit_local",
            f"hydra.sweep.dir={folder}"]  # fmt: skip
    cut = run_mate(args, env, timeout=900)
    assert cut.returncode == 1, cut.stderr[-3000:]
    assert re.fullmatch(
        rf"mate: the sweep in {re.escape(str(folder))}: 1 of 2 jobs did not finish \(job 1: interrupted by SIGTERM at "
        r"step [1-9]\); run the same command again to continue it",
        cut.stderr.strip().splitlines()[-1],
    ), cut.stderr[-2000:]
    first, second = jobs_of(folder)
    kept = files_of(first)
    assert (second / "checkpoints" / "last.ckpt").is_file() and not (second / "metrics.json").exists()
    again = run_mate(args, env, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert files_of(first) == kept
    assert json.loads((second / "metrics.json").read_text())["resumed_from"] == str(
        second / "checkpoints" / "last.ckpt"
    )


def test_an_optuna_search_run_again_with_its_storage_resumes_its_cut_trial_and_asks_for_no_more(tmp_path):
    """Over 40 s: a two-trial search (the basic launcher) whose second trial is stopped by SIGTERM, run again with
    the same storage and sweep dir: the first trial is not trained again, the second resumes in its folder and its
    result goes to the study, and no third trial is asked for."""
    import optuna

    env = mate_env(tmp_path / "out", tmp_path / "cache", PYTHONPATH=str(REPO_ROOT))
    folder, storage = tmp_path / "sweep", f"sqlite:///{tmp_path / 'study.db'}"
    alone = [
        *SIGNAL[:1],
        "+callbacks.signal_job.job=1",
        "+callbacks.signal_job.batch=1",
        "+callbacks.signal_job.group=false",
    ]
    args = ["train", "-m", "experiment=hybridqa_mate", "hparams_search=optuna", "hydra.sweeper.n_trials=2",
            f"hydra.sweeper.storage={storage}", *TINY, *alone, f"hydra.sweep.dir={folder}"]  # fmt: skip
    cut = run_mate(args, env, timeout=900)
    assert cut.returncode == 128 + signal.SIGTERM, cut.stderr[-3000:]
    first, second = jobs_of(folder)
    kept = files_of(first)
    again = run_mate(args, env, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert jobs_of(folder) == [first, second] and files_of(first) == kept
    resumed = json.loads((second / "metrics.json").read_text())
    assert resumed["resumed_from"] == str(second / "checkpoints" / "last.ckpt")
    trials = optuna.load_study(study_name="hybridqa_mate", storage=storage).trials
    assert [(t.number, t.state.name) for t in trials] == [(0, "COMPLETE"), (1, "COMPLETE")]
    assert trials[1].value == pytest.approx(resumed["val/hits@1"])
