"""Per training epoch: ``perf/examples_per_s`` (DoT's NPE/s), ``perf/tokens_per_s`` (real tokens) and
``perf/peak_mem_mb`` (CUDA: the allocator's peak this epoch; CPU: the process's peak RSS this epoch on Linux, from the
RSS at its start, which still holds what earlier jobs of a multirun (one process) keep; elsewhere its peak so far). Wall
time includes data loading (what a user waits for) and leaves out validation inside the epoch. The counts stay on the
device until the epoch ends: no training step waits for them. (Lightning's ``ThroughputMonitor`` reports per-step
windows under other names, without memory.)"""

from __future__ import annotations

import gc
import resource
import sys
import time

import lightning as L
import torch

from mate_cli.proc_memory import reset_peak_rss, status_kb


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        gc.collect()
        reset_peak_rss()


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    if (high := status_kb("VmHWM")) is not None:  # Linux
        return high / 2**10
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / (2**20 if sys.platform == "darwin" else 2**10)


class ExcludesValidation(L.Callback):
    """``paused``: the seconds spent in validations inside the fit since it was last set to 0."""

    paused = 0.0
    _validating_since: float | None = None

    def on_validation_start(self, trainer, pl_module) -> None:
        if trainer.training or getattr(trainer.state, "fn", None) == "fit":
            self._validating_since = time.perf_counter()

    def on_validation_end(self, trainer, pl_module) -> None:
        if self._validating_since is not None:
            self.paused += time.perf_counter() - self._validating_since
            self._validating_since = None


class Throughput(ExcludesValidation):
    """For any batch with a ``layout``."""

    def on_train_start(self, trainer, pl_module) -> None:
        self.on_train_epoch_start(trainer, pl_module)  # a run resumed mid-epoch gets no epoch start

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.start, self.examples, self.tokens = time.perf_counter(), 0, 0  # tokens: a device tensor once counted
        self.paused, self._validating_since = 0.0, None
        reset_peak_memory(pl_module.device)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.examples += len(batch)
        self.tokens = batch.layout.attention_mask.sum() + self.tokens  # on the device: read at the epoch's end

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        seconds = max(time.perf_counter() - self.start - self.paused, 1e-9)
        if not self.examples:
            return
        values = {
            "perf/examples_per_s": self.examples / seconds,
            "perf/tokens_per_s": int(self.tokens) / seconds,
            "perf/peak_mem_mb": peak_memory_mb(pl_module.device),
        }
        for name, value in values.items():  # over DDP ranks: the job's rates (sum), the largest process (max)
            reduce = "max" if name == "perf/peak_mem_mb" else "sum"
            pl_module.log(name, value, on_epoch=True, on_step=False, sync_dist=True, reduce_fx=reduce)
