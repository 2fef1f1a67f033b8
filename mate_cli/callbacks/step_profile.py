"""``mate train ... profile_steps=N``: where a training step's time goes, measured inside a real run.

After ``warmup`` steps (default 10: compilation, autotuning, the loader's start; their wall time is ``warmup_s``) it
times ``N`` steps: examples/s, real tokens/s, ms a step *between steps* (loading, the copy to the device, Lightning's
bookkeeping) and *in the step* on the host (on a GPU it only enqueues, unless it waits), split into forward (other
callbacks' batch-start work and the loss included), backward and optimiser (clipping and the step); the padding share,
the peak memory. Then it watches ``N`` more steps, apart as watching costs host time: the host synchronisations a step
and the lines that made them, for the steps that log (the host reads the logged values there) and the others; on CUDA
the GPU's kernel, copy and fill time a step (summed over streams) and its share of the timed step. A synchronisation
is, on CUDA, what ``torch.cuda.set_sync_debug_mode("warn")`` reports; on a CPU, a host read of a tensor value
(:data:`HOST_READS`) or a data-dependent shape, where a GPU would wait (every tensor counts, even the CPU MATE kernel's
plan; only ``on_before_batch_transfer``'s checks, before the copy to the device, are left out).

Logged in one line, written to ``<run dir>/step_profile.json``, its numbers in ``metrics.json`` as ``profile/*``; on
CUDA the watched window's torch.profiler tables go to ``<run dir>/step_profile_ops.txt``. A run that ends within the
warm-up steps times nothing, and its one line says so.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from mate_cli.io import atomic_write_json, atomic_write_text
from mate_cli.trainer.lightning_internals import is_log_step
from mate_cli.callbacks.throughput import ExcludesValidation, peak_memory_mb, reset_peak_memory

log = logging.getLogger(__name__)

#: the Python-level reads of a tensor's values on the host
HOST_READS = frozenset(
    getattr(torch.Tensor, name)
    for name in ("item", "__bool__", "__int__", "__float__", "__index__", "tolist", "numpy", "cpu")
)
#: the operators whose output shape depends on values (on a GPU the host waits for them)
DATA_DEPENDENT = frozenset({"nonzero", "masked_select"})
#: the hook where a batch is still in host memory before its copy to the device: reads there are no synchronisation
BEFORE_TRANSFER = "on_before_batch_transfer"
#: indexing that is data-dependent with a boolean mask (``x[mask]``)
MASK_INDEXING = frozenset({"index", "index_put", "index_put_"})


class HostReads(TorchFunctionMode):
    """``sites``: where :data:`HOST_READS` (and :class:`DataDependentOps`) happen in this thread, as ``file:line``."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in HOST_READS:
            self.record()
        return func(*args, **(kwargs or {}))

    def record(self) -> None:
        stack = traceback.extract_stack()[:-2]
        if not any(frame.name == BEFORE_TRANSFER for frame in stack):
            self.sites.append(caller(stack))


class DataDependentOps(TorchDispatchMode):
    def __init__(self, reads: HostReads) -> None:
        super().__init__()
        self.reads = reads

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        indices = args[1] if name in MASK_INDEXING and len(args) > 1 and isinstance(args[1], (list, tuple)) else ()
        if name in DATA_DEPENDENT or any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices):
            self.reads.record()
        return func(*args, **(kwargs or {}))


def caller(stack) -> str:
    """``file:line`` of the innermost frame outside torch and this module: the code that read a value."""
    for frame in reversed(stack):
        path = frame.filename.replace("\\", "/")
        if "/torch/" not in path and not path.endswith("step_profile.py"):
            return f"{_short(path)}:{frame.lineno}"
    return "?"


def _short(path: str) -> str:
    for anchor in ("/mate_cli/", "/lightning/", "/lightning_utilities/", "/torchmetrics/"):
        if anchor in path:
            return anchor[1:] + path.rsplit(anchor, 1)[1]
    return path.rsplit("/", 1)[-1]


