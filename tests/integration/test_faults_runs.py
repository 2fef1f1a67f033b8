"""Faults around runs: a command never touches what another run made, signals end a run
with an honest status, non-finite numbers stop it, and every checkpoint is checked once
before it is resumed, evaluated or predicted with.

Real parts: the session's shared TabFact training run (`mate train`'s own function on a config
Hydra composes in process, the bundled sample: tests/shared_runs.py), real checkpoints edited as an
attacker or a broken disk would, and the real CLI in a subprocess only where a signal and
the exit status are the point.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mate_cli import cli
from mate_cli.run import lock as run_lock
from mate_cli.config.check import parsed_value
from mate_cli.errors import MateError
from tests.helpers import MATE, REPO_ROOT, mate_env
from tests.inprocess import run_command
from tests.helpers import one_error_line
from tests.helpers import ALIAS_BOMB
from mate_cli.run.rebuild import run_checkpoint
from tests.shared_runs import RUNS, copy_run, snapshot

#: the shared TabFact MATE run's overrides: it validates (and keeps a best checkpoint) every 2 steps
TRAIN = [o for o in RUNS["tabfact"][1] if not o.startswith("trainer.max_steps=")]


def train_in_process(overrides: list[str], run: Path, cache: Path) -> dict:
    """`mate train <TRAIN> <overrides>`, in this process, into ``run``."""
    return run_command("train", [*TRAIN, f"dataset.cache_dir={cache}", *overrides], run)


@pytest.fixture(scope="module")
def base(module_tmp) -> Path:
    return module_tmp("runs")


@pytest.fixture(scope="module")
def finished(trained) -> Path:
    """The shared finished two-step TabFact run, with a best checkpoint (validated at step 2)."""
    run = trained("tabfact")
    assert (run / "checkpoints" / "best-epoch00-step2.ckpt").is_file()
    return run


# ------------------------------------------------------------------ what another run made
def test_a_resume_never_deletes_or_names_the_resumed_runs_checkpoints(finished, base):
    before = snapshot(finished)
    resumed = base / "B"
    metrics = train_in_process(
        ["trainer.max_steps=3", "keep_best=encoder", f"ckpt_path={finished}"], resumed, base / "cache"
    )
    assert metrics["resumed_from"] == str(finished / "checkpoints" / "last.ckpt")
    assert snapshot(finished) == before
    best = json.loads((resumed / "metrics.json").read_text())["best_checkpoint"]
    assert Path(best).parent == resumed / "checkpoints", best


def test_a_command_into_another_runs_dir_is_refused_and_changes_nothing(finished, capsys):
    before = snapshot(finished)
    for args in (["eval", f"ckpt_path={finished}"], ["train", "experiment=tabfact_mate"]):
        assert cli.main([*args, f"hydra.run.dir={finished}"]) == 2
        line = capsys.readouterr().err.strip()
        assert line.startswith("mate: error: hydra.run.dir=") and "\n" not in line, line
        assert "metrics.json" in line and "paths.existing_run_dir=subdir" in line, line
    assert snapshot(finished) == before


def test_a_folder_of_the_users_is_refused_and_subdir_writes_beside_its_files(finished, base, capsys):
    folder = base / "notes"
    (folder / "checkpoints").mkdir(parents=True)
    for name, text in ((".notes.tmp", "mine"), ("checkpoints/.draft.tmp", "draft"), ("metrics.json", "{}")):
        (folder / name).write_text(text)
    before = snapshot(folder)
    assert cli.main(["eval", f"ckpt_path={finished}", f"hydra.run.dir={folder}"]) == 2
    assert "already holds files (.notes.tmp, checkpoints, metrics.json)" in capsys.readouterr().err
    assert snapshot(folder) == before and not (folder / run_lock.LOCK_NAME).exists()

    args, problem = cli.claim_given_run_dir(
        "eval", [f"ckpt_path={finished}", f"hydra.run.dir={folder}", "paths.existing_run_dir=subdir"]
    )
    assert problem is None
    inner = Path(args[-1].removeprefix("hydra.run.dir="))  # where Hydra puts the eval run
    try:
        assert inner.parent == folder.resolve() and inner.name.startswith("eval-") and inner.is_dir()
        assert snapshot(inner) == {run_lock.LOCK_NAME: snapshot(inner)[run_lock.LOCK_NAME]}  # taken, still empty
        assert {k: v for k, v in snapshot(folder).items() if not k.startswith(inner.name)} == before
    finally:
        run_lock.release(inner)


def test_a_folder_named_with_letters_beyond_ascii_goes_to_hydra_as_its_grammar_reads_it(tmp_path):
    """The claim handed the folder back unquoted, and Hydra's lexer failed on the ü (a real run into such a folder:
    test_cli)."""
    folder = tmp_path / "résultats" / "ü"
    args, problem = cli.claim_given_run_dir("train", ["experiment=tabfact_mate", f"hydra.run.dir='{folder}'"])
    try:
        assert problem is None and folder.is_dir(), problem
        assert args[-1].startswith("hydra.run.dir=") and parsed_value(args[-1]) == str(folder), args
    finally:
        run_lock.release(folder)


def test_a_folder_claimed_for_a_command_hydra_then_refuses_is_not_left_behind(tmp_path, monkeypatch):
    """Hydra's own refusal comes after the claim (here: a config name mate leaves to Hydra); the claim made the
    folder (or, in an empty folder of the user's, the lock file), which stayed."""
    from hydra.core.global_hydra import GlobalHydra

    from mate_cli.run import job

    monkeypatch.setattr(sys, "argv", list(sys.argv))  # what the entry point sets for Hydra
    monkeypatch.setattr(job, "COMMAND_LINE", [])
    (tmp_path / "runs" / "mine").mkdir(parents=True)
    for folder in (tmp_path / "runs" / "a" / "b", tmp_path / "runs" / "mine"):
        try:
            with pytest.raises(SystemExit) as end:
                cli.main(["train", "--config-name", "nope", f"hydra.run.dir={folder}"])
        finally:
            GlobalHydra.instance().clear()  # the app's, for the tests that initialise Hydra after this one
        assert end.value.code == 1
        assert [p.relative_to(tmp_path).as_posix() for p in (tmp_path / "runs").rglob("*")] == ["runs/mine"]


def test_only_temp_files_of_gone_mate_processes_are_removed(tmp_path):
    from mate_cli.io import temp_prefix

    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = (
        tmp_path
        / "checkpoints"
        / f"{temp_prefix(tmp_path / 'last.ckpt')}abc.tmp".replace(str(os.getpid()), str(gone.pid))
    )
    live = tmp_path / f"{temp_prefix(tmp_path / 'metrics.json')}xyz.tmp"
    users = [tmp_path / ".notes.tmp", tmp_path / "checkpoints" / ".draft.tmp"]
    for path in (stale, live, *users):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("half")
    assert run_lock.remove_stale_temps(tmp_path) == 1
    assert not stale.exists() and live.exists() and all(p.exists() for p in users)


def test_the_same_commands_interrupted_run_is_taken_again(tmp_path):
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "hydra.yaml").write_text("hydra:\n  job:\n    name: train\n")
    (run / ".hydra" / "overrides.yaml").write_text("- experiment=sqa_mate\n")
    (run / "train.log").write_text("")
    (run / run_lock.LOCK_NAME).write_text("")
    assert run_lock.claim(run, "train", ["experiment=sqa_mate"]) == run.resolve()
    run_lock.release(run)
    with pytest.raises(MateError, match="already holds files"):
        run_lock.claim(run, "train", ["experiment=sqa_tapas"])
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.ckpt").write_bytes(b"x")
    with pytest.raises(MateError, match=f"resume it there with ckpt_path={run}"):
        run_lock.claim(run, "train", ["experiment=sqa_mate"])
    assert run_lock.claim(run, "train", ["experiment=sqa_mate"], resuming=True) == run.resolve()
    run_lock.release(run)
    # resumed in place once: Hydra recorded ckpt_path=<run dir>, which does not make it another command; taken again,
    # the earlier stop's FAILED goes (the new run writes its own outcome)
    (run / ".hydra" / "overrides.yaml").write_text(f"- experiment=sqa_mate\n- ckpt_path={run}\n")
    (run / "FAILED").write_text("mate: interrupted by SIGTERM at step 3; resume with ckpt_path=...\n")
    assert run_lock.claim(run, "train", ["experiment=sqa_mate"], resuming=True) == run.resolve()
    assert not (run / "FAILED").exists()
    run_lock.release(run)
    (run / ".hydra" / "overrides.yaml").write_text("- experiment=sqa_mate\n")
    (run / "metrics.json").write_text("{}")  # finished: no longer an interrupted run
    with pytest.raises(MateError, match="already holds files"):
        run_lock.claim(run, "train", ["experiment=sqa_mate"], resuming=True)
    (run / "metrics.json").unlink()
    (run / ".hydra" / "overrides.yaml").write_text(f"- experiment=sqa_mate\n- ckpt_path={run}\n")  # resumed in place
    assert run_lock.claim(run, "train", ["experiment=sqa_mate", f"ckpt_path={run}"], resuming=True) == run.resolve()
    run_lock.release(run)
    (run / ".hydra" / "overrides.yaml").write_text(ALIAS_BOMB)  # read as data with limits: no run of this command
    with pytest.raises(MateError, match="already holds files"):
        run_lock.claim(run, "train", ["experiment=sqa_mate"], resuming=True)


