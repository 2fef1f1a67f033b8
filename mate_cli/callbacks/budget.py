"""The time a run trains: ``trainer.max_time`` as each call's budget, and the minutes of all its calls.

Lightning's own ``max_time`` ends a run as if it were finished, and a resume restores its clock, so a run it cut
would stop again at once. Here it is the budget of one call (one ``mate train``, one job of a sweep): when a training
batch ends with it spent, the run saves ``checkpoints/last.ckpt`` there, as a signal's stop does, and ends *without*
``metrics.json``. Running the same command again (a sweep: the same ``hydra.sweep.dir=``; one run:
``ckpt_path=<run dir>``) goes on from there, under that call's budget. The minutes every call trained add up in
the checkpoint and reach ``metrics.json`` as ``time/fit_minutes``.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Timer

from mate_cli.errors import MateError

MINUTES_KEY = "time/fit_minutes"


class BudgetSpent(Exception):
    """A run stopped by its call's ``trainer.max_time``, ``last.ckpt`` saved at ``step``."""

    def __init__(self, step: int, budget: str, run_dir: Path) -> None:
        self.step, self.run_dir = step, run_dir
        super().__init__(
            f"trainer.max_time={budget}: this call's training time is spent at step {step}; checkpoints/last.ckpt "
            f"holds it, and no metrics.json is written: run the same sweep again (the same hydra.sweep.dir=) or "
            f"resume with ckpt_path={run_dir} to go on"
        )


def budget_seconds(max_time) -> float | None:
    """``trainer.max_time`` as Lightning reads it (``DD:HH:MM:SS``, ``{hours: 1}``, a timedelta) in seconds; None for
    no budget. A value Lightning refuses is one line."""
    if max_time in (None, ""):
        return None
    if isinstance(max_time, timedelta):
        return max_time.total_seconds()
    try:
        seconds = Timer(duration=dict(max_time) if hasattr(max_time, "keys") else max_time)._duration
    except Exception:  # noqa: BLE001 - Lightning's MisconfigurationException, or timedelta's TypeError
        seconds = None
    if seconds is None or seconds <= 0:
        raise MateError(
            f"trainer.max_time={max_time} is no time budget; use DD:HH:MM:SS (00:02:00:00: two hours) or "
            "{hours: 2}, more than zero"
        )
    return seconds


class FitClock(L.Callback):
    """Times the fit of every call (``time/fit_minutes``); with a budget, stops the call once it is spent. Listed
    after :class:`mate_cli.run.resume.ResumeState`, whose position in the epoch the save records."""

    def __init__(self, last_ckpt: str | Path, max_time=None) -> None:
        self.last_ckpt = Path(last_ckpt)
        self.budget = str(max_time) if max_time not in (None, "") else None
        self.seconds = budget_seconds(max_time)
        self.earlier = 0.0  # the seconds the calls before this one trained (from the resumed checkpoint)
        self.started: float | None = None

    def minutes(self) -> float:
        """The minutes all calls of this run trained, up to now."""
        return (self.earlier + self._this_call()) / 60

    def _this_call(self) -> float:
        return 0.0 if self.started is None else time.monotonic() - self.started

    def on_train_start(self, trainer, pl_module) -> None:
        self.started = time.monotonic()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.seconds is None or trainer.sanity_checking:
            return
        if trainer.strategy.broadcast(self._this_call() >= self.seconds):  # rank 0's clock: all ranks stop at one step
            trainer.save_checkpoint(self.last_ckpt)  # every rank: saving is collective under DDP
            raise BudgetSpent(trainer.global_step, str(self.budget), self.last_ckpt.parent.parent)

    def state_dict(self) -> dict:
        return {"seconds": self.earlier + self._this_call()}

    def load_state_dict(self, state_dict: dict) -> None:
        self.earlier = float(state_dict.get("seconds", 0.0))
