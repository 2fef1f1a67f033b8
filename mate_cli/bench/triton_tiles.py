"""Tile sizes and warps of MATE's Triton kernels, timed: ``python -m mate_cli.bench.triton_tiles``.

For each length (``--lengths``) times the bench's kernel cases (the benchmark table, BERT-base dims, bf16, batch 1,
MATE as ``conf/attention/mate.yaml`` sets it) of dense SDPA, then of ``mate.triton`` under each of :data:`SETTINGS`
(recompiled, then restored), inference and forward + backward, with ``triton.testing.do_bench``; one JSON line per
cell, with the tiles visited. Needs a CUDA GPU; :func:`sweep` also runs in Triton's CPU interpreter, as a check of
this tool (its times mean nothing there).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import torch

from mate_cli.bench import cases
from mate_cli.bench.layouts import table_layout
from mate_cli.modeling.attention.mate import triton as mt

#: (query tile, key tile, warps of the forward, dQ and dK/dV kernels); the first is the kernels' default on Hopper
SETTINGS = [(32, 64, 4, 4, 4), (32, 64, 4, 8, 8), (64, 64, 4, 4, 4), (32, 32, 4, 4, 4)]


def _timer(device: torch.device) -> Callable[[Callable[[], None]], float]:
    """ms of a call: ``do_bench`` on CUDA; one call's wall time in the interpreter."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return lambda fn: do_bench(fn, warmup=10, rep=30)

    def once(fn) -> float:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    return once


def sweep(lengths: list[int], settings: list[tuple] = SETTINGS, dims: str = "base",
          device: torch.device | None = None) -> Iterator[dict]:  # fmt: skip
    """One dict per cell: ``{"length", "setting", "forward_ms", "fwd_bwd_ms", "tiles"}`` (``setting`` None: dense
    SDPA; ``error`` instead of times where a setting does not compile)."""
    device = device or torch.device("cuda")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # the interpreter computes bf16 wrongly
    size, time_ms = cases.dims_of(dims), _timer(device)
    saved = dict(mt.BLOCK), dict(mt.WARPS), dict(mt.WARPS_BEFORE_HOPPER)
    mt.WARPS_BEFORE_HOPPER.clear()  # each setting's warps on every GPU
    try:
        for length in lengths:
            _, layout = table_layout(length)

            def timed(backend: str) -> dict:
                calls = [cases.kernel_case(backend, mode, layout, size, 1, dtype, device).call
                         for mode in ("inference", "train")]  # fmt: skip
                return {"forward_ms": time_ms(calls[0]), "fwd_bwd_ms": time_ms(calls[1])}

            yield {"length": length, "setting": None, **timed("dense")}
            structure = mt.TritonStructure.of(layout.to(device), size["num_heads"], 0.5, 116, 42)
            for setting in settings:
                m, n, *warps = setting
                mt.BLOCK.update(m=m, n=n)
                mt.WARPS.update(forward_kernel=warps[0], dq_kernel=warps[1], dkdv_kernel=warps[2])
                row = {"length": length, "setting": list(setting)}
                try:
                    row.update(timed("mate.triton"))
                except Exception as error:  # a setting the compiler refuses is a row, not the end of the sweep
                    row["error"] = repr(error)[:300]
                row["tiles"] = mt.visited_tiles(structure, length)
                yield row
    finally:
        mt.BLOCK.clear(), mt.BLOCK.update(saved[0])
        mt.WARPS.clear(), mt.WARPS.update(saved[1])
        mt.WARPS_BEFORE_HOPPER.update(saved[2])


def main() -> None:
    lengths = dict(default="2048,8192,32768", help="comma-separated sequence lengths")
    args = cases.gpu_tool_args("triton_tiles", __doc__, lengths=lengths)
    for row in sweep([int(n) for n in args.lengths.split(",")]):
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