class SyncCounter:
    """Host synchronisations since :meth:`start`, as :meth:`sites` (CUDA: the sync debug mode's warnings; CPU:
    :class:`HostReads`)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._contexts: list = []

    def start(self) -> None:
        if self.cuda:
            catcher = warnings.catch_warnings(record=True)
            self._seen = catcher.__enter__()
            warnings.simplefilter("always")
            self._contexts = [catcher]
            torch.cuda.set_sync_debug_mode("warn")
        else:
            self._reads = HostReads()
            self._contexts = [self._reads, DataDependentOps(self._reads)]
            for context in self._contexts:
                context.__enter__()

    def sites(self) -> list[str]:
        if self.cuda:
            return [f"{_short(w.filename)}:{w.lineno}" for w in self._seen if "synchroniz" in str(w.message)]
        return list(self._reads.sites)

    def stop(self) -> None:
        if self.cuda and self._contexts:
            torch.cuda.set_sync_debug_mode("default")
        for context in reversed(self._contexts):
            context.__exit__(None, None, None)
        self._contexts = []


class StepProfile(ExcludesValidation):
    def __init__(self, steps: int, warmup: int = 10, path: str | Path | None = None) -> None:
        self.steps, self.warmup = int(steps), int(warmup)
        self.path = Path(path) if path is not None else None
        self.result: dict = {}
        self._timed: list[tuple[float, float, int]] = []  # per step: (between steps s, in the step s, examples)
        self._phases: list[tuple[float, float]] = []  # per timed step: (forward s, backward s) of the host
        self._marks: dict[str, float] = {}
        self._syncs: list[tuple[list[str], bool]] = []  # per watched step: (where it synchronised, whether it logs)
        self._counter: SyncCounter | None = None
        self._first, self._mark, self._logs, self._fit_start = 0, 0, False, time.perf_counter()
        self._profiler = self._tokens = None
        self._step_start = self._last_end = self._window_start = 0.0
        self._padded = 0

    def _sync(self, device: torch.device) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def on_train_start(self, trainer, pl_module) -> None:
        self._first = trainer.global_step  # a resumed run counts from where it starts

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        step, device = trainer.global_step - self._first, pl_module.device
        time_from, watch_from, end = self.warmup, self.warmup + self.steps, self.warmup + 2 * self.steps
        if self._counter is not None:  # the watched step before this one ends here (its logging included)
            self._syncs.append((self._counter.sites()[self._mark :], self._logs))
        if step == 0:
            self._fit_start = time.perf_counter()
        if step == time_from:
            self._sync(device)
            self.result["warmup_s"] = time.perf_counter() - self._fit_start
            reset_peak_memory(device)
            self._window_start = self._last_end = time.perf_counter()
            self.paused = 0.0
        elif step == watch_from:
            self._sync(device)
            self._finish_timing(device, time.perf_counter())
            if device.type == "cuda":
                self._profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
                self._profiler.__enter__()
            self._counter = SyncCounter(device)
            self._counter.start()
        elif step == end:
            self._finish_watching(pl_module)
        if self._counter is not None:
            self._mark, self._logs = len(self._counter.sites()), False
        self._marks = {}
        self._step_start = time.perf_counter()

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self._marks.setdefault("backward", time.perf_counter())

    def on_after_backward(self, trainer, pl_module) -> None:
        self._marks["optimizer"] = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step - 1 - self._first  # the step that just ran (global_step counts it already)
        if self.warmup <= step < self.warmup + self.steps:
            now = time.perf_counter()
            self._timed.append((self._step_start - self._last_end, now - self._step_start, len(batch)))
            backward, optimizer = self._marks.get("backward", now), self._marks.get("optimizer", now)
            self._phases.append((backward - self._step_start, optimizer - backward))
            mask = batch.layout.attention_mask
            self._tokens = mask.sum() if self._tokens is None else self._tokens + mask.sum()
            self._padded += mask.numel()
            self._last_end = now
        elif self._counter is not None:
            self._logs = is_log_step(trainer)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self._counter is not None:  # an epoch's end logs its metrics: its last step counts as a logging step
            self._logs = True

    def _finish_timing(self, device: torch.device, now: float) -> None:
        if not self._timed:
            return
        wall = max(now - self._window_start - self.paused, 1e-9)
        examples = sum(n for _, _, n in self._timed)
        tokens = int(self._tokens)
        n = len(self._timed)
        self.result.update({
            "device": str(device),
            "steps_timed": n,
            "examples_per_s": examples / wall,
            "tokens_per_s": tokens / wall,
            "ms_per_step": 1000 * wall / n,
            "ms_between_steps": 1000 * sum(b for b, _, _ in self._timed) / n,
            "ms_in_step_host": 1000 * sum(s for _, s, _ in self._timed) / n,
            "ms_host_forward": 1000 * sum(f for f, _ in self._phases) / n,
            "ms_host_backward": 1000 * sum(b for _, b in self._phases) / n,
            "ms_host_optimizer": 1000 * sum(s - f - b for (_, s, _), (f, b) in zip(self._timed, self._phases)) / n,
            "padding_share": 1 - tokens / max(self._padded, 1),
            "peak_mem_mb": peak_memory_mb(device),
        })  # fmt: skip

    def _finish_watching(self, pl_module) -> None:
        if self._counter is None:
            return
        self._counter.stop()
        self._counter = None
        self._sync(pl_module.device)
        if self._profiler is not None:
            try:
                self._profiler.__exit__(None, None, None)
                events = self._profiler.key_averages()
                gpu_ms = sum(map(device_time_us, events)) / 1e3 / max(len(self._syncs), 1)
                self.result["gpu_ms_per_step"] = gpu_ms
                if self.result.get("ms_per_step"):  # against the timed steps: the watched ones are slowed by watching
                    self.result["gpu_busy_share"] = gpu_ms / self.result["ms_per_step"]
                if self.path is not None and pl_module.trainer.is_global_zero:
                    newer = events and hasattr(events[0], "self_device_time_total")  # else self_cuda_time_total
                    keys = ("self_cpu_time_total", "self_device_time_total" if newer else "self_cuda_time_total")
                    tables = [events.table(sort_by=key, row_limit=30) for key in keys]
                    atomic_write_text(self.path.with_name("step_profile_ops.txt"), "\n\n".join(tables) + "\n")
            except Exception as err:  # a profiler that fails here must not end the run it measures
                log.warning("step profile: no GPU-busy share (torch.profiler: %s)", err)
            self._profiler = None
        quiet = [sites for sites, logs in self._syncs if not logs]
        logging_steps = [sites for sites, logs in self._syncs if logs]
        self.result.update({
            "steps_watched": len(self._syncs),
            "host_syncs_per_step": sum(map(len, quiet)) / len(quiet) if quiet else None,
            "host_syncs_max": max(map(len, quiet)) if quiet else None,
            "host_syncs_per_logging_step": sum(map(len, logging_steps)) / len(logging_steps) if logging_steps else None,
            "host_sync_sites": dict(Counter(site for sites in quiet for site in sites).most_common(8)),
            "host_sync_sites_logging": dict(Counter(site for sites in logging_steps for site in sites).most_common(8)),
        })  # fmt: skip
        self._report(pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        if self._counter is not None:  # the run ended inside the watched window: report the steps seen whole (the
            self._finish_watching(pl_module)  # last one's window holds the end of training: left out)
        elif self._timed and "examples_per_s" not in self.result:
            self._sync(pl_module.device)
            self._finish_timing(pl_module.device, time.perf_counter())
            self._report(pl_module)
        elif not self._timed and trainer.is_global_zero:
            log.warning(
                "step profile: none, no step_profile.json: the run took %d training step(s), within the profile's %d "
                "warm-up steps; profile_steps=%d times and watches whole with trainer.max_steps >= %d",
                trainer.global_step - self._first, self.warmup, self.steps,
                self._first + self.warmup + 2 * self.steps + 1,
            )  # fmt: skip

    def on_exception(self, trainer, pl_module, exception) -> None:
        if self._counter is not None:
            self._counter.stop()
            self._counter = None
        if self._profiler is not None:
            self._profiler.__exit__(None, None, None)
            self._profiler = None

    def _report(self, pl_module) -> None:
        self.result.update(warmup_steps=self.warmup)
        if self.path is not None and pl_module.trainer.is_global_zero:
            atomic_write_json(self.path, self.result)
        if hasattr(pl_module, "recorded_metrics"):
            numbers = {f"profile/{k}": float(v) for k, v in self.result.items() if isinstance(v, (int, float))}
            pl_module.recorded_metrics.update(numbers)
        shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in self.result.items() if "sites" not in k}
        log.info("step profile: %s", json.dumps(shown))


def device_time_us(event) -> float:
    """One profiler row's own time on the device: kernels, copies and fills, not the host-side operators (whose
    device time is their kernels') or ``record_function`` ranges (the optimiser's step: its whole span, idle too)."""
    if event.device_type == torch.autograd.DeviceType.CPU or getattr(event, "is_user_annotation", False):
        return 0.0
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(event, name):
            return float(getattr(event, name))
    return 0.0
