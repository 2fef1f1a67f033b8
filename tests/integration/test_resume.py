"""Crash and resume, for real: one `mate train` (and one `mate pretrain`) chain of
subprocesses, each with two loader workers (which draw an epoch's first indices before a
resumed run knows its position). The first is stopped with SIGTERM to its process
group right after it wrote a checkpoint (it saves its own last.ckpt at the step it reached
and exits 143); it is resumed with the
``ckpt_path=<run dir>`` its FAILED names, and that run is killed with SIGKILL right after
its own first checkpoint; it is resumed with ``ckpt_path=last``. The chain must end where an
uninterrupted run of the same seed ends: same step, same weights, same validation metrics,
one W&B run, one CSV log. The epoch is 5 batches: the SIGTERM comes in epoch 0, the SIGKILL
in epoch 1, so both resumptions start mid-epoch and the first crosses an epoch's end (and its
validation). Neither stop falls on an epoch's last batch: see docs/runs.md on resuming."""

from __future__ import annotations

import csv
import json
import re
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests.helpers import MATE, mate_env, run_mate, wandb_run_summary

#: both loggers: the resumed runs continue the first run's W&B run and CSV log. The metrics
#: compared are the validation at step 10 (the end of epoch 1), not the best checkpoint's: a
#: resumed run chooses its best among its own validations (see docs/runs.md on resuming).
ARGS = [
    "train",
    "experiment=hybridqa_mate",
    "seed=3",
    "dataset.max_length=128",
    "dataset.limit_questions=20",
    "trainer.log_every_n_steps=1",
    "trainer.max_steps=10",
    "callbacks.model_checkpoint.every_n_train_steps=3",
    "validate_best=false",
]
#: masked-LM pre-training: its masks are drawn per (seed, epoch, example), so they resume too
PRETRAIN_ARGS = [
    "pretrain",
    "seed=3",
    "logger=csv",
    "dataset.batch_size=4",
    "dataset.max_length=64",
    "dataset.eval_masks=1",
    "trainer.max_steps=12",
    "trainer.log_every_n_steps=1",
    "trainer.val_check_interval=6",
    # no checkpoint at step 6: the kill right after one would come before that step's validation, which a resume
    # does not run again (docs/runs.md, "Resuming": the first limit)
    "callbacks.model_checkpoint.every_n_train_steps=4",
]
#: the validation metrics each command's resumed run must reproduce exactly
METRICS = {
    "train": ("val/loss", "val/hits@1", "val/hits@3", "val/hits@5"),
    "pretrain": ("val/mlm_loss", "val/mlm_accuracy", "start/val/mlm_loss"),
}  # start/*: kept in the checkpoint


def max_steps(args: list[str]) -> int:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith("trainer.max_steps=")]
    return int(value)


def state(ckpt: Path) -> tuple[int, dict]:
    data = torch.load(ckpt, map_location="cpu", weights_only=True)
    return data["global_step"], data["state_dict"]


