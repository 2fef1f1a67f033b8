"""Every signal a terminal, ssh or a scheduler sends to end a job (SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2,
SIGXCPU) stops a command with ``FAILED`` saying what happened, that line on screen, and exit status 128 + the signal.
Under SLURM, SIGUSR1 (its warning before pre-emption or the time limit) also requeues the job (:func:`requeue_note`).

Inside ``trainer.fit`` the first signal only asks to stop: the batch finishes and a whole ``last.ckpt`` is saved
(:class:`StopOnSignal`); in a validation during fit it stops at the next validation batch, unsaved. Elsewhere, and at
a second signal, the command stops at once (every write is atomic), and its process ends within :data:`END_S` even
where the exception the signal raised is lost (:func:`end_soon`). The same signal again within :data:`REPEAT_S` is
the first one delivered twice, not a second: GNU ``timeout`` sends its TERM to the command and then to the command's
process group, which a Python handler can see as two. Workers signalled with the process group leave it to the main
process (:mod:`mate_cli.data.workers`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.plugins.environments import SLURMEnvironment

from mate_cli.data.workers import SIGNALS
from mate_cli.io import atomic_write_text


class Interrupted(Exception):
    """A command stopped by a signal (or by a lost DDP rank: :mod:`mate_cli.run.ranks`); ``str()`` is the one line for
    ``FAILED``; the exit status 128 + the signal unless given."""

    def __init__(self, signum: int, line: str, exit_code: int | None = None):
        super().__init__(line)
        self.signum = signum
        self.exit_code = exit_code or SIGNALS.get(signum, 128 + signum)


#: seconds within which the first signal's number again is the same request, delivered twice
REPEAT_S = 1.0
#: seconds a command stopped at once has to end by itself (``FAILED`` written, its W&B run closed) before
#: :func:`end_soon` ends its process: the exception a signal raises can be lost, as when it lands in an at-fork hook
#: (logging's, filelock's) while a loader starts its workers, where Python only prints it, or in a ``__del__``
END_S = 5.0


class _State:
    received: int | None = None  # the first signal, until the command ends
    received_at = 0.0  # when (time.monotonic())
    training: StopOnSignal | None = None  # this command's training run, if one started
    deferring = False  # inside trainer.fit: the first signal stops at the next batch end
    pid = 0  # the process whose command this is (forked workers inherit the handler, not the command)
    ending: Interrupted | None = None  # what the command stops with, once it stops at once
    told = False  # the stop's line is in FAILED and on screen
    stopping = threading.Event()  # set at a stop at once (or the task's end): end_soon's watch starts
    finished = threading.Event()  # set when the command's task is over: nothing left for end_soon to end


def install(failed: Path | None = None) -> None:
    """Handle :data:`SIGNALS` in this process (the main thread's command). ``failed``: the run's ``FAILED``, given by
    :func:`~mate_cli.run.task.run_task` in a command's own process: there :func:`end_soon` ends the process."""
    _State.received, _State.training, _State.deferring, _State.pid = None, None, False, os.getpid()
    _State.ending, _State.told, _State.stopping, _State.finished = None, False, threading.Event(), threading.Event()
    for signum in SIGNALS:
        signal.signal(signum, _handle)
    if not getattr(sys.unraisablehook, "mate", False):
        sys.unraisablehook = _unraisable(sys.unraisablehook)
    if failed is not None:  # started now: starting a thread inside a signal handler could wait on a lock held below it
        watch = threading.Thread(target=_watch, args=(_State.stopping, _State.finished, failed), daemon=True)
        watch.start()


def _unraisable(hook):
    """``hook``, quiet about an `Interrupted` lost where Python can only print it (:data:`END_S`'s at-fork hooks): its
    traceback would read as the command's end, which :func:`end_soon` makes and tells."""

    def unraisable(info) -> None:
        if not isinstance(info.exc_value, Interrupted):
            hook(info)

    unraisable.mate = True
    return unraisable


def done() -> None:
    """The command's task is over (its stop told, if any): :func:`end_soon` ends nothing any more."""
    _State.finished.set()
    _State.stopping.set()


def told(stopped: Interrupted) -> None:
    """``stopped``'s line is in ``FAILED`` and on screen: :func:`end_soon` need not tell it again."""
    _State.ending, _State.told = stopped, True


def end_soon(stopped: Interrupted) -> Interrupted:
    """``stopped``, which stops the command now. Should the command not have ended within :data:`END_S` (the
    exception lost on its way, or the way out stuck), ``FAILED`` and the screen get its line and the process ends with
    its exit status; only in a command's own process (:func:`install`'s ``failed``). A later stop's line replaces an
    earlier one's."""
    _State.ending = stopped
    _State.stopping.set()
    return stopped


def _watch(stopping: threading.Event, finished: threading.Event, failed: Path) -> None:
    stopping.wait()
    if finished.wait(END_S) or _State.ending is None:
        return
    stopped, line = _State.ending, f"mate: {_State.ending}\n"
    if not _State.told:  # no logging here: the stuck main thread may hold its locks
        with contextlib.suppress(Exception):
            atomic_write_text(failed, line)
        with contextlib.suppress(OSError):
            os.write(2, line.encode())
    os._exit(stopped.exit_code)


def received() -> int | None:
    return _State.received


def _handle(signum: int, frame) -> None:  # noqa: ARG001 - signal handler signature
    if os.getpid() != _State.pid:  # a forked worker, signalled with its process group before its own handlers are set
        return  # the main process decides
    first = _State.received is None
    if first:
        _State.received, _State.received_at = signum, time.monotonic()
    elif signum == _State.received and time.monotonic() - _State.received_at < REPEAT_S:
        return  # the first one again (timeout's to the command, then to its group): not a second signal
    if first and _State.deferring:
        return  # training stops at the end of this batch, with last.ckpt saved
    raise end_soon(interrupted(signum))


def saved(checkpoint: dict, path: str | Path) -> None:
    """A checkpoint was written whole at ``path``: when it is ``last.ckpt``, what ``ckpt_path=<run dir>`` resumes,
    FAILED names its step (a write a second signal cut short never gets here)."""
    training = _State.training
    if training is not None and Path(path).resolve() == training.last_ckpt.resolve():  # not best-*.ckpt, full or not
        training.saved_step = int(checkpoint.get("global_step", 0))


def cluster_plugins() -> list:
    """The Trainer plugins that leave signals to this module: under SLURM, Lightning's cluster environment without its
    own requeue (which wrote ``hpc_ckpt_*.ckpt`` into the working directory at SIGUSR1)."""
    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


def requeue_note(signum: int) -> str:
    """Under SLURM, SIGUSR1 requeues the job with ``scontrol requeue``: what the ``FAILED`` line adds about it ("" for
    another signal or outside SLURM). Lightning's own requeue is off (:func:`cluster_plugins`)."""
    job = os.environ.get("SLURM_JOB_ID")
    first = os.environ.get("SLURM_PROCID", "0") == "0" and os.environ.get("RANK", "0") == "0"
    if signum != getattr(signal, "SIGUSR1", None) or not job or not first:  # one requeue per job: its first process's
        return ""
    if (scontrol := shutil.which("scontrol")) is None:
        return f"; SLURM job {job} not requeued: no scontrol on PATH"
    try:
        done = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as err:
        return f"; SLURM job {job} not requeued: scontrol requeue {job}: {err}"
    if done.returncode:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[0]
        return f"; SLURM job {job} not requeued: scontrol requeue {job}: {why}"
    return f"; SLURM job {job} requeued (scontrol requeue {job})"


def interrupted(signum: int | None = None) -> Interrupted:
    """The `Interrupted` for ``signum`` (default: the one received), saying where the run stands."""
    signum = signum or _State.received or signal.SIGTERM
    name = signal.Signals(signum).name
    training = _State.training
    if training is None or training.step is None:
        return Interrupted(signum, f"interrupted by {name}; nothing to resume: run the command again")
    at = f"at step {training.step}{' during a validation' if training.validating else ''}"
    if training.saved_step is None:
        return Interrupted(
            signum, f"interrupted by {name} {at}, before any checkpoints/last.ckpt was saved; run the command again"
        )
    held = "" if training.saved_step == training.step else f" (checkpoints/last.ckpt holds step {training.saved_step})"
    return Interrupted(signum, f"interrupted by {name} {at}{held}; resume with ckpt_path={training.run_dir}")


class StopOnSignal(L.Callback):
    """A signal during ``trainer.fit``: finish the batch, save ``last.ckpt``, stop. Listed after ``ResumeState``, whose
    position in the epoch the save records; at the same point of a step as an every-n-steps ``last.ckpt``."""

    def __init__(self, last_ckpt: str | Path) -> None:
        self.last_ckpt = Path(last_ckpt)
        self.run_dir = self.last_ckpt.parent.parent
        self.step: int | None = None
        self.saved_step: int | None = None
        self.validating = False  # stopped inside a validation: unsaved, a resume starts from the last last.ckpt

    def on_train_start(self, trainer, pl_module) -> None:
        self.step = trainer.global_step
        _State.training, _State.deferring = self, True
        if _State.received is not None:  # it came while the data was being prepared
            raise interrupted()

    def on_train_end(self, trainer, pl_module) -> None:
        self.step, _State.deferring = trainer.global_step, False
        if _State.received is not None:  # it came after the last batch
            trainer.save_checkpoint(self.last_ckpt)
            raise interrupted()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self.step, _State.deferring = trainer.global_step, False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.step = trainer.global_step
        if _State.received is not None and not trainer.sanity_checking:
            trainer.save_checkpoint(self.last_ckpt)  # every rank: saving is collective under DDP
            raise interrupted()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if _State.received is not None and trainer.state.fn == "fit":
            self.validating = True
            raise interrupted()
