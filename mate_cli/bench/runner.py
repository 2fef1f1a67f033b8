"""The benchmark grid: level x mode x backend x length -> one row per cell, lengths ascending so that a backend's
earlier lengths predict its next.

A cell is skipped with a note when its backend is unavailable at that level; when its estimated peak memory exceeds
``memory_fraction`` of the memory free right before it (the larger of :func:`analytic_memory` and a power-law
extrapolation from the backend's two previous lengths, exponent in [1, 2]); when its extrapolated time per call exceeds
``max_call_seconds``; or when the backend failed, or was skipped for memory, at a shorter length. A cell that raises is
an ``error`` row with the one-line reason, and the grid goes on."""

from __future__ import annotations

import functools
import gc
import math
import os
import platform
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

from mate_cli.bench import cases, measure
from mate_cli.bench.layouts import TableShape, describe, table_layout
from mate_cli.errors import MateError
from mate_cli.proc_memory import proc_field

#: Backends that materialise ``[batch, heads, seq, seq]`` scores (analytic memory floor).
QUADRATIC_MEMORY = ("mate.masked", "sat", "tapas_hf")

COLUMNS = (
    "level", "mode", "backend", "seq_len", "batch", "dims", "dtype", "device", "threads",
    "status", "time_ms", "time_ms_min", "time_ms_max", "repeats",
    "peak_mem_mb", "peak_rss_mb", "flops", "tokens_per_s", "other_cpu", "err_vs_fp32", "note",
)  # fmt: skip


@dataclass
class Settings:
    """Everything a run needs (``bench.*`` of ``conf/bench.yaml``)."""

    levels: list[str]
    modes: list[str]
    lengths: list[int]
    linear_lengths: list[int]
    backends: dict[str, list[str]]
    linear_backends: dict[str, list[str]] = field(default_factory=dict)
    max_length: dict[str, int | None] = field(default_factory=dict)  # <level>_<mode> -> longest (None: any)
    dims: str = "base"
    dtype: str = "float32"
    device: str = "cpu"
    batch: int = 1
    threads: int | None = None
    schedule: list[dict] = field(default_factory=lambda: [{"max_length": None, "warmup": 1, "repeats": 3}])
    table: TableShape = field(default_factory=TableShape)
    memory_fraction: float = 0.85
    max_call_seconds: float = 120.0

    def check(self) -> None:
        for key, values, allowed in (
            ("bench.levels", self.levels, cases.LEVELS),
            ("bench.modes", self.modes, cases.MODES),
        ):
            bad = [v for v in values if v not in allowed]
            if bad:
                raise MateError(f"{key} has unknown entries {bad}; choose from {list(allowed)}")
        if not self.lengths:
            raise MateError("bench.lengths is empty; give at least one sequence length")
        if self.batch < 1:
            raise MateError(f"bench.batch={self.batch} must be >= 1")
        cases.dims_of(self.dims)
        cases.dtype_of(self.dtype)
        lists = (self.backends, self.linear_backends)
        for name in dict.fromkeys(name for level in self.levels for names in lists for name in names.get(level, [])):
            cases.check_name(name)

    def plan(self, level: str, length: int) -> tuple[int, int]:
        """``(warmup, repeats)`` of the first ``bench.schedule`` entry whose ``level`` (if given) matches and whose
        ``max_length`` (null: any) is >= ``length``."""
        for step in self.schedule:
            limit, only = step.get("max_length"), step.get("level")
            if (only is None or only == level) and (limit is None or length <= int(limit)):
                return int(step.get("warmup", 1)), int(step.get("repeats", 1))
        return 1, 1

    def lengths_for(self, level: str, mode: str, backend: str) -> list[int]:
        """``lengths`` (+ ``linear_lengths`` for the level's linear backends), capped by ``max_length``."""
        extra = self.linear_lengths if backend in self.linear_backends.get(level, []) else []
        cap = self.max_length.get(f"{level}_{mode}")
        return sorted(n for n in set(map(int, self.lengths)) | set(map(int, extra)) if cap is None or n <= int(cap))

    def cells(self) -> list[tuple[str, str, str, int]]:
        return [
            (level, mode, backend, length)
            for level in self.levels
            for mode in self.modes
            for backend in self.backends.get(level, [])
            for length in self.lengths_for(level, mode, backend)
        ]


