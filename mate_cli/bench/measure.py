"""How one call is measured (:func:`measure`): wall time, peak memory, FLOPs, contention, error against float32.

**Time**: ``time.perf_counter`` around one call (synchronised on CUDA); a cell reports the median (and min/max) of
its timed repeats, which run after the warm-up calls; ``other_cpu`` (:class:`OtherCpu`) is the contention during them.

**Peak memory** (the last warm-up call), CPU: the resident-set high-water mark during the call minus the resident set
just before it (tracemalloc cannot see torch's allocations). Before the call, garbage is collected, every block of
64 KiB or more gets its own ``mmap`` and free heap is trimmed (``malloc_trim``), so RSS tracks live tensor memory;
then ``VmHWM`` is reset (``/proc/self/clear_refs``) and read after the call. So the figure is what the call allocates
(activations, scores, workspaces, gradients, per-batch structure), not the weights or inputs; ``peak_rss_mb`` is the
absolute mark. Timed calls run with glibc's steady-state thresholds (:func:`set_mmap_threshold`), the allocator users
get. CUDA: ``max_memory_allocated`` minus ``memory_allocated`` before the call.

**Error against float32** (``err_vs_fp32``, kernel cells in bfloat16 or float16): :func:`relative_error` of the
cell's dtype against float32 on the same float32-drawn inputs (so the reduced run rounds its inputs, as autocast
does), over the output and, in training, the q, k, v gradients; run once, after the timed calls.

**FLOPs**: ``FlopCounterMode`` over the first warm-up call (matmul-class ops; not elementwise ops, softmax, sorts
or gathers), plus the formulas torch lacks (:func:`_extra_flop_mapping`).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from mate_cli.proc_memory import CLEAR_REFS, proc_field, reset_peak_rss, status_kb

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: mmap threshold while measuring memory (every block >= 64 KiB is returned on free).
MEMORY_MMAP_THRESHOLD = 64 * 1024
#: mmap threshold while timing: glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit.
SPEED_MMAP_THRESHOLD = 32 * 1024 * 1024


def _libc():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:  # pragma: no cover - non-glibc platforms
        return None


_LIBC = _libc()


def set_mmap_threshold(nbytes: int) -> bool:
    """``mallopt(M_MMAP_THRESHOLD, nbytes)`` and ``M_TRIM_THRESHOLD`` = 2 x ``nbytes`` (glibc); True on success. A
    hand-set mmap threshold stops glibc raising the trim threshold with it: left at 128 KiB, every free at the top of
    the heap would return pages the next large block faults in again."""
    if _LIBC is None or not hasattr(_LIBC, "mallopt"):
        return False
    return bool(_LIBC.mallopt(M_MMAP_THRESHOLD, int(nbytes))) and bool(_LIBC.mallopt(M_TRIM_THRESHOLD, 2 * int(nbytes)))


class OtherCpu:
    """CPU used by *other* processes while a block runs, in cores: (machine busy jiffies - this process's) / elapsed;
    1.0: another process kept a core busy (times then show contention). ``cores`` is None without /proc."""

    def __enter__(self) -> "OtherCpu":
        self.cores = None
        self.start = self._sample()
        return self

    def __exit__(self, *exc) -> None:
        end = self._sample()
        if self.start and end:
            busy, own, wall = (e - s for e, s in zip(end, self.start))
            hz = os.sysconf("SC_CLK_TCK")
            self.cores = round(max(0.0, (busy - own) / hz / wall), 2) if wall > 0 else None

    @staticmethod
    def _sample() -> tuple[int, int, float] | None:
        try:
            values = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
            busy = sum(values) - values[3] - (values[4] if len(values) > 4 else 0)  # minus idle, iowait
            stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
            own = int(stat[11]) + int(stat[12])  # utime + stime (fields 14, 15 of proc(5))
        except (OSError, ValueError, IndexError):
            return None
        return busy, own, time.perf_counter()


def available_bytes() -> int:
    """``MemAvailable`` from ``/proc/meminfo`` (or total RAM where that is missing)."""
    value = proc_field("/proc/meminfo", "MemAvailable")  # "123 kB"
    return int(value.split()[0]) * 1024 if value else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class PeakMemory:
    """``with PeakMemory(device) as m: call()`` -> ``m.peak`` (bytes above the start), ``m.high`` (absolute)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.peak: int | None = None
        self.high: int | None = None

    @staticmethod
    def supported(device: torch.device) -> bool:
        return device.type == "cuda" or (status_kb("VmHWM") is not None and CLEAR_REFS.exists())

    def __enter__(self) -> "PeakMemory":
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
            return self
        set_mmap_threshold(MEMORY_MMAP_THRESHOLD)
        if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
            _LIBC.malloc_trim(0)
        self.start = (status_kb("VmRSS") or 0) * 1024
        self.resettable = reset_peak_rss()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.high = torch.cuda.max_memory_allocated()
        elif self.resettable:
            self.high = (status_kb("VmHWM") or 0) * 1024
        if self.high is not None:
            self.peak = max(0, self.high - self.start)
        if not self.cuda:
            set_mmap_threshold(SPEED_MMAP_THRESHOLD)


def timed(call: Callable[[], object], device: torch.device) -> float:
    """Seconds of wall time for one call (module docstring)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    call()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


# ---------------------------------------------------------------------- FLOPs
def _extra_flop_mapping() -> dict:
    """Formulas torch's FlopCounterMode lacks: the CPU SDPA kernels and in-place GEMMs."""
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten

    def sdpa_forward(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return fc.sdpa_flop_count(query_shape, key_shape, value_shape)

    def sdpa_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return fc.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)

    def addmm_(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
        return fc.mm_flop(a_shape, b_shape)

    def addbmm(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:  # and baddbmm_
        return fc.bmm_flop(a_shape, b_shape)

    mapping = {}
    for op, formula in (
        ("_scaled_dot_product_flash_attention_for_cpu", sdpa_forward),
        ("_scaled_dot_product_flash_attention_for_cpu_backward", sdpa_backward),
        ("addmm_", addmm_),
        ("baddbmm_", addbmm),
        ("addbmm", addbmm),
        ("addbmm_", addbmm),
    ):
        packet = getattr(aten, op, None)
        if packet is not None and packet not in fc.flop_registry:
            mapping[packet] = formula
    return mapping


def count_flops(call: Callable[[], object]) -> int:
    """FLOPs of one call under FlopCounterMode (runs the call)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False, custom_mapping=_extra_flop_mapping()) as counter:
        call()
    return int(counter.get_total_flops())


@dataclass
class Measurement:
    times: list[float]
    peak: int | None
    high: int | None
    flops: float | None
    other_cpu: float | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def measure(
    call: Callable[[], object],
    device: torch.device,
    warmup: int,
    repeats: int,
    flops: float | None,
    countable: bool = True,
) -> Measurement:
    """``warmup`` then ``repeats`` calls (each at least 1) as the module docstring says; ``flops`` given or not
    ``countable``: no counting."""
    if device.type == "cpu":
        set_mmap_threshold(SPEED_MMAP_THRESHOLD)
    warmup = max(1, warmup)
    peak = high = None
    for i in range(warmup):
        memory = PeakMemory(device) if i == warmup - 1 else contextlib.nullcontext()
        with memory:
            if i == 0 and flops is None and countable:
                flops = count_flops(call)
            else:
                call()
        if i == warmup - 1:
            peak, high = memory.peak, memory.high
    with OtherCpu() as other:
        times = [timed(call, device) for _ in range(max(1, repeats))]
    return Measurement(times, peak, high, flops, other.cores)


def relative_error(reduced: torch.Tensor, reference: torch.Tensor, real: torch.Tensor | None = None) -> float:
    """Largest ``|reduced - reference|`` over the largest ``|reference|``, in float32, inside ``real`` (a mask
    broadcastable to both, the layout's real tokens: padding rows compute unused values)."""
    a, b = reduced.detach().float(), reference.detach().float()
    if real is not None:
        a, b = a * real, b * real
    return float((a - b).abs().max() / b.abs().max().clamp_min(torch.finfo(torch.float32).tiny))
