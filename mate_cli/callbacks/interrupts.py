"""Every signal a terminal, ssh or a scheduler sends to end a job (SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2,
SIGXCPU) stops a command with ``FAILED`` saying what happened, that line on screen, and exit status 128 + the signal.
Under SLURM, SIGUSR1 (its warning before pre-emption or the time limit) also requeues the job (:func:`requeue_note`).

Inside ``trainer.fit`` the first signal only asks to stop: the batch finishes and a whole ``last.ckpt`` is saved
(:class:`StopOnSignal`); in a validation during fit it stops at the next validation batch, unsaved. Elsewhere, and at
a second signal, the command stops at once (every write is atomic), and its process ends within :data:`END_S` even
where the exception the signal raises is lost or its handler cannot run (:class:`_Watch`). The same signal again
within :data:`REPEAT_S` is the first one delivered twice, not a second: GNU ``timeout`` sends its TERM to the command
and then to the command's process group, which a Python handler can see as two. Workers signalled with the process
group leave it to the main process (:mod:`mate_cli.data.workers`)."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.plugins.environments import SLURMEnvironment

from mate_cli.signals import SIGNALS
from mate_cli.io import atomic_write_text
from mate_cli.trainer.lightning_internals import call_first


class Interrupted(Exception):
    """A command stopped by a signal (or by a lost DDP rank: :mod:`mate_cli.callbacks.ranks`); ``str()`` is the one
    line for ``FAILED``; the exit status 128 + the signal unless given."""

    def __init__(self, signum: int, line: str, exit_code: int | None = None):
        super().__init__(line)
        self.signum = signum
        self.exit_code = exit_code or SIGNALS.get(signum, 128 + signum)


#: seconds within which the first signal's number again is the same request, delivered twice
REPEAT_S = 1.0
#: seconds a command has to end by itself (``FAILED`` written, its W&B run closed) once a second signal came, or it
#: stopped at once (:func:`end_soon`); then its process is ended, ``FAILED`` and the screen saying so. The main thread
#: may never get there: the exception a signal raises is lost where it lands in an at-fork hook (logging's,
#: filelock's) while a loader starts its workers, or in a ``__del__``; a collective waiting for a lost peer, or a
#: handler of Lightning's waiting in one, never returns to Python to run mate's handler
END_S = 5.0
#: seconds a command that has told its stop (``FAILED`` written, the line on screen) has to close what it holds (its
#: W&B run: an online one uploads) before the watch ends its process
CLOSE_S = 60.0


class _State:
    received: int | None = None  # the first signal, until the command ends
    received_at = 0.0  # when (time.monotonic())
    heard: int | None = None  # the first signal, as the watch heard it (the main thread may not have run its handler)
    training: StopOnSignal | None = None  # this command's training run, if one started
    deferring = False  # inside trainer.fit: the first signal stops at the next batch end
    pid = 0  # the process whose command this is (forked workers inherit the handler, not the command)
    ending: Interrupted | None = None  # what the command stops with, once it stops at once
    told = False  # the stop's line is in FAILED and on screen
    watch: _Watch | None = None  # in a command's own process, while run_task runs it


def install(failed: Path | None = None, speaks: bool = True) -> None:
    """Handle :data:`SIGNALS` in this process (the main thread's command). ``failed``: the run's ``FAILED``, given by
    :func:`~mate_cli.run.job.run_task` in a command's own process, which :class:`_Watch` then ends at a second
    signal or a stop at once (:data:`END_S`) if the command does not end by itself; ``speaks``: it writes ``FAILED``
    and the screen's line then (not so a DDP rank > 0)."""
    done()
    _State.received, _State.training, _State.deferring, _State.pid = None, None, False, os.getpid()
    _State.ending, _State.told, _State.heard = None, False, None
    for signum in SIGNALS:
        signal.signal(signum, _handle)
    if not getattr(sys.unraisablehook, "mate", False):
        sys.unraisablehook = _unraisable(sys.unraisablehook)
    if failed is not None and threading.current_thread() is threading.main_thread():
        _State.watch = _Watch(failed if speaks else None)


def done() -> None:
    """The command's task is over (its stop told, if any): nothing left for the watch to end."""
    if _State.watch is not None:
        _State.watch.close()
        _State.watch = None


def told(stopped: Interrupted) -> None:
    """``stopped``'s line is in ``FAILED`` and on screen: the watch need not tell it again, and the command, which is on
    its way out (closing its W&B run, say), has :data:`CLOSE_S` more to end."""
    _State.ending, _State.told = stopped, True
    watch = _State.watch
    if watch is not None:
        watch.note(_Watch.TOLD)


def end_soon(stopped: Interrupted) -> Interrupted:
    """``stopped``, which stops the command now: should the command not have ended within :data:`END_S` (the exception
    lost on its way, or the way out stuck), the watch tells its line and ends the process with its exit status. A
    later stop's line replaces an earlier one's."""
    _State.ending = stopped
    watch = _State.watch  # read once: done() may clear it meanwhile
    if watch is not None:
        watch.note(_Watch.STOP)
    return stopped


class _Watch:
    """A thread reading what Python's own signal handler writes to a pipe (``signal.set_wakeup_fd``), a signal's number
    as it arrives, whatever the main thread is doing, and :func:`end_soon`'s stops: from a second signal (not the
    first one delivered twice: :data:`REPEAT_S`) or such a stop on, the command has :data:`END_S` to end."""

    STOP, TOLD, DONE = 0, 254, 255  # mate's own bytes beside the signal numbers

    def __init__(self, failed: Path | None) -> None:
        self.failed = failed  # None: end quietly
        self.read, self.write = os.pipe()
        self.closed = False
        os.set_blocking(self.write, False)
        self.previous = signal.set_wakeup_fd(self.write, warn_on_full_buffer=False)
        threading.Thread(target=self._run, daemon=True, name="mate-signals").start()

    def note(self, byte: int) -> None:
        if self.closed:  # its descriptor's number may be another file's by now
            return
        with contextlib.suppress(OSError):
            os.write(self.write, bytes([byte]))

    def close(self) -> None:
        with contextlib.suppress(ValueError):  # not the main thread: left to the process's end
            signal.set_wakeup_fd(self.previous)
        self.note(self.DONE)
        self.closed = True
        os.close(self.write)

    def forget(self) -> None:
        """In a forked child: its signals are its own (a loader worker's SIGTERM wrote here too)."""
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(-1)
        for fd in (self.read, self.write):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _run(self) -> None:
        first, first_at, second, deadline = None, 0.0, None, None
        try:
            while True:
                wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not select.select([self.read], [], [], wait)[0]:
                    return self._end(second)
                for byte in os.read(self.read, 4096):
                    now = time.monotonic()
                    if byte == self.DONE:
                        return
                    if byte == self.STOP:
                        deadline = deadline or now + END_S
                    elif byte == self.TOLD and deadline is not None:  # the stop reached the command: not lost
                        deadline = max(deadline, now + CLOSE_S)
                    elif byte in SIGNALS and first is None:
                        first, first_at = byte, now
                        if not self.closed:  # else a bygone command's signal, read after the next one installed
                            _State.heard = byte
                    elif byte in SIGNALS and (byte != first or now - first_at >= REPEAT_S):
                        second, deadline = second or byte, deadline or now + END_S
        finally:
            with contextlib.suppress(OSError):
                os.close(self.read)

    def _end(self, signum: int | None) -> None:
        stopped = _State.ending or interrupted(signum)  # else its handler never ran: the main thread is stuck
        line = f"mate: {stopped}\n"
        if not _State.told and self.failed is not None:  # no logging: the stuck main thread may hold its locks
            with contextlib.suppress(Exception):
                atomic_write_text(self.failed, line)
            with contextlib.suppress(OSError):
                os.write(2, line.encode())
        os._exit(stopped.exit_code)


def _forget_in_child() -> None:
    if _State.watch is not None:
        _State.watch.forget()
        _State.watch = None


os.register_at_fork(after_in_child=_forget_in_child)


def _unraisable(hook):
    """``hook``, quiet about an `Interrupted` lost where Python can only print it (:data:`END_S`'s at-fork hooks): its
    traceback would read as the command's end, which the watch makes and tells."""

    def unraisable(info) -> None:
        if not isinstance(info.exc_value, Interrupted):
            hook(info)

    unraisable.mate = True
    return unraisable


def received() -> int | None:
    return _State.received


def signalled(settle: float = 0.0) -> bool:
    """Whether a signal came, handled or not yet (a main thread stuck in Lightning's own SIGTERM handler, say).
    ``settle``: seconds to give the watch (if any) to hear one already delivered, whose handlers raised before
    mate's ran."""
    deadline = time.monotonic() + settle
    while _State.received is None and _State.heard is None and _State.watch is not None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return _State.received is not None or _State.heard is not None


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
    """The `Interrupted` for ``signum`` (default: the one received, else the one the watch heard), saying where the
    run stands."""
    signum = signum or _State.received or _State.heard or signal.SIGTERM
    return Interrupted(signum, where_it_stands(f"interrupted by {signal.Signals(signum).name}"))


def where_it_stands(what: str) -> str:
    """``what`` stopped the command, then where its run stands: the step, and whether a resume goes on from a
    ``last.ckpt`` (``ckpt_path=<run dir>``) or the command must run again."""
    training = _State.training
    if training is None or training.step is None:
        return f"{what}; nothing to resume: run the command again"
    at = f"at step {training.step}{' during a validation' if training.validating else ''}"
    if training.saved_step is None:
        return f"{what} {at}, before any checkpoints/last.ckpt was saved; run the command again"
    held = "" if training.saved_step == training.step else f" (checkpoints/last.ckpt holds step {training.saved_step})"
    if training.in_sweep:  # the sweep run again resumes it, with the others it cut
        return (
            f"{what} {at}{held}; run the same sweep again to resume it "
            f"(or this job alone: ckpt_path={training.run_dir})"
        )
    return f"{what} {at}{held}; resume with ckpt_path={training.run_dir}"


def _hear_first() -> None:
    """Mate's handler before Lightning's own SIGTERM handler, whose DDP broadcast raises when another rank has ended
    (a broadcast that hangs instead is ended by a second signal: :data:`END_S`); from ``on_train_start`` until
    Lightning puts back the handlers it found. Outside fit, where mate's handler stops the command at once,
    Lightning's comes first, to pass the signal on to the other ranks; should it raise, the signal the watch heard
    is the command's stop (:func:`signalled`)."""
    for signum in SIGNALS:
        call_first(signum, _handle)


def stopping() -> Interrupted | None:
    """What the command stops with at once (:func:`end_soon`), if anything does."""
    return _State.ending


class StopOnSignal(L.Callback):
    """A signal during ``trainer.fit``: finish the batch, save ``last.ckpt``, stop. Listed after ``ResumeState``, whose
    position in the epoch the save records; at the same point of a step as an every-n-steps ``last.ckpt``."""

    def __init__(self, last_ckpt: str | Path, in_sweep: bool = False) -> None:
        self.last_ckpt = Path(last_ckpt)
        self.in_sweep = in_sweep  # a job of a sweep: the sweep run again resumes it
        self.run_dir = self.last_ckpt.parent.parent
        self.step: int | None = None
        self.saved_step: int | None = None
        self.validating = False  # stopped inside a validation: unsaved, a resume starts from the last last.ckpt

    def on_train_start(self, trainer, pl_module) -> None:
        self.step = trainer.global_step
        _State.training, _State.deferring = self, True
        _hear_first()  # while deferring: a first signal returns from mate's, and Lightning's passes it to the ranks
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
