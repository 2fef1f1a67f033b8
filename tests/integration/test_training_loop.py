"""The training loop keeps a GPU busy: between the steps that log, a training step reads no tensor value on the host
(the non-finite guard, the counters, the metrics and the progress stay on the device), and `profile_steps=` and
tools/e2e.sh measure where a step's time goes.

Real parts: `mate train`'s own function on configs Hydra composes in process, the bundled samples and MiniLM, a real
Lightning Trainer (bf16-mixed on the CPU for one task: the GPU's precision plugin), torch's fused AdamW, and the shell
script and make target in subprocesses. On a CPU every read of a tensor value counts (StepProfile's function and
dispatch modes); the same code on a GPU would wait there. MATE's own GPU path (Triton) is watched on a GPU by the e2e
step of tools/gpu_run.sh; on a CPU MATE runs its CPU kernel, whose plan is read on the host by design, so these runs
use dense attention.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from mate_cli.errors import MateError
from mate_cli.callbacks.step_profile import SyncCounter, device_time_us
from tests.helpers import REPO_ROOT
from tests.inprocess import run_command
from tests.shared_runs import RUNS

SMALL = ["attention=dense", "dataset.max_length=128", "dataset.batch_size=4", "logger=csv", "validate_best=false",
         "trainer.limit_val_batches=1", "~callbacks.progress_log"]  # fmt: skip
PROFILED = 3  # steps timed, then as many watched, after the profile's 10 warm-up steps
STEPS = 10 + 2 * PROFILED + 1
#: per task: its experiment and what else its run needs (after SMALL). TabFact under bf16-mixed, as a GPU trains, in
#: batches of 2 x 64 tokens: a CPU without bf16 instructions (AVX2) multiplies bf16 ~37x slower than float32
TASKS = {
    "tabfact": [
        "experiment=tabfact_mate",
        "trainer.precision=bf16-mixed",
        "dataset.max_length=64",
        "dataset.batch_size=2",
        "dataset.eval_batch_size=2",
    ],
    "wtq": ["experiment=wtq_mate"],
    "hybridqa": ["experiment=hybridqa_mate"],
}


@pytest.mark.parametrize("task", sorted(TASKS))
def test_no_training_step_reads_a_tensor_value_between_logging_steps(task, tmp_path):
    run = tmp_path / task
    run_command(
        "train",
        [*SMALL, *TASKS[task], f"trainer.max_steps={STEPS}", f"trainer.val_check_interval={STEPS}",
         "trainer.check_val_every_n_epoch=null", f"profile_steps={PROFILED}",
         f"dataset.cache_dir={tmp_path / 'cache'}"],
        run,
    )  # fmt: skip
    profile = json.loads((run / "step_profile.json").read_text())
    assert profile["steps_watched"] == PROFILED and profile["steps_timed"] == PROFILED, profile
    assert profile["host_syncs_per_step"] == 0 and profile["host_sync_sites"] == {}, profile
    # the logging steps do read (the logged values): the counting was on in this very run
    assert profile["host_syncs_per_logging_step"] > 0, profile
    assert profile["examples_per_s"] > 0 and 0 <= profile["padding_share"] < 1 and profile["warmup_s"] > 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["profile/examples_per_s"] == pytest.approx(profile["examples_per_s"])


def test_a_run_within_the_profiles_warm_up_says_it_timed_nothing(trained, tmp_path, caplog):
    """Two steps against the profile's 10 warm-up steps: no step_profile.json, and it said nothing. On the shared
    TabFact run's data (its preprocessing cache: tests/shared_runs.py)."""
    cache = trained("tabfact").parent / "cache"
    run = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="mate_cli.callbacks.step_profile"):
        run_command("train", [*RUNS["tabfact"][1], "validate_best=false", "trainer.limit_val_batches=1",
                              "profile_steps=1", f"dataset.cache_dir={cache}"], run)  # fmt: skip
    assert (run / "metrics.json").is_file() and not (run / "step_profile.json").exists()
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step profile:")]
    assert line == (
        "step profile: none, no step_profile.json: the run took 2 training step(s), within the profile's 10 warm-up "
        "steps; profile_steps=1 times and watches whole with trainer.max_steps >= 13"
    )


