"""Encoding question records in worker processes, with progress lines (:func:`encode_records`).

``auto`` worker counts (:func:`worker_counts`): preprocessing processes = the cores this process may run on; loader
workers = a quarter of them, at most 4, and none below 4 cores, where a worker would take a core from the training step
it feeds (collating a batch costs far less than a step); a number of loader workers above the cores is cut to them.
:func:`loader_options`: how every ``DataLoader`` of mate uses them.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from typing import Callable, Iterator, Sequence

import datasets

from mate_cli.errors import MateError

log = logging.getLogger(__name__)

#: seconds between two progress lines
PROGRESS_EVERY_S = 10.0
#: records per process below which fewer processes are started (each loads a tokenizer and tables)
MIN_RECORDS_PER_PROCESS = 64
#: examples converted to Arrow at a time
CHUNK = 1000

_function: Callable | None = None  # the worker processes' function (set by the pool initializer)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def worker_counts(num_proc: int | str, num_workers: int | str) -> tuple[int, int]:
    """``(preprocessing processes, loader workers)`` from ``dataset.num_proc`` and ``dataset.num_workers``; loader
    workers at most one per available core, with a warning: each is a process with memory of its own, and collating
    gains nothing from more workers than cores (``num_workers=100000`` kept starting them, unbounded)."""
    cores = available_cores()
    workers = _count("dataset.num_workers", num_workers, 0 if cores < 4 else min(4, cores // 4), minimum=0)
    if workers > cores:
        log.warning("dataset.num_workers=%d is more loader workers than the %d core(s) this process may use; "
                    "using %d", workers, cores, cores)  # fmt: skip
        workers = cores
    return _count("dataset.num_proc", num_proc, cores, minimum=1), workers


def loader_options(trainer, num_workers: int) -> dict:
    """The ``DataLoader`` arguments every mate loader shares: ``num_workers`` workers (ignoring SIGINT, ending quietly
    at SIGTERM), kept alive across epochs and validations (no restart of the workers each time) and preparing two
    batches each ahead; batches in page-locked memory when ``trainer`` trains on a CUDA device, so that their copies
    to it overlap with the GPU's work."""
    from mate_cli.data.workers import loader_worker_start

    device = getattr(getattr(trainer, "strategy", None), "root_device", None)
    options = {"num_workers": num_workers, "worker_init_fn": loader_worker_start,
               "pin_memory": getattr(device, "type", None) == "cuda"}  # fmt: skip
    if num_workers:
        options.update(persistent_workers=True, prefetch_factor=2)
    return options


def _count(key: str, value: int | str, auto: int, minimum: int) -> int:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return auto
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = None
    if number is None or number < minimum or isinstance(value, float) and value != number:
        raise MateError(
            f"{key}={value!r} is not a count; use a whole number >= {minimum}, or auto (what this machine has)"
        )
    return number


def encode_records(
    function: Callable[[dict], dict | list[dict]],
    records: Sequence[dict],
    num_proc: int,
    what: str,
    *,
    min_per_process: int = MIN_RECORDS_PER_PROCESS,
    progress_every_s: float = PROGRESS_EVERY_S,
) -> datasets.Dataset:
    """The examples ``function`` makes of ``records`` (a dict or a list of them each), as one dataset in record order,
    so they never depend on ``num_proc``. Forked processes inherit ``function``; fewer than ``num_proc`` start where
    there are under ``min_per_process`` records each. Examples become Arrow :data:`CHUNK` at a time, so memory holds
    one chunk of Python objects."""
    processes = max(1, min(int(num_proc), len(records) // max(1, min_per_process)))
    progress = _Progress(len(records), what, processes, progress_every_s)
    parts: list[datasets.Dataset] = []
    buffer: list[dict] = []
    for examples in _results(function, records, processes):
        buffer.extend([examples] if isinstance(examples, dict) else examples)
        progress.step()
        if len(buffer) >= CHUNK:
            parts.append(datasets.Dataset.from_list(buffer))
            buffer = []
    if buffer or not parts:
        parts.append(datasets.Dataset.from_list(buffer) if buffer else datasets.Dataset.from_dict({"question_id": []}))
    progress.done()
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def _results(function: Callable, records: Sequence[dict], processes: int) -> Iterator:
    if processes == 1:
        yield from map(function, records)
        return
    context = multiprocessing.get_context("fork")  # the workers inherit the function and the loaded modules
    with context.Pool(processes, initializer=_set_function, initargs=(function,)) as pool:
        yield from pool.imap(_call, records, chunksize=8)


def _set_function(function: Callable) -> None:
    """A pool worker's start: default signal actions (it ends at any of :data:`~mate_cli.signals.SIGNALS`), not the
    forked handler, which leaves stopping to the main process (:mod:`mate_cli.callbacks.interrupts`)."""
    global _function
    _function = function
    from mate_cli.signals import SIGNALS

    for signum in SIGNALS:
        signal.signal(signum, signal.SIG_DFL)


def _call(record: dict):
    return _function(record)


class _Progress:
    def __init__(self, total: int, what: str, processes: int, every_s: float) -> None:
        self.total, self.what, self.processes, self.every_s = total, what, processes, every_s
        self.count, self.start = 0, time.perf_counter()
        self.last = self.start
        log.info(
            "%s: preprocessing %s questions in %d process%s",
            what,
            f"{total:,}",
            processes,
            "" if processes == 1 else "es",
        )

    def step(self) -> None:
        self.count += 1
        now = time.perf_counter()
        if now - self.last >= self.every_s and self.count < self.total:
            self.last = now
            rate = self.count / (now - self.start)
            eta = _duration((self.total - self.count) / rate)
            log.info("%s: %s/%s questions (%.1f/s, ETA %s)", self.what, f"{self.count:,}", f"{self.total:,}", rate, eta)

    def done(self) -> None:
        elapsed = time.perf_counter() - self.start
        log.info(
            "%s: %s questions preprocessed in %s (%.1f questions/s, %d process%s)",
            self.what,
            f"{self.count:,}",
            _duration(elapsed),
            self.count / max(elapsed, 1e-9),
            self.processes,
            "" if self.processes == 1 else "es",
        )


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"
