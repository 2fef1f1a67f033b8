"""A sweep run again: ``mate train -m ...`` (or ``mate pretrain -m``) with the same ``hydra.sweep.dir=`` continues it.

The sweep's folder is claimed again when it holds this sweep (:func:`mate_cli.run.lock.claim`; another sweep there
is refused, naming what changed), and each job's folder, ``<job number>-<its overrides>``, is the one it had. What
that folder holds decides what the job does (:func:`earlier_state`):

- ``metrics.json``: it finished earlier; it is not trained again, its metrics are its result ("done earlier");
- ``checkpoints/last.ckpt`` and no ``metrics.json``: it was cut (a signal, a time limit, its ``trainer.max_time``); it
  resumes from there exactly as ``ckpt_path=<its folder>`` does;
- anything else (never started, cut before its first checkpoint, failed): it starts again; a ``FAILED`` left by the
  earlier call goes, its outcome is this call's (bad input fails again, in its one line).

A job that resumes with other values of what fixes its function (seed, attention, model, dataset) than its folder
recorded is refused in one line: that is another sweep.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from mate_cli.errors import MateError

log = logging.getLogger(__name__)

DONE, CUT, START = "done earlier", "cut", "start"


def is_sweep_job() -> bool:
    """Whether this process runs a job of a sweep (``-m``)."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def earlier_state(out: Path) -> str:
    """What a sweep job's folder ``out`` holds of an earlier call: :data:`DONE`, :data:`CUT` or :data:`START`."""
    if (out / "metrics.json").is_file():
        return DONE
    if (out / "checkpoints" / "last.ckpt").is_file():
        return CUT
    return START


def done_earlier(out: Path) -> dict | None:
    """The metrics of this sweep job's earlier, finished run in ``out``; None when it is no sweep job or has none."""
    if not is_sweep_job() or earlier_state(out) != DONE:
        return None
    path = out / "metrics.json"
    try:
        metrics = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise MateError(
            f"{path} cannot be read ({type(err).__name__}: {err}); remove it to train this job again"
        ) from None
    if not isinstance(metrics, dict):
        raise MateError(f"{path} holds no JSON object; remove it to train this job again")
    log.info("%s: done earlier (its metrics.json); not trained again", out.name)
    return metrics


def resume_point(out: Path) -> str | None:
    """``out`` itself (to resume as ``ckpt_path=`` does) when this sweep job was cut after a checkpoint; else None.
    Either way the earlier call's ``FAILED`` goes."""
    if not is_sweep_job():
        return None
    state = earlier_state(out)
    (out / "FAILED").unlink(missing_ok=True)  # taken again: its outcome is this call's
    if state == CUT:
        log.info("%s: cut earlier; resuming from its checkpoints/last.ckpt", out.name)
        return str(out)
    return None


def refuse_changed_job(out: Path, changed: list[str]) -> None:
    """A cut job resumed with other values than its folder recorded (``changed``, as ``key (before -> now)``)."""
    if changed and is_sweep_job():
        shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
        raise MateError(
            f"the job in {out} ran with other values ({shown}): this is another sweep; pass a new hydra.sweep.dir= "
            "for it, or run the earlier sweep as it ran to continue it"
        )


# ------------------------------------------------------------------ the sweep's own process
class _Stop:
    folder: Path | None = None  # the sweep dir this process launches jobs into
    signum: int | None = None  # the first signal it received


def watch_signals(folder: Path | None) -> None:
    """In the process that launches a sweep's jobs into ``folder``: a signal (Ctrl-C, a time limit) is passed on,
    once, to each job running in another process (joblib's workers, submitit's jobs), which saves its last.ckpt and
    stops, ending the job but not its process (:func:`in_worker`) (the same signal from the process group too is one
    request: :data:`mate_cli.callbacks.interrupts.REPEAT_S`); the sweep's lock file then says so, and a job that
    starts after it does not train (:func:`not_started`). Jobs run in this process (the basic launcher) handle it
    themselves. ``folder`` None: the sweep dir Hydra chooses."""
    import signal

    from mate_cli.signals import SIGNALS

    _Stop.folder, _Stop.signum = None if folder is None else Path(folder).resolve(), None
    mark_sweep_process()
    for signum in SIGNALS:
        signal.signal(signum, _on_signal)


def _on_signal(signum: int, frame) -> None:  # noqa: ARG001 - signal handler signature
    import os

    from mate_cli.run import lock as run_lock

    folder = _Stop.folder
    if folder is None and HydraConfig.initialized():  # the sweep dir Hydra chose
        folder = _Stop.folder = Path(HydraConfig.get().sweep.dir).resolve()
    if folder is None or not folder.is_dir():
        _Stop.signum = _Stop.signum or signum
        return
    if _Stop.signum is None:
        _Stop.signum = signum
        with open(folder / run_lock.LOCK_NAME, "a") as handle:  # the lock stays this process's (flock is per file)
            handle.write(f"stopped {signum}\n")
    for job in (p for p in folder.iterdir() if p.is_dir()):
        pid = run_lock.holder(job)
        if pid is not None and pid.isdigit() and _is_child(int(pid)):  # never a pid of another machine's job
            try:
                os.kill(int(pid), signum)
            except ProcessLookupError:
                pass