def test_the_counter_sees_each_kind_of_host_read():
    x = torch.tensor([1.0, -2.0, 3.0])
    counter = SyncCounter(torch.device("cpu"))
    counter.start()
    try:
        x.sum().item()
        bool(x.any())
        x.tolist()
        x[x > 0]  # a data-dependent shape
        y = x * 2  # no read
    finally:
        counter.stop()
    here = Path(__file__).name
    assert [site.split(":")[0] for site in counter.sites()] == [here] * 4, counter.sites()
    assert y.shape == x.shape


def test_the_gpu_busy_time_counts_kernels_not_operators_or_annotated_ranges():
    """The GPU-busy share sums the device's own events: a kernel counts; the operator that launched it (whose device
    time is the same kernel's) and a ``record_function`` range on the GPU timeline (the optimiser's step, idle time
    included: it once made the share read 112%) do not."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    def event(name, device_type, **kw):
        return FunctionEvent(0, name, 0, 0, 300, use_device="cuda", device_type=device_type, **kw)

    kernel = event("sm90_gemm", DeviceType.CUDA)
    operator = event("aten::mm", DeviceType.CPU)
    operator.append_kernel("sm90_gemm", 0, 300)
    annotation = event("Optimizer.step#AdamW.step", DeviceType.CUDA, is_user_annotation=True)
    assert kernel.self_device_time_total == 300 and annotation.self_device_time_total == 300
    assert [device_time_us(e) for e in (kernel, operator, annotation)] == [300.0, 0.0, 0.0]


def test_fused_adamw_skips_a_step_flagged_on_the_device():
    """What the non-finite guard relies on: torch's fused AdamW reads ``found_inf`` on the device."""
    weight = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([weight], lr=0.1, fused=True)
    weight.grad = torch.full((3,), float("nan"))
    opt.found_inf = torch.ones(())
    opt.step()
    assert torch.equal(weight.detach(), torch.ones(3)) and int(opt.state[weight]["step"]) == 0
    weight.grad = torch.ones(3)
    opt.found_inf = torch.zeros(())
    opt.step()
    assert not torch.equal(weight.detach(), torch.ones(3)) and int(opt.state[weight]["step"]) == 1


def test_a_non_finite_loss_stops_training_at_the_next_logging_step_naming_its_step(tmp_path):
    # lr 1e30: the first step's update makes the second step's loss NaN; no checkpoint before step 5's log
    with pytest.raises(MateError) as err:
        run_command(
            "train",
            ["experiment=tabfact_mate", *SMALL, "trainer.max_steps=8", "model.optimizer.lr=1e30",
             "trainer.gradient_clip_val=null", "trainer.log_every_n_steps=5", "trainer.val_check_interval=8",
             f"dataset.cache_dir={tmp_path / 'cache'}"],
            tmp_path / "run",
        )  # fmt: skip
    line = str(err.value)
    assert "the training loss is nan at step 2 on the batch of questions " in line, line
    assert "no weights were updated with it; found at step 5, the first check after it" in line, line


