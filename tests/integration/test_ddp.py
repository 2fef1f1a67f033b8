"""`mate train hardware=ddp_cpu`: 2 processes (gloo) started through `mate` itself.

Lightning's DDP launcher re-executes the command line for rank 1 (`mate train <same
overrides> hydra.run.dir=<this run>`); validation metrics reduced across the ranks
must equal a single-process `mate eval` of the same checkpoint, and rank 0 alone
writes the logs and metrics. Also: the GPU profiles fail in one line without a GPU.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from mate_cli.data.sampler import each_example_once
from tests.helpers import MATE, mate_env, one_error_line, run_mate
from tests.inprocess import run_command

#: 11 questions per split: an odd validation split, which a padding DistributedSampler
#: would fill up with a repeated example (and so change Hits@k)
DDP_RUN = [
    "experiment=hybridqa_mate",
    "hardware=ddp_cpu",
    "dataset.max_length=128",
    "dataset.limit_questions=11",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=2",
]


@pytest.fixture(scope="module")
def ddp_run(module_tmp):
    """Over 20 s: a real two-process DDP run."""
    tmp = module_tmp("ddp")
    env = mate_env(tmp / "outputs", tmp / "cache", HOME=str(tmp / "home"))
    proc = run_mate(["train", *DDP_RUN], env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = list((tmp / "outputs" / "train").iterdir())
    assert len(runs) == 1, f"rank 1 must run in rank 0's run dir: {runs}"
    return tmp, env, runs[0], proc


def test_rank_1_reruns_mate_train_into_the_same_run_dir(ddp_run):
    _, _, run, proc = ddp_run
    assert (run / "train.log").is_file()
    child_log = run / "train_ddp_process_1.log"  # Lightning's hydra.job.name for rank 1
    assert child_log.is_file() and "validation split" in child_log.read_text()
    overrides = (run / ".hydra" / "overrides.yaml").read_text()  # rank 0's, not rewritten by rank 1
    assert "hydra.run.dir" not in overrides and "hardware=ddp_cpu" in overrides


def test_ddp_validation_equals_single_process_eval(ddp_run):
    """Hits@k exactly (counts of the same 11 questions), the loss to float precision."""
    tmp, _, run, _ = ddp_run
    train = json.loads((run / "metrics.json").read_text())
    assert "/best-" in train["best_checkpoint"], "validation during fit (under DDP) picks the best checkpoint"
    assert train["data/validation/questions"] == 11
    single = run_command("eval", [f"ckpt_path={train['best_checkpoint']}"], tmp / "eval")  # in this process
    for k in ("val/hits@1", "val/hits@3", "val/hits@5"):
        assert train[k] == single[k], (k, train[k], single[k])
        assert round(train[k] * 11) == pytest.approx(train[k] * 11, abs=1e-5), "a share of the 11 questions"
    assert train["val/loss"] == pytest.approx(single["val/loss"], abs=1e-6)


def test_rank_0_alone_prints_and_writes_logs(ddp_run):
    _, _, run, proc = ddp_run
    out = proc.stdout
    assert out.count("best checkpoint:") == 1 and out.count("final validation") == 1
    assert out.count("overrides: ") == 1
    assert sum(line.startswith("run dir:") for line in out.splitlines()) == 2, "once at the start, once at the end"
    assert len(list((run / "wandb").glob("offline-run-*"))) == 1, "one W&B run"
    rows = list(csv.DictReader((run / "csv" / "metrics.csv").open()))
    values = [tuple(sorted((k, v) for k, v in row.items() if v)) for row in rows]
    assert len(values) == len(set(values)), "a row written twice"
    assert sum(1 for row in rows if row.get("data/validation/questions")) == 1, "the final metrics, once"
    assert sum(1 for row in rows if row.get("val/hits@1")) == 3, "fit, final validate, final metrics"


def test_sigterm_to_the_group_is_one_line_from_rank_0_and_a_second_one_ends_a_stuck_run(ddp_run):
    """SIGTERM to the run's process group (a scheduler's time limit): one line, rank 0's, in FAILED and on screen, with
    the step to resume from (rank 1, which saves nothing, said "before any checkpoints/last.ckpt was saved" and could
    write that into FAILED after rank 0). Lightning's own SIGTERM handler can leave the ranks waiting in a broadcast
    inside it (at a checkpoint write, often): a second SIGTERM then ends them within ``END_S``.

    Over 20 s: a real two-process DDP run, and real signals.
    """
    from mate_cli.callbacks.interrupts import END_S

    tmp, env, _, _ = ddp_run
    run = tmp / "signalled"
    proc = start_long_run(run, env)
    try:
        wait_for_a_checkpoint(run, proc)
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            started = time.monotonic()
            _, err = proc.communicate(timeout=60)
            assert time.monotonic() - started < END_S + 20  # the ranks' pipes close after rank 0 ends
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    line = one_error_line(subprocess.CompletedProcess(proc.args, proc.returncode, "", err), 143,
                          "mate: interrupted by SIGTERM at step ")  # fmt: skip
    assert line.endswith(f"; resume with ckpt_path={run}") and (run / "FAILED").read_text().strip() == line, line


def start_long_run(run, env) -> subprocess.Popen:
    """``mate train`` of DDP_RUN for 100 steps, last.ckpt at each, no validation, in a process group of its own."""
    args = [*DDP_RUN, "trainer.max_epochs=100", "trainer.max_steps=100", "trainer.check_val_every_n_epoch=100",
            "callbacks.model_checkpoint.every_n_train_steps=1", "logger=csv", f"hydra.run.dir={run}"]  # fmt: skip
    return subprocess.Popen([MATE, "train", *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip


def wait_for_a_checkpoint(run: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while not (run / "checkpoints" / "last.ckpt").is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1][-3000:]


def test_a_rank_killed_mid_training_is_one_line_naming_it_with_the_step_to_resume_from(ddp_run):
    """``kill -9`` of rank 1 (the OOM killer's way): rank 0 stops with one line naming the lost rank and, in FAILED
    too, ``ckpt_path=<run dir>`` and the step its last.ckpt holds; exit 137, as the lost rank's. Lightning killed rank
    0 with SIGKILL when it saw the lost rank first (no FAILED), or rank 0 ended in gloo's traceback.

    Over 20 s: a real two-process DDP run, and a real kill.
    """
    tmp, env, _, _ = ddp_run  # its preprocessing cache: training starts at once
    run = tmp / "killed"
    proc = start_long_run(run, env)
    try:
        wait_for_a_checkpoint(run, proc)
        (rank_1,) = [
            pid for pid in children(proc.pid) if b"train_ddp_process_1" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        os.kill(rank_1, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    line = one_error_line(subprocess.CompletedProcess(proc.args, proc.returncode, "", err), 137,
                          f"mate: DDP rank 1 (pid {rank_1}) was killed by SIGKILL at step ")  # fmt: skip
    assert line.endswith(f"; resume with ckpt_path={run}"), line
    assert (run / "FAILED").read_text().strip() == line
    held = re.search(r"holds step (\d+)", line) or re.search(r" at step (\d+)", line)
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == int(held[1])


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError):
            if entry.name.isdigit() and (entry / "stat").read_text().rsplit(")", 1)[1].split()[1] == str(pid):
                found.append(int(entry.name))
    return found


def test_each_example_once_splits_an_odd_split_without_repeats():
    loader = DataLoader(list(range(11)), batch_size=4)
    seen = [x for rank in range(2) for batch in each_example_once(loader, 2, rank) for x in batch.tolist()]
    assert sorted(seen) == list(range(11))
    assert each_example_once(loader, 1, 0) is loader


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
@pytest.mark.parametrize("profile", ["gpu", "ddp"])
def test_gpu_profile_without_gpu_is_one_line(profile, tmp_path):
    """The check `run_task` makes before any task starts, on the composed config (the entry
    point's one line and exit 2 for a `MateError` there: test_cli's entry point tests)."""
    from mate_cli.run.job import check_accelerator
    from mate_cli.errors import MateError
    from tests.inprocess import compose_command

    cfg = compose_command("train", [f"hardware={profile}"], tmp_path / "run", checked=True)
    with pytest.raises(MateError) as err:
        check_accelerator(cfg)
    line = str(err.value)
    assert line.startswith(f"hardware={profile} ") and "\n" not in line and "hardware=cpu" in line, line


def test_ddp_in_a_local_sweep_is_one_line(tmp_path):
    """Each rank would start the whole sweep again: refused before training.

    A real process: the launcher's check of the whole command line.
    """
    args = ["train", "-m", *DDP_RUN, "seed=1,2", "logger=csv"]
    proc = run_mate(args, mate_env(tmp_path / "outputs", tmp_path / "cache"), timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("mate: error: hardware=ddp_cpu starts one process")