def machine(settings: Settings) -> dict:
    """What the numbers were measured on."""
    device = torch.device(settings.device)
    info = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": proc_field("/proc/cpuinfo", "model name") or platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "device": str(device),
        "mem_total_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "mem_available_gb": round(measure.available_bytes() / 2**30, 1),
        "load_avg_1_5_15_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    import transformers

    info["transformers"] = transformers.__version__
    return info


# ------------------------------------------------------------------ estimates
def _extrapolate(points: list[tuple[int, float]], length: int, low: float, high: float) -> float | None:
    """Power-law extrapolation from the last two ``(length, value)`` points (exponent in [low, high])."""
    points = [(n, v) for n, v in points if v and v > 0]
    if not points:
        return None
    if len(points) == 1:
        (n0, v0), exponent = points[-1], high
    else:
        (n1, v1), (n0, v0) = points[-2], points[-1]
        exponent = math.log(v0 / v1) / math.log(n0 / n1) if n0 != n1 else high
    exponent = min(max(exponent, low), high)
    return v0 * (length / n0) ** exponent


def analytic_memory(backend: str, level: str, mode: str, length: int, dims: dict, batch: int, itemsize: int) -> float:
    """A lower bound on the peak for backends that materialise full score matrices, else 0."""
    if backend not in QUADRATIC_MEMORY and not (backend == "bert_hf" and level == "encoder"):
        return 0.0
    scores = batch * dims["num_heads"] * length * length * max(itemsize, 4)
    if level == "kernel":
        return scores * (2 if mode == "inference" else 3)
    kept = dims["num_layers"] if mode == "train" else 1  # probabilities saved for backward
    return scores * (2 + kept)


@dataclass
class History:
    """Measured (length, peak bytes, seconds) per (level, mode, backend), and sticky failures."""

    points: dict = field(default_factory=dict)
    dead: dict = field(default_factory=dict)

    def add(self, key, length: int, peak: int | None, seconds: float) -> None:
        self.points.setdefault(key, []).append((length, peak, seconds))

    def estimate(self, key, length: int) -> tuple[float | None, float | None]:
        points = self.points.get(key, [])
        memory = _extrapolate([(n, p) for n, p, _ in points], length, 1.0, 2.0) if len(points) >= 2 else None
        seconds = _extrapolate([(n, s) for n, _, s in points], length, 1.0, 2.2)
        return memory, seconds


# ------------------------------------------------------------------ the grid
def row_for(settings: Settings, level: str, mode: str, backend: str, length: int, **values) -> dict:
    row = {c: "" for c in COLUMNS}
    row.update(
        level=level, mode=mode, backend=backend, seq_len=length, batch=settings.batch, dims=settings.dims,
        dtype=settings.dtype, device=settings.device, threads=torch.get_num_threads(),
    )  # fmt: skip
    row.update(values)
    return row


