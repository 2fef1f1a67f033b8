"""Where one attention call's GPU time goes: ``python -m mate_cli.bench.gpu_profile``.

Runs the bench's kernel case (``--backend``, default ``mate.triton``; BERT-base dims, the benchmark table,
bf16, batch 1) three times to warm up, then five times under ``torch.profiler``, and prints the table of
operators and GPU kernels sorted by GPU time, with the host time beside it: a call whose host time exceeds
its kernels' is bound by launches, not by the GPU. Needs a CUDA GPU.
"""

from __future__ import annotations

import torch

from mate_cli.bench import cases


def profile(backend: str = "mate.triton", length: int = 2048, mode: str = "train",
            dtype: torch.dtype = torch.bfloat16, rows: int = 25) -> str:  # fmt: skip
    """The profiler's table (module docstring)."""
    case = cases.base_kernel_case(backend, mode, length, dtype, torch.device("cuda"))
    for _ in range(3):
        case.call()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(5):
            case.call()
        torch.cuda.synchronize()
    title = f"{backend}, {mode}, {length} tokens, {dtype}: five calls"
    return f"{title}\n{prof.key_averages().table(sort_by='cuda_time_total', row_limit=rows)}"


def main() -> None:
    modes = dict(choices=("inference", "train"), default="train")
    options = dict(backend=dict(default="mate.triton"), length=dict(type=int, default=2048), mode=modes)
    args = cases.gpu_tool_args("gpu_profile", __doc__, **options)
    print(profile(args.backend, args.length, args.mode))


if __name__ == "__main__":
    main()
