"""Host or GPU: where one attention call's time goes, on a CUDA GPU: ``python -m mate_cli.bench.gpu_split
[--backends dense,mate.triton] [--lengths 2048,8192,32768]``.

For each backend, length and mode (inference; train = forward and backward) of the bench's kernel case (BERT-base
dims, the benchmark table, bf16, batch 1), one JSON line: ``called_ms``, the call as made
(``triton.testing.do_bench``); ``gpu_ms``, the same call replayed from a CUDA graph, which is the GPU's time alone;
and ``host_us``, the host's time to enqueue one call while the GPU is kept busy. A call whose ``called_ms`` is well
above ``gpu_ms`` is bound by its launches. ``tools/gpu_run.sh`` runs it as its ``split`` step.
"""

from __future__ import annotations

import json
import time

import torch

from mate_cli.bench import cases


def graph_of(call):
    """``call`` captured in a CUDA graph, after warm-up calls on a side stream (as capture requires)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph


def host_us(call, calls: int = 50) -> float:
    """Host time to enqueue one call, the GPU kept busy by a long sleep so that no enqueue waits for it (a call whose
    allocation has to wait for the GPU still shows that wait as host time)."""
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)
    start = time.perf_counter()
    for _ in range(calls):
        call()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def split(backend: str, length: int, mode: str, capture: bool = True) -> dict:
    """One row (module docstring); ``capture=False`` leaves out ``gpu_ms`` (after a failed capture, which can leave
    the device in a state where the next one fails for that reason alone)."""
    from triton.testing import do_bench

    case = cases.base_kernel_case(backend, mode, length, torch.bfloat16, torch.device("cuda"))
    row = {"backend": backend, "length": length, "mode": mode, "called_ms": do_bench(case.call, warmup=10, rep=40)}
    row["host_us"] = host_us(case.call)
    if not capture:
        row["graph_error"] = "not captured: an earlier capture failed"
        return row
    try:
        row["gpu_ms"] = do_bench(graph_of(case.call).replay, warmup=10, rep=40)
    except Exception as error:  # a call that cannot be captured is a row, not the end of the run
        row["graph_error"] = repr(error)[:300]
    return row


def main() -> None:
    lists = dict(backends=dict(default="dense,mate.triton"), lengths=dict(default="2048,8192,32768"))
    args = cases.gpu_tool_args("gpu_split", __doc__, **lists)
    capture = True
    for backend in args.backends.split(","):
        for length in map(int, args.lengths.split(",")):
            for mode in ("inference", "train"):
                row = split(backend, length, mode, capture)
                capture = capture and "graph_error" not in row
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