def stop_after_first_checkpoint(
    args: list[str], env: dict, runs: Path, signum: int, known: set[Path], group: bool = False
) -> tuple[Path, str, int]:
    """Start ``mate <args>``, send ``signum`` once its run dir (the one under ``runs`` not in
    ``known``) holds a checkpoint (``group``: to its whole process group, as Ctrl-C in a
    terminal, ``timeout`` and a cluster's time limit do); its run dir, stderr and exit status."""
    victim = subprocess.Popen(
        [MATE, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=group
    )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and victim.poll() is None:
        if [p for p in runs.glob("*/checkpoints/last.ckpt") if p.parents[1] not in known]:
            if group:
                os.killpg(victim.pid, signum)
            else:
                victim.send_signal(signum)
            break
        time.sleep(0.02)
    _, err = victim.communicate(timeout=120)
    (run,) = set(runs.iterdir()) - known
    assert (run / "checkpoints" / "last.ckpt").is_file(), f"exit status {victim.returncode}: {err[-3000:]}"
    step, _ = state(run / "checkpoints" / "last.ckpt")
    assert 0 < step < max_steps(args), f"the run ended before it could be stopped: {err[-3000:]}"
    assert not [p for p in run.rglob("*.tmp")], "a temp file was left next to the checkpoint"
    return run, err, victim.returncode


def crash_and_resume(base: Path, args: list[str]) -> dict:
    """An uninterrupted run beside the chain: SIGTERM, resume from the run dir, SIGKILL,
    resume with ``last``."""
    import wandb

    # as after an in-process W&B test in this worker: this process's W&B service is named in its
    # environment, and the chain's processes must not share it (helpers.mate_env leaves it out)
    wandb.setup().ensure_service()
    task, cache, runs = args[0], base / "cache", base / "chain" / args[0]
    args = [*args, "dataset.num_workers=2"]  # every run alike: workers draw from torch's RNG as their iterator starts
    whole = subprocess.Popen(
        [MATE, *args], env=mate_env(base / "whole", cache), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    env = mate_env(base / "chain", cache)
    runs.mkdir(parents=True)

    # SIGTERM to the process group, its two loader workers too: the run finishes its batch, saves
    # last.ckpt at that step, says how to resume, exits 128 + 15, and its log records that status
    termed, err, status = stop_after_first_checkpoint(args, env, runs, signal.SIGTERM, set(), group=True)
    assert status == 143, err[-3000:]
    line = (termed / "FAILED").read_text().strip()
    assert line.startswith("mate: interrupted by SIGTERM at step ") and line in err, line
    assert [x for x in err.strip().splitlines() if x.startswith("mate:")] == [line], err[-3000:]
    assert "Traceback" not in err and "exited unexpectedly" not in err, err[-3000:]
    assert f"{line} (exit status 143)" in (termed / f"{task}.log").read_text()
    # "at step N; resume ...", or in a validation "at step N during a validation (checkpoints/last.ckpt holds step M)"
    step = int(
        re.search(r"holds step (\d+)", line)[1] if "holds step" in line else re.search(r" at step (\d+)", line)[1]
    )
    assert state(termed / "checkpoints" / "last.ckpt")[0] == step, "last.ckpt is not the step FAILED names"
    resume_from = line.rsplit("ckpt_path=", 1)[1]
    assert Path(resume_from) == termed

    killed, err, status = stop_after_first_checkpoint(
        [*args, f"ckpt_path={resume_from}"], env, runs, signal.SIGKILL, {termed}
    )
    assert status == -signal.SIGKILL, err[-3000:]
    resumed = run_mate([*args, "ckpt_path=last"], env)  # the newest run of the experiment: the killed one
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _, err = whole.communicate(timeout=600)
    assert whole.returncode == 0, err[-3000:]
    (final,) = set(runs.iterdir()) - {termed, killed}
    (whole_run,) = (base / "whole" / task).iterdir()
    return {
        "task": task,
        "whole": whole_run,
        "termed": termed,
        "killed": killed,
        "resumed": final,
        "output": resumed.stdout + resumed.stderr,
        "steps": max_steps(args),
    }


# the pre-training chain is slow-marked (two more minutes on 2 cores); its own part, masks keyed by
# (seed, epoch, example) and the tagged sampler's skip, is tested fast in tests/data/test_pretraining.py
@pytest.fixture(
    scope="module", params=[ARGS, pytest.param(PRETRAIN_ARGS, marks=pytest.mark.slow)], ids=lambda args: args[0]
)
def runs(request, module_tmp) -> dict:
    """Over 20 s: real processes, stopped and resumed twice, and an uninterrupted run beside them."""
    return crash_and_resume(module_tmp(f"resume-{request.param[0]}"), request.param)


def test_each_stop_leaves_last_ckpt_mid_epoch(runs):
    """Both resumptions start inside an epoch (the skip of the examples already seen runs),
    the second one in a later epoch than the first."""
    epochs = []
    for run in (runs["termed"], runs["killed"]):
        position = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["mate_resume"]
        assert position["examples_this_epoch"] > 0
        epochs.append(position["epoch"])
    assert epochs[0] == 0 and (epochs[1] > 0 or runs["task"] == "pretrain"), epochs


def test_resumed_run_ends_at_the_same_step_with_the_same_weights(runs):
    step_whole, weights_whole = state(runs["whole"] / "checkpoints" / "last.ckpt")
    step_resumed, weights_resumed = state(runs["resumed"] / "checkpoints" / "last.ckpt")
    assert step_whole == step_resumed == runs["steps"]
    assert weights_whole.keys() == weights_resumed.keys()
    worst = max((weights_whole[k].float() - weights_resumed[k].float()).abs().max().item() for k in weights_whole)
    assert worst == 0.0, f"weights differ by up to {worst}"


def test_resumed_run_reports_the_same_validation_metrics(runs):
    whole = json.loads((runs["whole"] / "metrics.json").read_text())
    resumed = json.loads((runs["resumed"] / "metrics.json").read_text())
    assert resumed["resumed_from"] == str(runs["killed"] / "checkpoints" / "last.ckpt")
    killed = OmegaConf.load(runs["killed"] / "resolved_config.yaml")
    assert killed.ckpt_path == str(runs["termed"]), "the run dir the FAILED line names"
    for key in METRICS[runs["task"]]:
        assert resumed[key] == whole[key], key


def test_ckpt_path_last_finds_the_newest_run_of_the_experiment(runs, tmp_path):
    if runs["task"] != "train":
        pytest.skip("the train chain is enough: it is the same function for every command")
    from mate_cli.errors import MateError
    from mate_cli.run.resume import resolve_resume_path

    root = runs["killed"].parent  # the chain's three runs (the last resumption is the newest)
    assert resolve_resume_path("last", root, "hybridqa_mate") == str(runs["resumed"] / "checkpoints" / "last.ckpt")
    with pytest.raises(MateError, match="ckpt_path=last"):
        resolve_resume_path("last", root, "hybridqa_tapas")
    with pytest.raises(MateError, match="no checkpoint"):
        resolve_resume_path(str(tmp_path / "absent.ckpt"), root, "hybridqa_mate")


def test_resumed_runs_continue_the_first_runs_wandb_run(runs):
    if runs["task"] != "train":
        pytest.skip("the pre-training case logs to CSV only")
    # the first run's id as it was drawn at its start (kill -9 may come before W&B's own
    # process has written its run record: what W&B had not flushed is lost with it)
    first_id = OmegaConf.load(runs["termed"] / "resolved_config.yaml").logger.wandb.id
    files = [next(runs[name].glob("wandb/offline-run-*/run-*.wandb")) for name in ("termed", "killed", "resumed")]
    assert {f.name for f in files} == {f"run-{first_id}.wandb"}  # `wandb sync` of the folders makes one W&B run
    resumed = files[-1]
    assert wandb_run_summary(resumed)["run_id"] == first_id
    (whole,) = runs["whole"].glob("wandb/offline-run-*/run-*.wandb")
    assert wandb_run_summary(whole)["run_id"] != wandb_run_summary(resumed)["run_id"]


def test_resumed_runs_csv_log_reads_as_the_uninterrupted_runs(runs):
    def rows(run: Path) -> list[tuple]:
        with open(run / "csv" / "metrics.csv", newline="") as handle:
            return [tuple(sorted((k, v) for k, v in row.items()
                                 if v and k.startswith(("train/", "val/", "start/", "step", "epoch"))))
                    for row in csv.DictReader(handle)]  # fmt: skip

    whole, resumed = rows(runs["whole"]), rows(runs["resumed"])
    assert [r for r in whole if len(r) > 2] == [r for r in resumed if len(r) > 2]
    steps = [int(dict(r)["step"]) for r in resumed if any(k == "train/loss" for k, _ in r)]
    assert steps == sorted(steps) and steps[0] < 3, "the log starts before the checkpoint it resumed from"


def test_resume_says_what_it_restores_instead_of_lightnings_warning(runs):
    assert "position in the epoch are restored" in runs["output"]
    assert "not resumable" not in runs["output"]


def test_ckpt_path_last_takes_the_run_that_started_last_and_refuses_one_still_running(tmp_path):
    """By when each run started (an absolute time), not the local time in its dir name: a run started under another
    time zone sorts by when it ran. The newest run still running, or without last.ckpt yet, is refused in one line
    naming the one before it; the run that asks (this_run) is never its own candidate."""
    from mate_cli.errors import MateError
    from mate_cli.run.resume import resolve_resume_path

    def run(name: str, started: int, ckpt: bool = True) -> Path:
        folder = tmp_path / f"{name}-tabfact_mate-mate-x"
        (folder / ".hydra").mkdir(parents=True)
        (folder / ".hydra" / "config.yaml").write_text("{}\n")
        os.utime(folder / ".hydra" / "config.yaml", (started, started))
        if ckpt:
            (folder / "checkpoints").mkdir()
            (folder / "checkpoints" / "last.ckpt").write_bytes(b"")
        return folder

    utc = run("2026-01-01_10-00-00", 2_000)  # started later, in UTC
    kiritimati = run("2026-01-02_00-00-00", 1_000)  # UTC+14: its name sorts after, it started before
    assert resolve_resume_path("last", tmp_path, "tabfact_mate") == str(utc / "checkpoints" / "last.ckpt")
    asking = run("2026-01-03_00-00-00", 4_000, ckpt=False)  # the run `ckpt_path=last` starts in
    assert resolve_resume_path("last", tmp_path, "tabfact_mate", this_run=asking).startswith(str(utc))
    fresh = run("2026-01-01_11-00-00", 3_000, ckpt=False)  # newest, no checkpoint yet
    with pytest.raises(MateError) as err:
        resolve_resume_path("last", tmp_path, "tabfact_mate", this_run=asking)
    assert f"{fresh}, has no checkpoints/last.ckpt yet" in str(err.value)
    assert str(err.value).endswith(f"to resume the one before it: ckpt_path={utc}")
    (fresh / "checkpoints").mkdir()
    (fresh / "checkpoints" / "last.ckpt").write_bytes(b"")
    holder = subprocess.Popen(  # another mate process holds it: still running
        [sys.executable, "-c", "import sys, time; from mate_cli.run import lock; lock.take(sys.argv[1]); "
         "print('held', flush=True); time.sleep(60)", str(fresh)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(MateError) as err:
            resolve_resume_path("last", tmp_path, "tabfact_mate", this_run=asking)
        assert f"{fresh}, is still running (pid {holder.pid})" in str(err.value), str(err.value)
        assert str(err.value).endswith(f"ckpt_path={utc}") and kiritimati.is_dir()
    finally:
        holder.kill()
        holder.wait()