def test_the_e2e_script_runs_dense_and_mate_and_tabulates_them(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "E2E_OUT": str(tmp_path / "e2e"), "E2E_HARDWARE": "cpu",
           "E2E_TASKS": "tabfact", "E2E_STEPS": "1",
           "E2E_ARGS": "dataset.max_length=128 dataset.batch_size=4 "
                       f"dataset.cache_dir={tmp_path / 'cache'}"}  # fmt: skip
    done = subprocess.run(["bash", "tools/e2e.sh"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    table = (tmp_path / "e2e" / "e2e.md").read_text()
    rows = {line.split("|")[2].strip(): line for line in table.splitlines() if line.startswith("| tabfact")}
    assert set(rows) == {"dense", "mate"}, table
    assert rows["mate"].rstrip(" |").endswith("x") and "Device cpu; 1 steps timed" in table, table


def test_gpu_data_packs_each_release_and_refuses_without_a_folder(tmp_path):
    releases = tmp_path / "releases"
    releases.mkdir()
    for name, sample in (("tabfact", "tabfact_sample"), ("wtq", "wtq_sample"), ("sqa", "sqa_sample")):
        (releases / name).symlink_to(REPO_ROOT / "data" / sample)
    work = tmp_path / "repo"
    work.mkdir()
    (work / "Makefile").symlink_to(REPO_ROOT / "Makefile")

    def make(*args):  # the make target is the point: no mate process, no Python imports
        return subprocess.run(["make", "-s", "gpu-data", *args], cwd=work, capture_output=True, text=True)

    refused = make()
    assert refused.returncode == 2 and "set GPU_DATA=" in refused.stdout + refused.stderr
    done = make(f"GPU_DATA={releases}")
    assert done.returncode == 0, done.stdout + done.stderr
    archives = sorted(p.name for p in (work / ".whl" / "data").iterdir())
    assert archives == ["sqa.tar.xz", "tabfact.tar.xz", "wtq.tar.xz"]
    with tarfile.open(work / ".whl" / "data" / "wtq.tar.xz") as archive:  # the files themselves, not the link
        assert archive.getmember("wtq/LICENSE").isfile()


def test_gpu_synth_packs_the_synth_tasks_statements_and_refuses_without_a_folder(tmp_path):
    """`mate synthesize` through the make target (on the bundled samples' tables here), packed for tools/gpu_run.sh,
    which unpacks it beside the releases, where the learn step's synth task reads it; SYNTH_NAME=synth2 packs a
    second corpus for the synth2 task. Over 20 s: two `mate synthesize` processes."""
    # the copy links this checkout's venv: brought up to date here first, or make there would reinstall the package
    # from a folder that does not hold it
    subprocess.run(["make", "-s", "install"], cwd=REPO_ROOT, check=True, capture_output=True)
    work = tmp_path / "repo"
    work.mkdir()
    for name in ("Makefile", "pyproject.toml", ".venv"):
        (work / name).symlink_to(REPO_ROOT / name)
    env = {**os.environ, "MATE_CACHE_DIR": str(tmp_path / "cache")}

    def make(*args):
        return subprocess.run(["make", "-s", "gpu-synth", *args], cwd=work, env=env, capture_output=True, text=True)

    refused = make()
    assert refused.returncode == 2 and "set GPU_DATA=" in refused.stdout + refused.stderr
    done = make("SYNTH_SOURCES=dataset=pretrain_sample", "SYNTH_ARGS=statements_per_table=1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in (work / ".whl").iterdir()) == ["data"]  # the run dir is gone
    with tarfile.open(work / ".whl" / "data" / "synth.tar.xz") as archive:
        statements = json.load(archive.extractfile("synth/tokenized_data/train_examples.json"))
        names = set(archive.getnames())
    assert "synth/synthesize.json" in names and "synth/tokenized_data/val_examples.json" in names
    assert {f"synth/data/all_csv/{table}" for table in statements} <= names
    # a second corpus beside it, under its task's name; a name no task has is refused before anything is written
    bad = make("SYNTH_SOURCES=dataset=pretrain_sample", "SYNTH_NAME=lookups")
    assert bad.returncode == 2 and "SYNTH_NAME=lookups is no synth task's name" in bad.stdout + bad.stderr
    done = make("SYNTH_SOURCES=dataset=pretrain_sample", "SYNTH_ARGS=statements_per_table=1 refuted=absent_value",
                "SYNTH_NAME=synth2")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in (work / ".whl" / "data").iterdir()) == ["synth.tar.xz", "synth2.tar.xz"]
    with tarfile.open(work / ".whl" / "data" / "synth2.tar.xz") as archive:
        settings = json.load(archive.extractfile("synth2/synthesize.json"))["settings"]
    assert settings["refuted"] == "absent_value"