# ------------------------------------------------------------------ signals
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130)], ids=["ctrl-c"])
def test_a_signal_to_the_whole_group_saves_last_ckpt_at_the_step_reached(trained, base, signum, code):
    """Ctrl-C in a terminal, ``timeout`` and a cluster's time limit signal the whole process
    group: the loader workers (two here) too. The run still finishes its batch, saves
    last.ckpt at that step, says how to resume, and exits 128 + the signal, which its log
    records (a wrapper like ``timeout`` reports its own status). SIGTERM to the group: the
    first run of the resume chain (test_resume.py), which is resumed from it.

    Over 20 s: a real process and its loader workers, signalled as a group.
    """
    run = base / f"interrupted-{code}"
    cache = trained("tabfact").parent / "cache"  # the shared run's: training starts without preprocessing
    proc = subprocess.Popen(
        [
            MATE,
            "train",
            *TRAIN,
            "trainer.max_steps=40",
            "callbacks.model_checkpoint.every_n_train_steps=2",
            "dataset.num_workers=2",
            f"dataset.cache_dir={cache}",
            f"hydra.run.dir={run}",
        ],
        env=mate_env(base / "outputs", base / "cache"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while not (run / "checkpoints" / "last.ckpt").is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signum)
    _, err = proc.communicate(timeout=120)
    name = signal.Signals(signum).name
    line = one_error_line(
        subprocess.CompletedProcess(proc.args, proc.returncode, "", err), code, f"mate: interrupted by {name} at step "
    )
    assert (run / "FAILED").read_text().strip() == line and line.endswith(f"resume with ckpt_path={run}"), line
    # "at step N; resume ...", or in a validation "at step N during a validation (checkpoints/last.ckpt holds step M)"
    step = int(
        re.search(r"holds step (\d+)", line)[1] if "holds step" in line else re.search(r" at step (\d+)", line)[1]
    )
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == step
    assert f"{line} (exit status {code})" in (run / "train.log").read_text()


def test_sigusr1_under_slurm_saves_in_the_run_dir_and_says_whether_the_job_was_requeued(trained, tmp_path):
    """A SLURM job's warning before pre-emption (``--signal=USR1``), to the whole process group as ``scancel
    --signal`` sends it (the loader workers, two here, ignore it; SIGHUP, SIGUSR2 and SIGXCPU take the same path,
    their handlers tested below): the run saves last.ckpt in its run dir and stops with 138, FAILED saying that the
    job was not requeued (no scontrol here); nothing is written into the working directory (Lightning's own handler
    wrote hpc_ckpt_1.ckpt there, which later runs silently resumed)."""
    run, cwd = tmp_path / "run", tmp_path / "cwd"
    cwd.mkdir()
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "1", "SLURM_JOB_NAME": "mate_job", "SLURM_NODELIST": "vm",
             "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}  # fmt: skip
    env = {**mate_env(tmp_path / "outputs", tmp_path / "cache"), **slurm}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if not (Path(p) / "scontrol").exists()
    )
    cache = trained("tabfact").parent / "cache"
    proc = subprocess.Popen(
        [MATE, "train", *TRAIN, "trainer.max_steps=40", "callbacks.model_checkpoint.every_n_train_steps=2",
         "dataset.num_workers=2", f"dataset.cache_dir={cache}", f"hydra.run.dir={run}"],
        cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while not (run / "checkpoints" / "last.ckpt").is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGUSR1)
    _, err = proc.communicate(timeout=120)
    line = one_error_line(
        subprocess.CompletedProcess(proc.args, proc.returncode, "", err), 138, "mate: interrupted by SIGUSR1 at step "
    )
    assert line.endswith(f"resume with ckpt_path={run}; SLURM job 4242 not requeued: no scontrol on PATH"), line
    assert (run / "FAILED").read_text().strip() == line
    step = int(
        re.search(r"holds step (\d+)", line)[1] if "holds step" in line else re.search(r" at step (\d+)", line)[1]
    )
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == step
    assert list(cwd.iterdir()) == [], list(cwd.iterdir())


