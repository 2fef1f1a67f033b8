"""Tile sizes and warps of MATE's Triton kernels, timed: ``python -m mate_cli.bench.triton_tiles``.

For each length (``--lengths``) on the benchmark table (12 heads x 64, bf16, batch 1, G=116, R=42, row heads
1:1), times dense SDPA, then for each setting of :data:`SETTINGS` the forward and the forward and backward of
``attention.impl=triton`` (``triton.testing.do_bench``), with the tiles the kernels visit. One JSON line per cell;
the kernels' settings (:data:`.mate_triton.BLOCK`, :data:`.mate_triton.WARPS`) are restored afterwards. Each setting
compiles the kernels afresh (seconds). Needs a CUDA GPU; :func:`sweep` also runs on CPU tensors in Triton's
interpreter, as a check of this tool (its times mean nothing there).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from mate_cli.bench.layouts import table_layout
from mate_cli.modeling.attention import mate_triton as mt

#: (query tile, key tile, warps of the forward, dQ and dK/dV kernels); the first is the kernels' default
SETTINGS = [(32, 64, 4, 8, 8), (32, 64, 4, 4, 4), (64, 64, 4, 8, 8), (64, 128, 4, 8, 8), (32, 32, 4, 4, 4)]


def _timer(device: torch.device):
    if device.type == "cuda":
        from triton.testing import do_bench

        return lambda fn: do_bench(fn, warmup=10, rep=30)

    def once(fn) -> float:  # the interpreter: one call, wall time
        import time

        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    return once


def sweep(lengths: list[int], settings: list[tuple] = SETTINGS, heads: int = 12, head_dim: int = 64,
          device: torch.device | None = None) -> Iterator[dict]:  # fmt: skip
    """One dict per cell: ``{"length", "setting", "forward_ms", "fwd_bwd_ms", "tiles"}`` (``setting`` None: dense
    SDPA; ``error`` instead of times where a setting does not compile)."""
    device = device or torch.device("cuda")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # the interpreter computes bf16 wrongly
    time_ms = _timer(device)
    saved = dict(mt.BLOCK), dict(mt.WARPS)
    try:
        for length in lengths:
            _, layout = table_layout(length)
            layout = layout.to(device)
            g = torch.Generator(device=device).manual_seed(0)
            bases = [torch.randn(1, length, heads, head_dim, device=device, dtype=dtype, generator=g) for _ in range(3)]
            leaves = [b.requires_grad_() for b in bases]
            q, k, v = (b.transpose(1, 2) for b in leaves)  # the encoder's [B, N, H, D] buffers
            cotangent = torch.randn(q.shape, device=device, dtype=dtype, generator=g)
            structure = mt.TritonStructure.of(layout, heads, 0.5, 116, 42)
            seed = torch.zeros((), dtype=torch.int64, device=device)

            def fwd_bwd(fn):
                def run() -> None:
                    for leaf in leaves:
                        leaf.grad = None
                    fn().backward(cotangent)

                return run

            def dense():
                return F.scaled_dot_product_attention(q, k, v)

            yield {
                "length": length,
                "setting": None,
                "forward_ms": time_ms(dense),
                "fwd_bwd_ms": time_ms(fwd_bwd(dense)),
            }
            for setting in settings:
                m, n, *warps = setting
                mt.BLOCK.update(m=m, n=n)
                mt.WARPS.update(forward_kernel=warps[0], dq_kernel=warps[1], dkdv_kernel=warps[2])

                def mate():
                    return mt.triton_bucketed_attention(q, k, v, structure, 0.0, seed=seed)

                row = {"length": length, "setting": list(setting)}
                try:
                    row.update(forward_ms=time_ms(mate), fwd_bwd_ms=time_ms(fwd_bwd(mate)))
                except Exception as error:  # a setting the compiler refuses is a row, not the end of the sweep
                    row["error"] = repr(error)[:300]
                row["tiles"] = mt.visited_tiles(structure, length)
                yield row
    finally:
        mt.BLOCK.clear(), mt.BLOCK.update(saved[0])
        mt.WARPS.clear(), mt.WARPS.update(saved[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="2048,8192,32768", help="comma-separated sequence lengths")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("mate_cli.bench.triton_tiles: no CUDA GPU here; run it on a machine with one")
    for row in sweep([int(n) for n in args.lengths.split(",")]):
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