def _is_child(pid: int) -> bool:
    """Whether ``pid`` is a process this one started (joblib's workers, submitit's local jobs): a lock file on a
    shared disk may name a job's pid on another machine (SLURM), which here is some other process."""
    import os

    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rfind(")") + 2 :].split()  # after the command name, which may hold spaces
    return len(fields) > 1 and fields[1] == str(os.getpid())


def stopped_by() -> int | None:
    """The signal that stopped the sweep this process launched, if one did."""
    return _Stop.signum


#: set by the sweep's own process for the jobs it starts in others
PARENT_ENV = "MATE_SWEEP_PID"


def mark_sweep_process() -> None:
    import os

    os.environ[PARENT_ENV] = str(os.getpid())


def in_worker() -> bool:
    """Whether this sweep job runs in another process than the sweep's (joblib, submitit): its stop then ends the job,
    not the process, so that the launcher lets the other jobs save their own last.ckpt and stop."""
    import os

    parent = os.environ.get(PARENT_ENV, "")
    return is_sweep_job() and parent.isdigit() and int(parent) != os.getpid()


def not_started() -> bool:
    """A sweep job about to start after its sweep was stopped by a signal: one line, and True (it must not start; its
    folder keeps nothing but Hydra's records, so the next call starts it); a job in the sweep's own process ends the
    process with exit status 128 + the signal."""
    import signal
    import sys

    from mate_cli.run import lock as run_lock

    if not is_sweep_job():
        return False
    lock_file = Path(HydraConfig.get().sweep.dir).resolve() / run_lock.LOCK_NAME
    try:
        lines = lock_file.read_text(encoding="utf-8").split()
    except OSError:
        return False
    if "stopped" not in lines or not lines[-1].isdigit():
        return False
    signum = int(lines[-1])
    print(f"mate: {Path(HydraConfig.get().runtime.output_dir).name}: not started, the sweep was stopped by "
          f"{signal.Signals(signum).name}; run it again to continue", file=sys.stderr)  # fmt: skip
    if not in_worker():
        sys.exit(128 + signum)
    return True


def stopped_line(folder: Path, signum: int) -> str:
    import signal

    return (
        f"mate: the sweep in {folder} was stopped by {signal.Signals(signum).name}: its finished jobs are kept, the "
        "cut ones saved their last.ckpt; run the same command again to continue it"
    )


def sweep_folder(given: Path | None) -> Path | None:
    """The folder of the sweep this process ran: ``given``, else the one Hydra chose (still set once it returns)."""
    if given is not None:
        return Path(given).resolve()
    if _Stop.folder is not None:
        return _Stop.folder
    return Path(HydraConfig.get().sweep.dir).resolve() if HydraConfig.initialized() else None


def unfinished_jobs(folder: Path) -> list[tuple[str, str]]:
    """``(job number, why)`` for each job folder of the sweep in ``folder`` without ``metrics.json``: its ``FAILED``
    line, else cut by its budget (a ``last.ckpt``), else not started."""
    left = []
    for job in sorted(p for p in folder.iterdir() if (p / ".hydra").is_dir()):
        if (job / "metrics.json").is_file():
            continue
        failed = job / "FAILED"
        if failed.is_file():
            line = failed.read_text(encoding="utf-8", errors="replace").strip().splitlines() or ["failed"]
            why = line[0].removeprefix("mate: ").split("; ")[0]  # what stopped it, without its own resume hint
        else:
            why = "cut by trainer.max_time" if earlier_state(job) == CUT else "not started"
        left.append((job.name.split("-", 1)[0], why))
    return sorted(left, key=lambda item: int(item[0]) if item[0].isdigit() else 0)


def end_of_sweep(folder: Path | None) -> tuple[str, int] | None:
    """The sweep's last line and exit status when some of its jobs did not finish (a job's own signal, its budget, a
    failure in another process); None when all did. A job that failed or was stopped makes the status 1; jobs only
    their budget cut leave it 0: the next call goes on."""
    if folder is None or not folder.is_dir():
        return None
    jobs = [p for p in folder.iterdir() if (p / ".hydra").is_dir()]
    if not (left := unfinished_jobs(folder)):
        return None
    shown = "; ".join(f"job {number}: {why}" for number, why in left[:3]) + ("; ..." if len(left) > 3 else "")
    status = 1 if any(why not in ("cut by trainer.max_time", "not started") for _, why in left) else 0
    return (
        f"mate: the sweep in {folder}: {len(left)} of {len(jobs)} jobs did not finish ({shown}); run the same "
        "command again to continue it",
        status,
    )