def group_size(pgid: int) -> int:
    """The processes of process group ``pgid`` now."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                count += os.getpgid(int(entry.name)) == pgid
    return count


def test_num_workers_beyond_the_cores_is_cut_and_a_second_signal_lost_in_a_fork_still_ends_the_run(trained, tmp_path):
    """``dataset.num_workers=100000`` starts one loader worker per core, with a warning in the log (it kept starting
    workers, hundreds before the first batch). And where the second SIGTERM's exception is lost (raised inside an
    at-fork hook while the process forks on: tests/signal_at.py), the run still ends within ``END_S``, exit 143,
    FAILED naming the step to resume from (the first one stops training at the end of a batch that never ends).

    Over 20 s: a real process, its loader workers and its signals.
    """
    from mate_cli.data.preprocess import available_cores
    from mate_cli.callbacks.interrupts import END_S

    run, cores = tmp_path / "run", available_cores()
    cache = trained("tabfact").parent / "cache"  # the shared run's: training starts without preprocessing
    fork = ["+callbacks.fork_forever._target_=tests.signal_at.SignalThenForkForever", "+callbacks.fork_forever.batch=1"]
    with (tmp_path / "stderr").open("w") as err:
        proc = subprocess.Popen(
            [MATE, "train", *TRAIN, "trainer.max_steps=40", "callbacks.model_checkpoint.every_n_train_steps=1",
             "dataset.num_workers=100000", f"dataset.cache_dir={cache}", f"hydra.run.dir={run}", *fork],
            env=mate_env(tmp_path / "outputs", tmp_path / "cache", PYTHONPATH=str(REPO_ROOT)),
            stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
        )  # fmt: skip
    # mate, each loader's workers (training, validation), the child forked now and then, to spare
    limit, most, saved_at, deadline = 1 + 2 * cores + 1 + 4, 0, None, time.monotonic() + 300
    try:
        while proc.poll() is None and time.monotonic() < deadline and most <= limit:
            most = max(most, group_size(proc.pid))
            if saved_at is None and (run / "checkpoints" / "last.ckpt").is_file():
                saved_at = time.monotonic()  # step 1's: the batch that never ends starts now
                deadline = saved_at + END_S + 30
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert most <= limit, f"{most} processes in the run's group (one loader worker per core: {cores})"
    assert proc.returncode == 143, f"exit status {proc.returncode}: {(tmp_path / 'stderr').read_text()[-3000:]}"
    stderr = (tmp_path / "stderr").read_text()
    line = f"mate: interrupted by SIGTERM at step 1; resume with ckpt_path={run}"
    assert [x for x in stderr.splitlines() if x.startswith("mate:")] == [line] and "Traceback" not in stderr, stderr
    assert (run / "FAILED").read_text().strip() == line
    cut = f"dataset.num_workers=100000 is more loader workers than the {cores} core(s) this process may use; using"
    assert f"{cut} {cores}" in (run / "train.log").read_text()


def test_scontrol_requeues_the_job_and_a_failure_is_one_clause(tmp_path, monkeypatch):
    from mate_cli.callbacks.interrupts import requeue_note

    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    tool = tmp_path / "bin" / "scontrol"  # SLURM's command, as a cluster would have it on PATH
    tool.parent.mkdir()
    tool.write_text(
        '#!/bin/sh\necho "$@" > "$(dirname "$0")/called"\n[ "$2" = 4242 ] || { echo "Invalid job id" >&2; exit 1; }\n'
    )
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", os.pathsep.join([str(tool.parent), os.environ.get("PATH", "")]))
    assert requeue_note(signal.SIGUSR1) == "; SLURM job 4242 requeued (scontrol requeue 4242)"
    assert (tool.parent / "called").read_text().split() == ["requeue", "4242"]
    assert requeue_note(signal.SIGTERM) == ""  # only SLURM's warning signal requeues
    monkeypatch.setenv("SLURM_PROCID", "1")  # another task of the job: the first one requeues it, once
    (tool.parent / "called").unlink()
    assert requeue_note(signal.SIGUSR1) == "" and not (tool.parent / "called").exists()
    monkeypatch.delenv("SLURM_PROCID")
    monkeypatch.setenv("SLURM_JOB_ID", "99")
    assert requeue_note(signal.SIGUSR1) == "; SLURM job 99 not requeued: scontrol requeue 99: Invalid job id"
    monkeypatch.delenv("SLURM_JOB_ID")
    assert requeue_note(signal.SIGUSR1) == ""


def test_device_and_node_counts_a_machine_cannot_run_are_one_line(tmp_path):
    from mate_cli.data.preprocess import available_cores
    from tests.inprocess import run_app

    cores = available_cores()
    cases = {  # trainer.devices=99 on 2 cores started 99 processes and hung; 0 was Lightning's traceback
        f"trainer.devices={cores + 1}": (
            f"starts {cores + 1} training processes on the CPU, but this machine has {cores}"
        ),
        "trainer.devices=0": "trainer.devices=0 is no device count",
        "trainer.num_nodes=0": "trainer.num_nodes=0 is no node count",
    }
    for override, message in cases.items():
        code, err = run_app("train", ["experiment=tabfact_mate", override], tmp_path / override.replace("=", "_"))
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (override, err)


@pytest.fixture
def signal_handlers():
    """This process's handlers of mate's signals, as they were, after the test."""
    from mate_cli.callbacks.interrupts import SIGNALS

    saved = {signum: signal.getsignal(signum) for signum in SIGNALS}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_a_run_resumed_in_its_own_run_dir_keeps_its_earlier_csv_rows(trained, tmp_path, signal_handlers):
    """`hydra.run.dir=<run> ckpt_path=<run>`: Lightning's CSV logger deletes the metrics file it finds in its folder
    when it starts, so the earlier rows are read before it does; the log goes on from step 1."""
    import csv

    from mate_cli.callbacks import interrupts

    interrupts.install()
    run, cache = tmp_path / "run", trained("tabfact").parent / "cache"
    stop = ["+callbacks.signal_at._target_=tests.signal_at.SignalAt", "+callbacks.signal_at.batch=2"]
    try:
        with pytest.raises(Exception, match="interrupted by SIGTERM at step 3"):
            train_in_process(["trainer.max_steps=5", "trainer.log_every_n_steps=1", *stop], run, cache)
    finally:
        interrupts.install()
    train_in_process(["trainer.max_steps=5", "trainer.log_every_n_steps=1", f"ckpt_path={run}"], run, cache)
    with open(run / "csv" / "metrics.csv", newline="", encoding="utf-8") as handle:
        steps = sorted({int(float(row["step"])) for row in csv.DictReader(handle) if row.get("train/loss")})
    assert steps[0] <= 1 and steps[-1] >= 4, steps
    # the resumed state is written over the interrupted one, not beside it as last-v1.ckpt (which a later
    # ckpt_path=<run> would not read)
    assert sorted(p.name for p in (run / "checkpoints").glob("last*")) == ["last.ckpt"]
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 5


def test_a_run_stopped_after_its_last_step_resumes_to_its_learning_curve_and_final_score(finished, tmp_path):
    """A stop between the last step and ``metrics.json`` leaves nothing to train: Lightning then skips the training
    loop and its hooks, yet the resumed run keeps the earlier CSV rows, and with ``validate_best=false`` scores the
    final weights as the run's last validation had."""
    import csv

    cache, run = finished.parent / "cache", tmp_path / "run"
    args = ["trainer.max_steps=2", "trainer.log_every_n_steps=1", "validate_best=false"]
    first = train_in_process(args, run, cache)
    (run / "metrics.json").unlink()
    again = train_in_process([*args, f"ckpt_path={run}"], run, cache)
    assert again["val/accuracy"] == pytest.approx(first["val/accuracy"]) and again["resumed_from"], again
    with open(run / "csv" / "metrics.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert {int(float(row["step"])) for row in rows if row.get("train/loss")} >= {0, 1}, rows  # none trained again


def test_a_signal_during_a_validation_stops_it_and_says_which_step_a_resume_starts_from(
    trained, tmp_path, signal_handlers
):
    """A signal inside a validation during fit stops at the next validation batch, unsaved (docs/runs.md, "Resuming"):
    the line says so, and which last.ckpt a resume would read, if any (a full-state best checkpoint is none)."""
    from mate_cli.callbacks import interrupts

    cache = trained("tabfact").parent / "cache"  # validations every 2 steps
    stop = ["+callbacks.signal_at._target_=tests.signal_at.SignalAt", "+callbacks.signal_at.batch=0"]
    stop += ["trainer.max_steps=6", "trainer.limit_val_batches=2"]
    for name, overrides, said in (
        ("none", ["callbacks.model_checkpoint.every_n_train_steps=50", "+callbacks.signal_at.validation=1"],
         "at step 2 during a validation, before any checkpoints/last.ckpt was saved; run the command again"),
        ("every-step", ["callbacks.model_checkpoint.every_n_train_steps=1", "+callbacks.signal_at.validation=1"],
         f"at step 2 during a validation; resume with ckpt_path={tmp_path / 'every-step'}"),
        ("full-best", ["callbacks.model_checkpoint.every_n_train_steps=50", "+callbacks.signal_at.validation=2",
                       "callbacks.best_checkpoint.save_weights_only=false"],
         "at step 4 during a validation, before any checkpoints/last.ckpt was saved; run the command again"),
    ):  # fmt: skip
        interrupts.install()
        try:
            with pytest.raises(Exception, match="interrupted by SIGTERM at step") as err:
                train_in_process([*stop, *overrides], tmp_path / name, cache)
        finally:
            interrupts.install()
        assert str(err.value) == f"interrupted by SIGTERM {said}", (name, err.value)


@pytest.mark.parametrize("first", [False, True], ids=["after-lightnings", "before-mates"])
def test_a_sigterm_whose_lightning_handler_fails_still_stops_the_run_in_mates_one_line(trained, tmp_path, first):
    """Lightning's SIGTERM handler broadcasts under DDP and raises there when another rank has already ended. Mate's
    handler is called before it; and where a failing handler ran even before mate's, the signal the watch heard
    stops the run: its one line and exit status 143 either way, not the traceback of a "failed: RuntimeError"."""
    from tests.inprocess import run_app
    from tests.signal_at import PEER_GONE_SAW

    cache, run = trained("tabfact").parent / "cache", tmp_path / "run"
    stop = ["+callbacks.lost_peer._target_=tests.signal_at.SignalWithALostPeer", "+callbacks.lost_peer.batch=1"]
    stop.append(f"+callbacks.lost_peer.first={first}")
    PEER_GONE_SAW.clear()
    code, err = run_app("train", [*TRAIN, f"dataset.cache_dir={cache}", "trainer.max_steps=4", *stop], run)
    line = one_error_line(subprocess.CompletedProcess([], code, "", err), 143, "mate: interrupted by SIGTERM at step 1")
    assert (run / "FAILED").read_text().strip() == line, line
    assert PEER_GONE_SAW == [None if first else signal.SIGTERM], "which of mate's and the failing handler ran first"


def test_resuming_a_finished_run_with_another_attention_says_both_in_a_warning(finished, tmp_path, caplog):
    cache = finished.parent / "cache"
    with caplog.at_level("WARNING", logger="mate_cli"):
        train_in_process([f"ckpt_path={finished}", "trainer.max_steps=2", "attention=dense"], tmp_path / "run", cache)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    (changed,) = [w for w in warned if w.startswith("resuming with ")]
    assert "attention._target_ (mate_cli.modeling.attention.mate.MateAttention -> " in changed, changed
    assert "attention.variant (bucketed -> unset)" in changed and "dataset." not in changed, changed
    assert "the resumed run is at step 2, trainer.max_steps=2: nothing is trained" in " ".join(warned), warned
    caplog.clear()
    with caplog.at_level("WARNING", logger="mate_cli"):  # the same config, to go on: no warning
        train_in_process([f"ckpt_path={finished}", "trainer.max_steps=3"], tmp_path / "more", cache)
    assert not [r for r in caplog.records if r.levelname == "WARNING" and "resum" in r.getMessage()], caplog.text


def test_a_finished_run_given_more_steps_goes_on_in_its_epoch_as_one_longer_run(finished, tmp_path):
    """A run that ended at ``trainer.max_steps`` inside an epoch, resumed with a larger ``max_steps``, goes on in that
    epoch with its next examples, and ends with the weights of one run of that many steps (without a learning-rate
    schedule, whose shape depends on ``max_steps``): Lightning counts the cut epoch as completed when fit ends, and the
    resume reopens it.

    The short run's optimiser is unfused as every run's was before ``model.optimizer.fused`` existed (torch's default,
    ``null``, in its groups); the resume leaves the option at today's default, fused. Torch restores the groups as
    written, so the resumed run must step unfused (the non-finite check hands such a step no ``found_inf``, which it
    refuses) and end where a whole unfused run ends."""
    cache, steady = finished.parent / "cache", ["~model/scheduler", "~model.scheduler", "trainer.limit_val_batches=1"]
    unfused = [*steady, "model.optimizer.fused=null"]
    train_in_process([*unfused, "trainer.max_steps=2"], tmp_path / "short", cache)
    train_in_process([*steady, "trainer.max_steps=4", f"ckpt_path={tmp_path / 'short'}"], tmp_path / "more", cache)
    train_in_process([*unfused, "trainer.max_steps=4"], tmp_path / "whole", cache)
    more, whole = (
        torch.load(tmp_path / run / "checkpoints" / "last.ckpt", weights_only=True) for run in ("more", "whole")
    )
    assert more["global_step"] == whole["global_step"] == 4
    position = {k: v for k, v in whole["mate_resume"].items() if k != "rng"}
    assert position["examples_this_epoch"] == 16 and {k: more["mate_resume"][k] for k in position} == position
    assert all(torch.equal(more["state_dict"][k], v) for k, v in whole["state_dict"].items())


def test_loader_and_pool_workers_take_their_own_signal_actions(signal_handlers):
    """What a DataLoader worker (ignore Ctrl-C, end quietly at SIGTERM) and a preprocessing
    pool worker (the default actions) set when they start; the whole-group test above shows
    the effect on a real run."""
    from mate_cli.data import preprocess, workers
    from mate_cli.callbacks import interrupts

    others = [signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGXCPU]
    assert set(interrupts.SIGNALS) == {signal.SIGTERM, *others}
    interrupts.install()  # the command's process: every one of them is mate's
    assert all(signal.getsignal(signum) is interrupts._handle for signum in interrupts.SIGNALS)
    workers.loader_worker_start(0)
    assert all(signal.getsignal(signum) is signal.SIG_IGN for signum in others)
    assert signal.getsignal(signal.SIGTERM) is workers._end_worker
    preprocess._set_function(len)
    assert all(signal.getsignal(signum) is signal.SIG_DFL for signum in interrupts.SIGNALS)
    assert preprocess._call([1, 2]) == 2


def test_one_signal_delivered_twice_at_once_still_lets_training_save_last_ckpt(monkeypatch):
    """GNU ``timeout`` sends its TERM to the command and then to its process group, which the handler can see twice
    within microseconds: inside ``trainer.fit`` that repeat must not stop the run before its batch ends and last.ckpt
    is saved. Another signal, or the same one a second later, is a second request and stops the command at once."""
    from mate_cli.callbacks import interrupts

    for name, value in {"pid": os.getpid(), "received": None, "received_at": 0.0, "deferring": True}.items():
        monkeypatch.setattr(interrupts._State, name, value)
    monkeypatch.setattr(interrupts._State, "training", None)
    interrupts._handle(signal.SIGTERM, None)  # the first: deferred to the end of the batch
    interrupts._handle(signal.SIGTERM, None)  # timeout's second delivery of it
    assert interrupts.received() == signal.SIGTERM
    with pytest.raises(interrupts.Interrupted):
        interrupts._handle(signal.SIGINT, None)
    monkeypatch.setattr(interrupts._State, "received_at", time.monotonic() - interrupts.REPEAT_S)
    with pytest.raises(interrupts.Interrupted):
        interrupts._handle(signal.SIGTERM, None)


def test_an_error_that_is_no_users_fault_is_recorded_with_exit_status_1_and_raised(tmp_path, signal_handlers):
    """`run_task` with a bug inside the task: ``FAILED`` and the run's log say
    ``mate: failed: <type>: <message>`` (the log with exit status 1), and the traceback is
    not swallowed."""
    import logging

    from mate_cli.run.job import run_task
    from tests.inprocess import compose_command

    run = tmp_path / "run"
    run.mkdir()
    cfg = compose_command("baseline", ["dataset=sqa_sample"], run)
    handler = logging.FileHandler(run / "baseline.log")
    logging.getLogger().addHandler(handler)
    environ = dict(os.environ)  # run_task points W&B's folders into the run dir: put them back for later tests
    try:
        with pytest.raises(ZeroDivisionError):
            run_task(lambda cfg: 1 / 0, cfg)
    finally:
        os.environ.clear()
        os.environ.update(environ)
        logging.getLogger().removeHandler(handler)
        handler.close()
        from hydra.core.hydra_config import HydraConfig

        HydraConfig.instance().cfg = None
    assert (run / "FAILED").read_text() == "mate: failed: ZeroDivisionError: division by zero\n"
    assert "mate: failed: ZeroDivisionError: division by zero (exit status 1)" in (run / "baseline.log").read_text()


# ------------------------------------------------------------------ non-finite numbers
def test_a_wikitq_answer_beyond_float32_is_refused_with_file_and_line(tmp_path):
    from mate_cli.data.wtq import WTQReader

    root = tmp_path / "wtq"
    shutil.copytree(REPO_ROOT / "data" / "wtq_sample", root)
    question_file = next(p for p in (root / "data").glob("*.tsv") if p.read_text().count("\n") > 1)
    lines = question_file.read_text().split("\n")
    fields = lines[1].split("\t")
    fields[-1] = "1e39"
    lines[1] = "\t".join(fields)
    question_file.write_text("\n".join(lines))
    for tagged in (root / "tagged").rglob(question_file.name.replace(".tsv", ".tagged")):
        tagged.unlink()
    with pytest.raises(MateError) as err:
        list(WTQReader(root).questions(question_file.name))
    assert f"{question_file}: line 2" in str(err.value) and "1e39" in str(err.value) and "float32" in str(err.value)


def test_a_cell_number_beyond_float32_is_text_to_the_model():
    from mate_cli.data.numbers import parse_number

    assert parse_number("1e38") == 1e38 and parse_number("1e39") is None and parse_number("-3e40") is None


def test_training_stops_at_the_first_non_finite_loss_naming_step_and_questions(base):
    run = base / "diverged"
    with pytest.raises(MateError) as err:  # the first step's update (lr 1e30) makes the second step's loss NaN
        train_in_process(
            [
                "trainer.max_steps=6",
                "model.optimizer.lr=1e30",
                "trainer.gradient_clip_val=null",
                "callbacks.model_checkpoint.every_n_train_steps=1",
            ],
            run,
            base / "cache",
        )
    line = str(err.value)
    assert "the training loss is nan at step 2 on the batch of questions " in line and ".html.csv#" in line, line
    assert "\n" not in line and not (run / "metrics.json").exists()
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 1  # step 2 never saved


def test_a_checkpoint_with_nan_weights_or_of_another_model_is_one_line(finished, tmp_path):
    from hydra.utils import instantiate

    from mate_cli.run.rebuild import check_checkpoint_fits, load_run_config

    ckpt = finished / "checkpoints" / "last.ckpt"
    model = instantiate(load_run_config(ckpt).model)
    data = torch.load(ckpt, weights_only=True)
    name = next(iter(data["state_dict"]))
    broken = {
        "nan": ("NaN or infinite weights", lambda s: s[name].fill_(float("nan"))),
        "other model": ("does not fit the model", lambda s: s.update(extra=torch.zeros(3))),
        "other shape": ("of shape", lambda s: s.update({name: torch.zeros(2, 2)})),
    }
    for case, (message, damage) in broken.items():
        copy = {**data, "state_dict": dict(data["state_dict"])}
        copy["state_dict"][name] = copy["state_dict"][name].clone()
        damage(copy["state_dict"])
        path = tmp_path / f"{case}.ckpt"
        torch.save(copy, path)
        with pytest.raises(MateError) as err:
            check_checkpoint_fits(path, model, "ckpt_path")
        assert message in str(err.value) and "\n" not in str(err.value) and str(path) in str(err.value), case
    (tmp_path / "empty.ckpt").write_bytes(b"")
    with pytest.raises(MateError, match="is empty"):
        check_checkpoint_fits(tmp_path / "empty.ckpt", model, "ckpt_path", resume=True)
    assert check_checkpoint_fits(ckpt, model, "ckpt_path", resume=True)["global_step"] == 2


def damaged_copy(finished: Path, to: Path, damage) -> Path:
    """A copy of the shared run whose best checkpoint ``damage(state_dict)`` changed (its
    resolved_config.yaml still names the model the checkpoint no longer fits)."""
    run = copy_run(finished, to)
    ckpt = run_checkpoint(run)
    data = torch.load(ckpt, weights_only=True)
    damage(data["state_dict"])
    torch.save(data, ckpt)
    return ckpt


TABFACT_TABLE = REPO_ROOT / "data" / "tabfact_sample" / "data" / "all_csv" / "2-18178534-1.html.csv"


@pytest.mark.parametrize(
    "case, message", [("nan", "NaN or infinite weights"), ("other task", "does not fit the model")]
)
def test_eval_and_predict_refuse_a_nan_or_foreign_checkpoint_in_one_line_writing_no_result(
    finished, tmp_path, case, message
):
    def damage(state):
        name = next(iter(state))
        if case == "nan":
            state[name] = torch.full_like(state[name], float("nan"))
        else:  # a cell-selection head's weights, as a SQA or WikiTQ checkpoint has, in this TabFact run
            state["model.column_output_weights"] = torch.zeros(384)

    ckpt = damaged_copy(finished, tmp_path / "run", damage)
    for command, args in (("eval", []), ("predict", [f"table={TABFACT_TABLE}", "question=the team win 3 game"])):
        out = tmp_path / command
        out.mkdir()
        with pytest.raises(MateError) as err:
            run_command(command, [f"ckpt_path={ckpt}", *args], out)
        line = str(err.value)
        assert message in line and str(ckpt) in line and "\n" not in line, (command, line)
        assert not (out / "metrics.json").exists() and not (out / "prediction.json").exists(), command


def test_resuming_from_a_zero_byte_last_ckpt_is_one_line_before_any_data_loads(finished, tmp_path):
    run = copy_run(finished, tmp_path / "run")
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")
    with pytest.raises(MateError, match=f"{run / 'checkpoints' / 'last.ckpt'} is empty"):
        train_in_process(["trainer.max_steps=3", f"ckpt_path={run}"], tmp_path / "resumed", tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_eval_of_finite_weights_whose_loss_overflows_flags_the_nan_metrics(finished, tmp_path, caplog):
    """A classifier whose weights are all 3e38 is finite (the checkpoint check passes) but
    overflows the logits: the metrics are NaN, and eval says so instead of reporting a number."""
    import logging

    def damage(state):
        (name,) = [k for k in state if k.endswith("classifier.weight")]
        state[name] = torch.full_like(state[name], 3e38)

    ckpt = damaged_copy(finished, tmp_path / "run", damage)
    with caplog.at_level(logging.WARNING):
        metrics = run_command("eval", [f"ckpt_path={ckpt}"], tmp_path / "eval")
    assert "val/loss" in metrics["non_finite"], metrics
    assert json.loads((tmp_path / "eval" / "metrics.json").read_text())["non_finite"] == metrics["non_finite"]
    assert "non-finite metrics: " in caplog.text and "an example's loss overflowed" in caplog.text


def test_eval_of_a_run_dir_from_another_machine_caches_here_not_at_its_paths(finished, tmp_path):
    """Its resolved config names a cache under a ``paths.cache_dir`` this machine lacks: eval builds its cache under
    this command's ``paths.cache_dir`` and creates nothing at the other machine's path."""
    from omegaconf import OmegaConf

    run, gone = copy_run(finished, tmp_path / "run"), tmp_path / "other_machine" / "cache"
    config = OmegaConf.load(run / "resolved_config.yaml")
    config.paths.cache_dir, config.dataset.cache_dir = str(gone), str(gone / "tabfact")
    OmegaConf.save(config, run / "resolved_config.yaml")
    run_command("eval", [f"ckpt_path={run}", f"paths.cache_dir={tmp_path / 'here'}"], tmp_path / "eval")
    assert (tmp_path / "here" / "tabfact").is_dir() and not (tmp_path / "other_machine").exists()


def test_resuming_from_a_garbled_resume_state_is_one_line_before_any_data_loads(finished, tmp_path):
    data = torch.load(finished / "checkpoints" / "last.ckpt", weights_only=True)
    data["mate_resume"]["rng"]["numpy"] = [1, 2]
    garbled = tmp_path / "garbled.ckpt"
    torch.save(data, garbled)
    with pytest.raises(MateError) as err:
        train_in_process(["trainer.max_steps=3", f"ckpt_path={garbled}"], tmp_path / "run", tmp_path / "cache")
    assert str(garbled) in str(err.value) and "resume state (mate_resume) is damaged" in str(err.value), err.value
    assert not (tmp_path / "cache").exists()  # refused before any data was prepared


def test_report_lists_a_run_with_nan_metrics_as_failed(finished, tmp_path):
    from mate_cli.report.collect import FAILED_STATUS, load_run

    run = tmp_path / "nan-run"
    shutil.copytree(finished, run, ignore=shutil.ignore_patterns("checkpoints", "*.lock"))
    metrics = json.loads((run / "metrics.json").read_text())
    metrics["val/loss"] = float("nan")
    (run / "metrics.json").write_text(json.dumps(metrics))
    loaded = load_run(run, tmp_path)
    assert loaded.status == FAILED_STATUS and "val/loss" in loaded.error and "diverged" in loaded.error


def test_predict_takes_a_run_dir_as_eval_does(finished):
    from mate_cli.run.rebuild import load_run_config, run_checkpoint

    assert run_checkpoint(finished) == finished / "checkpoints" / "best-epoch00-step2.ckpt"
    assert load_run_config(finished).experiment_name == "tabfact_mate"


# ------------------------------------------------------------------ a question longer than the run reads
def test_a_100k_character_question_is_shown_short_and_its_cut_is_said(finished, caplog):
    import logging

    from mate_cli.commands.predict import shown, warn_if_cut
    from mate_cli.pretrained import load_tokenizer
    from mate_cli.run.rebuild import TrainedRun, load_run_config

    question = "which team scored most " * 4500  # about 100,000 characters
    assert shown(question).endswith(f"… ({len(question):,} characters)") and len(shown(question)) < 240
    cfg = load_run_config(finished)
    run = TrainedRun(cfg=cfg, model=None, ckpt_path="", tokenizer=load_tokenizer(cfg.dataset.pretrained))
    with caplog.at_level(logging.WARNING):
        warn_if_cut("which team scored most?", run, "")
        assert caplog.text == ""
        warn_if_cut(question, run, "")
    assert "the model reads only the first 64" in caplog.text and "dataset.max_question_tokens" in caplog.text


def test_a_forked_worker_does_not_keep_its_parents_run_dir_locked(tmp_path):
    """Loader and preprocessing workers are forked with the run dir's lock file open: once the parent is gone (its
    lock released here), the run dir can be taken again while a worker still runs."""
    import multiprocessing

    run = tmp_path / "run"
    assert run_lock.take(run)
    context = multiprocessing.get_context("fork")
    started = context.Event()
    worker = context.Process(target=_work_a_minute, args=(started,))
    worker.start()
    try:
        assert started.wait(60)
        run_lock.release(run)  # as the parent's death would
        assert run_lock.take(run)  # the worker's copy of the lock file did not keep the lock
    finally:
        worker.kill()
        worker.join()
        run_lock.release(run)


def _work_a_minute(started) -> None:
    started.set()
    time.sleep(60)


def test_a_run_that_is_still_training_is_not_resumed_beside_itself(tmp_path):
    """Two processes would train one run (and share its W&B run): resuming a run dir another live mate process holds
    is one line naming it; this process's own run dir (an in-place resume) is not refused. The other process's lock
    is an flock on its own open lock file, which a second open file conflicts with in one process as across two."""
    import fcntl

    from mate_cli.run.resume import resolve_resume_path

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")
    with open(run / run_lock.LOCK_NAME, "w") as other:  # the live holder, as run_lock.take writes it
        other.write("4242\n")
        other.flush()
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(MateError, match=rf"ckpt_path={run}: the run in {run} is still running \(pid 4242\)"):
            resolve_resume_path(str(run), tmp_path, "x")
    assert run_lock.take(run)  # the holder is gone: this process's own now
    try:
        run_lock.check_not_running(run, "ckpt_path")  # its own run dir passes
    finally:
        run_lock.release(run)


def test_a_checkpoint_mate_cannot_resume_exactly_is_refused_or_resumed_saying_what_is_lost(finished, base, caplog):
    """Lightning 1.x's loop state is refused in one line (it ended in a KeyError traceback); a checkpoint without
    mate's resume state or without the schedule resumes with a warning naming what starts again, never with the
    "continues exactly" line (the losses and the learning rate said otherwise)."""
    from mate_cli.callbacks.resume_state import RESTORED

    data = torch.load(finished / "checkpoints" / "last.ckpt", weights_only=False)
    old = base / "lightning-1.5.ckpt"
    torch.save({**data, "pytorch-lightning_version": "1.5.0"}, old)
    with pytest.raises(MateError, match=re.escape(f"ckpt_path={old} was written by Lightning 1.5.0")) as err:
        train_in_process([f"ckpt_path={old}", "trainer.max_steps=4"], base / "from-1.5", base / "cache")
    assert str(err.value).endswith(f"init_from={old}")
    for dropped, lost in (("mate_resume", "the RNG states and the position in the epoch"),
                          ("lr_schedulers", "the learning-rate schedule")):  # fmt: skip
        partial = base / f"without-{dropped}.ckpt"
        torch.save({k: v for k, v in data.items() if k != dropped}, partial)
        caplog.clear()
        with caplog.at_level(logging.INFO):
            train_in_process([f"ckpt_path={partial}", "trainer.max_steps=3"], base / f"from-{dropped}", base / "cache")
        said = " ".join(r.getMessage() for r in caplog.records)
        assert f"holds nothing of {lost}" in said and "does not continue exactly" in said, said
        assert RESTORED not in said


def test_a_run_whose_checkpoints_folder_links_into_another_run_is_refused(finished, tmp_path):
    """Resumed in place and signalled, such a run overwrote the other run's last.ckpt."""
    other = tmp_path / "other"
    shutil.copytree(finished / "checkpoints", other / "checkpoints")
    before = (other / "checkpoints" / "last.ckpt").read_bytes()
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").symlink_to(other / "checkpoints")
    with pytest.raises(MateError, match=re.escape(f"{run / 'checkpoints'} is a link to {other / 'checkpoints'}")):
        train_in_process([f"ckpt_path={run}", "trainer.max_steps=4"], run, tmp_path / "cache")
    assert (other / "checkpoints" / "last.ckpt").read_bytes() == before


def test_predict_on_a_table_longer_than_the_run_reads_says_how_much_was_kept(finished, tmp_path, caplog):
    """A 2,000-row table answered from its first rows only: said on screen (it printed an answer and nothing else)."""
    import logging

    table = tmp_path / "long.html.csv"
    table.write_text("year#team#points\n" + "".join(f"{1000 + i}#team {i}#{i}\n" for i in range(2000)))
    with caplog.at_level(logging.WARNING):
        result = run_command("predict", [f"ckpt_path={finished}", f"table={table}", "question=team 5 scored 5 points"],
                             tmp_path / "predict")  # fmt: skip
    kept = result["kept"]
    assert result["truncated"] and kept["of_rows"] == 2000 and 0 < kept["rows"] < 2000 and kept["of_columns"] == 3
    assert f"{kept['rows']} of 2000 rows and 3 of 3 columns kept" in caplog.text, caplog.text


def test_a_run_that_ended_at_max_epochs_resumed_with_more_trains_just_the_epochs_it_lacks(finished, tmp_path):
    """A run that ended at ``trainer.max_epochs`` (its last epoch whole), resumed with a larger ``max_epochs``, trains
    the epochs between, each whole, and ends with the weights of one run of that many epochs: the position in its
    finished epoch is not read as one in the next (which skipped as many of the next epoch's examples: on a small
    dataset, whole epochs), and the next epoch's loader draws from the restored RNG, as the uninterrupted run's did.
    Over 20 s: five short runs in this process, each resumed one compared weight by weight with the whole one."""
    cache = finished.parent / "cache"
    steady = ["~model/scheduler", "~model.scheduler", "trainer.limit_val_batches=1", "dataset.num_workers=0"]
    steady += ["trainer.limit_train_batches=2", "trainer.val_check_interval=1.0"]
    train_in_process([*steady, "trainer.max_epochs=3", "trainer.max_steps=-1"], tmp_path / "whole", cache)
    whole = torch.load(tmp_path / "whole" / "checkpoints" / "last.ckpt", weights_only=True)
    # by epochs alone, and with a max_steps beyond them (then Lightning restarts its epoch loop even after a whole
    # epoch)
    for steps in ("-1", "100"):
        short, more = tmp_path / f"short{steps}", tmp_path / f"more{steps}"
        train_in_process([*steady, "trainer.max_epochs=1", f"trainer.max_steps={steps}"], short, cache)
        train_in_process(
            [*steady, "trainer.max_epochs=3", f"trainer.max_steps={steps}", f"ckpt_path={short}"], more, cache
        )
        resumed = torch.load(more / "checkpoints" / "last.ckpt", weights_only=True)
        assert (resumed["global_step"], resumed["epoch"]) == (whole["global_step"], whole["epoch"]) == (6, 3), steps
        assert all(torch.equal(resumed["state_dict"][k], v) for k, v in whole["state_dict"].items()), steps
