"""A DDP rank lost: Lightning's launcher starts ranks > 0 as processes of rank 0's (``hardware=ddp_cpu``, ``ddp``);
when one of them ends with a failure (``kill -9``, the OOM killer, a crash), rank 0 stops with one line naming it and,
as at a signal, where the run stands (``resume with ckpt_path=<run dir>``), the lost rank's exit status (128 + the
signal that killed it) as its own. The other ranks are killed, so that none writes into the run dir after rank 0.

Lightning's own watch of those processes killed rank 0 with SIGKILL when it saw a failed one, before rank 0 could say
anything; :class:`WatchRanks` takes its place."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

from mate_cli.errors import MateError, find_in_chain
from mate_cli.trainer.lightning_internals import stop_watching_children
from mate_cli.callbacks import interrupts

#: seconds between two looks at the other ranks' processes
POLL_S = 0.5
#: seconds rank 0's own error waits to see whether a rank's loss caused it (a collective whose peer died fails as
#: the peer's sockets close, a moment before the peer can be seen as ended)
SETTLE_S = 2.0


class WatchRanks(L.Callback):
    """In rank 0 of a run whose ranks > 0 it started: watch their processes; a failed one stops the run at once
    (:func:`~mate_cli.callbacks.interrupts.end_soon`, with its line), unless rank 0 failed first on its own. Listed
    after ``StopOnSignal``, whose step the line gives."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.children: list[tuple[int, subprocess.Popen]] = []  # (local rank, process)
        self.lost: interrupts.Interrupted | None = None
        self.failing = False  # rank 0 failed before any rank was seen lost
        self.lock = threading.Lock()

    def setup(self, trainer, pl_module, stage) -> None:
        launcher = trainer.strategy.launcher
        if self.children or not isinstance(launcher, _SubprocessScriptLauncher) or not launcher.procs:
            return
        stop_watching_children(launcher.procs)
        self.children = [(i, proc) for i, proc in enumerate(launcher.procs, 1)]  # local ranks: this node's
        threading.Thread(target=self._watch, daemon=True, name="mate-ranks").start()

    def on_exception(self, trainer, pl_module, exception) -> None:
        """Rank 0's error: a rank's loss, if one is seen ended within :data:`SETTLE_S`, and the run stops with its
        line (Lightning's teardown that follows may wait on the lost rank); else rank 0's own failure."""
        if not self.children or find_in_chain(exception, (MateError, interrupts.Interrupted)):
            self.failing = True
            return
        deadline = time.monotonic() + SETTLE_S
        while not self._look() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.failing = self.lost is None

    def _watch(self) -> None:
        while not self._look() and not self.failing and not interrupts.signalled():
            if all(proc.poll() == 0 for _, proc in self.children):
                return  # every rank finished
            time.sleep(POLL_S)

    def _look(self) -> bool:
        """Whether a rank is lost: the first one seen ended with a failure; the others killed, the run stopping."""
        with self.lock:
            if self.lost is not None:
                return True
            if self.failing or interrupts.signalled():  # rank 0's own failure, or a signal to the ranks
                return False
            ended = [(rank, proc) for rank, proc in self.children if proc.poll() not in (None, 0)]
            if not ended:
                return False
            rank, proc = ended[0]
            for _, other in self.children:
                with contextlib.suppress(OSError):
                    other.kill()  # stuck in a collective with the lost one, or about to write into the run dir
            self.lost = interrupts.end_soon(self._line(rank, proc))
            return True

    def _line(self, rank: int, proc: subprocess.Popen) -> interrupts.Interrupted:
        code = proc.returncode
        if code < 0:
            how, signum, status = f"was killed by {signal.Signals(-code).name}", -code, None
        else:
            log = self.run_dir / f"train_ddp_process_{rank}.log"  # the job name Lightning gives the rank's Hydra run
            where = f" (its log: {log})" if log.is_file() else ""
            how, signum, status = f"exited with status {code}{where}", 0, code
        return LostRank(f"DDP rank {rank} (pid {proc.pid}) {how}", signum, status)


class LostRank(interrupts.Interrupted):
    """A lost rank's stop, whose line says where the run stands when it is told, not when the loss was seen: rank 0
    may finish writing a ``last.ckpt`` in between."""

    def __init__(self, what: str, signum: int, exit_code: int | None) -> None:
        super().__init__(signum, what, exit_code)
        self.what = what

    def __str__(self) -> str:
        return interrupts.where_it_stands(self.what)