def run_grid(settings: Settings, on_cell: Callable[[dict], None]) -> None:
    """Measure every cell of ``settings`` (checked), handing each row to ``on_cell`` (progress, the partial CSV)."""
    if settings.threads:
        torch.set_num_threads(int(settings.threads))
    device = torch.device(settings.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise MateError("bench.device=cuda but no CUDA device is visible; use bench.device=cpu")
    dims, dtype = cases.dims_of(settings.dims), cases.dtype_of(settings.dtype)
    inputs = {n: table_layout(n, settings.batch, settings.table) for n in {c[3] for c in settings.cells()}}
    history = History()
    for level, mode, backend, length in settings.cells():
        on_cell(run_cell(settings, history, level, mode, backend, length, inputs[length], dims, dtype, device))


def run_cell(settings, history, level, mode, backend, length, inputs, dims, dtype, device) -> dict:
    key = (level, mode, backend)
    base = functools.partial(row_for, settings, level, mode, backend, length)
    if key in history.dead:
        return base(status="skipped", note=history.dead[key])
    input_ids, layout = inputs
    est_memory, est_seconds = history.estimate(key, length)
    floor = analytic_memory(backend, level, mode, length, dims, settings.batch, dtype.itemsize)
    est_memory = max(est_memory or 0.0, floor)
    budget = settings.memory_fraction * available_now(device)
    if est_memory > budget:
        note = f"estimated peak {est_memory / 2**30:.1f} GiB > {budget / 2**30:.1f} GiB available"
        history.dead[key] = f"skipped at a shorter length ({note})"
        return base(status="skipped", note=note)
    if est_seconds is not None and est_seconds > settings.max_call_seconds:
        note = f"estimated {est_seconds:.0f} s per call > bench.max_call_seconds={settings.max_call_seconds:g}"
        return base(status="skipped", note=note)
    warmup, repeats = settings.plan(level, length)
    try:
        if level == "kernel":
            case = cases.kernel_case(backend, mode, layout, dims, settings.batch, dtype, device)
        else:
            case = cases.encoder_case(backend, mode, input_ids, layout, dims, dtype, device)
        result = measure.measure(case.call, device, max(warmup, case.min_warmup), repeats, case.flops, case.countable)
        error, error_note = float32_error(case)
    except cases.Unavailable as err:
        history.dead[key] = str(err)
        return base(status="skipped", note=str(err))
    except (MemoryError, torch.OutOfMemoryError) as err:
        history.dead[key] = f"out of memory at {length}"
        return base(status="error", note=f"out of memory: {one_line(err)}")
    except Exception as err:  # noqa: BLE001 - one backend's failure must not end the grid
        history.dead[key] = f"failed at {length}"
        return base(status="error", note=f"{type(err).__name__}: {one_line(err)}")
    finally:
        case = None
        gc.collect()
    history.add(key, length, result.peak, result.median)
    mb = lambda b: "" if b is None else round(b / 2**20, 1)  # noqa: E731
    return base(
        status="ok",
        time_ms=round(result.median * 1e3, 3),
        time_ms_min=round(min(result.times) * 1e3, 3),
        time_ms_max=round(max(result.times) * 1e3, 3),
        repeats=len(result.times),
        peak_mem_mb=mb(result.peak),
        peak_rss_mb=mb(result.high),
        flops="" if result.flops is None else int(result.flops),
        tokens_per_s=round(settings.batch * length / result.median, 1),
        other_cpu="" if result.other_cpu is None else result.other_cpu,
        err_vs_fp32="" if error is None else f"{error:.2e}",
        note="; ".join(filter(None, [layout_note(layout) if backend == "dense" else "", error_note])),
    )


def float32_error(case: cases.Case) -> tuple[float | None, str]:
    """``(case.error(), "")``, or ``(None, why)`` when the comparison fails (out of memory, say): the timing stands."""
    if case.error is None:
        return None, ""
    try:
        return case.error(), ""
    except Exception as err:  # noqa: BLE001 - the measured cell is kept either way
        return None, f"err_vs_fp32 not measured ({type(err).__name__}: {one_line(err)})"


def available_now(device: torch.device) -> float:
    return float(torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else measure.available_bytes())


def layout_note(layout) -> str:
    d = describe(layout)
    return (
        f"table: |Q|={d['query']}, {d['rows']} rows x {d['columns']} cols, "
        f"longest row {d['longest_row']} / column {d['longest_column']} tokens"
    )


def one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300]


def select(rows: Iterable[dict], **where) -> list[dict]:
    return [r for r in rows if all(r.get(k) == v for k, v in where.items())]
