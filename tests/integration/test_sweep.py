"""Real multiruns, read back from their W&B offline run files, and `mate report` of one.

- The heads ablation (`+sweep=heads_ablation`, one seed: 3 jobs), 2 jobs at a time with the
  joblib launcher: each job its own W&B run with its own config, name, group, tags and
  summary, named and tagged by what was swept, with the user's `tags=[dev]` added; then
  `mate report` of the sweep, with plots. The whole sweep and the report run with their own
  empty ``$HOME`` and ``$TMPDIR``, which stay empty: W&B's files go to the jobs' run dirs,
  matplotlib's and torch's compiler cache to mate's cache.
- A 2-trial Optuna search (hydra-optuna-sweeper): jobs named and tagged by the sampled values.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers import mate_env, run_mate, wandb_run_summary
from tests.shared_runs import snapshot

COMMON = ["train", "-m", "experiment=hybridqa_mate", "trainer.max_steps=2", "dataset.max_length=128",
          "dataset.eval_batch_size=16", "trainer.limit_val_batches=1", "tags=[dev]"]  # fmt: skip
SWEEPS = {
    "heads": [
        "+sweep=heads_ablation",
        "hydra.sweeper.params.seed=1",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
    ],
    "optuna": ["hparams_search=optuna", "hydra.sweeper.n_trials=2"],
}
#: the keys each sweep varies, as names and tags show them
SWEPT = {"heads": ("row_heads_ratio",), "optuna": ("lr", "warmup_ratio", "radius", "global_size")}
#: what each run's name and tags add for the command line's other overrides (tags and hydra.* say nothing)
OVERRIDES = ["max_steps=2", "max_length=128", "eval_batch_size=16", "limit_val_batches=1"]
#: where tools write unless told otherwise; the sweep runs without any of them set
TOOL_DIRS = (
    "XDG_CACHE_HOME",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "MPLCONFIGDIR",
    "WANDB_DIR",
    "WANDB_CACHE_DIR",
    "WANDB_CONFIG_DIR",
    "WANDB_DATA_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
)


def run_sweep(base: Path, kind: str) -> tuple[Path, list[Path], dict]:
    """``mate train -m`` of ``kind`` with its own empty HOME and TMPDIR: the sweep dir, its
    job dirs and the environment it ran in."""
    (base / "home").mkdir()
    (base / "tmp").mkdir()
    env = mate_env(base / "out", base / "cache", HOME=str(base / "home"), TMPDIR=str(base / "tmp"))
    for name in TOOL_DIRS:
        env.pop(name, None)
    proc = run_mate([*COMMON, *SWEEPS[kind]], env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sweep_dir,) = (base / "out" / "multirun" / "train").iterdir()
    jobs = sorted(p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    return sweep_dir, jobs, env


@pytest.fixture(scope="module", params=list(SWEEPS))
def sweep(request, module_tmp) -> dict:
    """Over 20 s: a real multirun (its launcher and W&B runs are the point); the heads
    ablation is then reported by a real `mate report`."""
    base = module_tmp(request.param)
    sweep_dir, jobs, env = run_sweep(base, request.param)
    runs = [wandb_run_summary(next(job.glob("wandb/offline-run-*/run-*.wandb"))) for job in jobs]
    found = {"kind": request.param, "base": base, "dir": sweep_dir, "jobs": jobs, "runs": runs}
    if request.param == "heads":
        found["report"] = run_mate(["report", str(sweep_dir)], env)
    return found


def swept_values(text: str, keys: tuple[str, ...]) -> dict[str, str]:
    return {key: m[1] for key in keys if (m := re.search(rf"(?:^|[-,]){re.escape(key)}=([^,]+)", text))}


def test_each_job_is_named_and_tagged_by_what_was_swept(sweep):
    kind, runs = sweep["kind"], sweep["runs"]
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


def test_each_job_is_one_wandb_run_with_its_own_config_and_summary(sweep):
    if sweep["kind"] != "heads":
        pytest.skip("the heads ablation's jobs, run 2 at a time, are enough")
    runs, jobs = sweep["runs"], sweep["jobs"]
    ratios = (0.0, 0.5, 1.0)
    expected = {f"hybridqa_mate-mate-bucketed-hybridqa_sample-seed1-row_heads_ratio={r},{','.join(OVERRIDES)}"
                for r in ratios}  # fmt: skip
    assert {r["run"][0] for r in runs} == expected
    assert {r["run"][1] for r in runs} == {f"hybridqa_mate-{sweep['dir'].name}"}  # the group: one per sweep
    assert {r["run"][2] for r in runs} == {"cell_selector"}
    assert sorted(r["config"]["attention"]["row_heads_ratio"] for r in runs) == list(ratios)
    for job in jobs:
        assert json.loads((job / "metrics.json").read_text())["tags"] == ["dev"]
    for run in runs:
        for key in ("val/hits@1", "val/loss", "perf/examples_per_s", "perf/tokens_per_s", "perf/peak_mem_mb"):
            assert key in run["summary"], key
    assert len({run["summary"]["val/loss"] for run in runs}) == 3


def test_the_report_reads_the_sweep_and_nothing_is_written_outside_the_run_dirs_and_the_cache(sweep):
    if sweep["kind"] != "heads":
        pytest.skip("the heads ablation is reported")
    report, base = sweep["report"], sweep["base"]
    assert report.returncode == 0, report.stderr[-3000:]
    assert "row_heads_ratio" in report.stdout
    assert list((base / "home").rglob("*")) == [] and list((base / "tmp").rglob("*")) == []
    # where W&B's service logs go in a single run (<run dir>/wandb/cache): test_cli's smoke run; in a
    # sweep the service starts once per process and keeps the folders of the job that started it
    assert (base / "cache" / "matplotlib").is_dir()


def test_the_same_sweep_run_again_into_its_sweep_dir_is_taken_again_and_a_changed_one_refused(sweep):
    """Run again, a sweep continues in its folder (tests/integration/test_sweep_resume.py runs one): the claim takes
    the folder back, nothing in it changed. Another sweep there (Hydra's own sweeper records its overrides in
    multirun.yaml) is one line naming what changed; an Optuna sweep records none, its jobs check themselves."""
    from mate_cli.cli import claim_given_run_dir
    from mate_cli.run import lock as run_lock

    folder = sweep["dir"]
    before = snapshot(folder)
    args = [*COMMON[1:], *SWEEPS[sweep["kind"]], f"hydra.sweep.dir={folder}"]
    try:
        given, problem = claim_given_run_dir("train", args)
        assert problem is None and given[-1] == f"hydra.sweep.dir={folder}", problem
    finally:
        run_lock.release(folder)
    if sweep["kind"] == "heads":
        _, problem = claim_given_run_dir("train", [*args, "seed=7"])
        assert problem == (
            f"hydra.sweep.dir={folder} holds a sweep of `mate train -m` with other settings (seed=7 was not given); "
            "run it again as it ran to continue it, or pass a new hydra.sweep.dir=<folder> for this one"
        ), problem
    after = snapshot(folder)
    after.pop(run_lock.LOCK_NAME, None)  # the claim's lock file: made by the first claim of a folder
    before.pop(run_lock.LOCK_NAME, None)
    assert after == before


def test_a_cpu_epochs_peak_memory_counts_from_its_start_not_the_processes():
    """The jobs of a CPU multirun share one process: each epoch's perf/peak_mem_mb starts from the RSS it finds
    (Linux), so a job does not report an earlier job's peak."""
    import mmap

    import torch

    from mate_cli.callbacks.throughput import peak_memory_mb, reset_peak_memory

    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pytest.skip("the peak RSS is reset through /proc/self/clear_refs, which this system does not offer")
    cpu, size = torch.device("cpu"), 512 * 2**20
    # fresh pages, touched, then returned to the system: a tensor this big may reuse memory an earlier test
    # freed but the allocator kept resident, and then raises no peak
    with mmap.mmap(-1, size) as region:
        for offset in range(0, size, mmap.PAGESIZE):
            region[offset] = 1
    earlier = peak_memory_mb(cpu)
    reset_peak_memory(cpu)
    assert peak_memory_mb(cpu) < earlier - 400, (earlier, peak_memory_mb(cpu))
