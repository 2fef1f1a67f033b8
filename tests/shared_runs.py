"""Trained runs (and baselines) the whole test session shares: each is made once (in process, by
:func:`tests.inprocess.run_command`), then read by every test that only needs a checkpoint
or a run dir: eval, predict, report, PointR, resume-from, the config re-build, the
checkpoint checks.

Under pytest-xdist the workers share them too: the first worker that asks trains the run
while holding a file lock, the others wait and read it. A shared run is read-only: a test
that must change one copies it first (:func:`copy_run`), and the session's end checks
that no file of a shared run changed (``tests/conftest.py``).
"""

from __future__ import annotations

import os
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from filelock import FileLock

from tests.helpers import REPO_ROOT
from tests.inprocess import run_command

TINY = ["trainer.max_steps=2", "dataset.max_length=128", "logger=csv", "validate_best=false"]

#: the session's shared runs: name -> (command, overrides); small on purpose (a few steps
#: on the bundled samples, CSV logs only), each what several tests need. ``{root}`` in an
#: override is the shared folder, where :data:`PREPARE` makes what the run reads.
RUNS: dict[str, tuple[str, list[str]]] = {
    # TabFact MATE, validated (and its best checkpoint kept) at step 2
    "tabfact": (
        "train",
        [
            "experiment=tabfact_mate",
            "logger=csv",
            "trainer.max_steps=2",
            "trainer.val_check_interval=2",
            "~callbacks.progress_bar",
        ],
    ),
    # Table 4's tasks, 3 steps each; TabFact with no final validation (its validations inside fit are kept)
    "sqa_task": (
        "train",
        [
            "experiment=sqa_mate",
            "trainer.max_steps=3",
            "trainer.log_every_n_steps=1",
            "dataset.max_length=256",
            "logger=csv",
        ],
    ),
    # WikiTQ on a copy of its sample that has a test file: test_after_training scores it
    "wtq_task": (
        "train",
        [
            "experiment=wtq_mate",
            "trainer.max_steps=3",
            "trainer.log_every_n_steps=1",
            "dataset.max_length=256",
            "logger=csv",
            "dataset.root={root}/wtq_root",
            "test_after_training=true",
        ],
    ),
    "tabfact_task": (
        "train",
        [
            "experiment=tabfact_mate",
            "trainer.max_steps=3",
            "trainer.log_every_n_steps=1",
            "dataset.max_length=256",
            "logger=csv",
            "trainer.val_check_interval=1",
            "trainer.limit_val_batches=2",
            "validate_best=false",
        ],
    ),
    # SQA with dense attention, 2 steps, never validated (its head is not zero-initialised: cells pass 0.5): what
    # `mate export` writes for transformers, its table-QA pipeline and `mate eval` to read back
    "sqa_dense": (
        "train",
        [
            "experiment=sqa_tapas",
            "trainer.max_steps=2",
            "dataset.max_length=256",
            "logger=csv",
            "validate_best=false",
            "trainer.limit_val_batches=0",
        ],
    ),
    # `mate baseline` of the datasets sqa_task and tabfact train on: the trivial baselines a report sets beside them
    "baseline_sqa": ("baseline", ["dataset=sqa_sample"]),
    "baseline_tabfact": ("baseline", ["dataset=tabfact_sample"]),
    # PointR's two stages, 2 steps of 128 tokens each
    "pointr_stage1": ("train", ["experiment=hybridqa_tapas", *TINY]),
    "pointr_stage2": ("train", ["experiment=hybridqa_reader", "dataset.batch_size=4", *TINY]),
}


def _wtq_root(root: Path) -> None:
    """``{root}/wtq_root``: the WikiTQ sample with ``pristine-unseen-tables.tsv``, its
    training file's first 20 questions."""
    target = root / "wtq_root"
    if target.is_dir():
        return
    shutil.copytree(REPO_ROOT / "data" / "wtq_sample", target)
    lines = (target / "data" / "training.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    (target / "data" / "pristine-unseen-tables.tsv").write_text("".join(lines[:21]), encoding="utf-8")


#: what a shared run needs made in the shared folder before it trains
PREPARE = {"wtq_task": _wtq_root}


def shared_root(tmp_path_factory) -> Path:
    """The folder every worker of this session sees (xdist: the parent of the workers' own)."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-runs"
    root.mkdir(parents=True, exist_ok=True)
    return root


def shared_run(root: Path, name: str) -> Path:
    """The run dir of the shared run ``name``, trained here unless a worker already did."""
    command, overrides = RUNS[name]
    run = root / name
    with FileLock(str(root / f".{name}.lock")):
        if not done(run).is_file():
            shutil.rmtree(run, ignore_errors=True)
            run.mkdir(parents=True)
            if name in PREPARE:
                PREPARE[name](root)
            args = [o.replace("{root}", str(root)) for o in overrides]
            with open(screen(run), "w", encoding="utf-8") as out, redirect_stdout(out), redirect_stderr(out):
                run_command(command, [*args, f"dataset.cache_dir={root / 'cache'}"], run)
            done(run).write_text("")
    return run


def done(run: Path) -> Path:
    """Beside a shared run's dir once it trained to the end (one cut short is trained again)."""
    return run.parent / f"{run.name}.done"


def screen(run: Path) -> Path:
    """What training a shared run printed (beside its run dir, not in it)."""
    return run.parent / f"{run.name}.screen.txt"


def copy_run(run: Path, to: Path) -> Path:
    """A private copy of a shared run, for a test that changes it."""
    shutil.copytree(run, to)
    return to


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder``: (size, mtime in ns)."""
    return {
        p.relative_to(folder).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }
