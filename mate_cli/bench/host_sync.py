"""No host synchronisation in a training step: ``python -m mate_cli.bench.host_sync``.

Runs the bench's encoder training step (BERT-base dims, the benchmark table, bf16, an AdamW
update) with MATE's ``attention.impl`` (default ``triton``) on CUDA: two warm-up steps, then
one under ``torch.cuda.set_sync_debug_mode("error")``, where any read of a tensor value on
the host (``.item()``, ``.tolist()``, a data-dependent shape) raises. Needs a CUDA GPU.
"""

from __future__ import annotations

import torch

from mate_cli.bench import cases
from mate_cli.bench.layouts import table_layout


def check(impl: str = "triton", length: int = 2048, dtype: torch.dtype = torch.bfloat16) -> str:
    """The training step's verdict in one line; raises where the step synchronises."""
    device = torch.device("cuda")
    input_ids, layout = table_layout(length)
    case = cases.encoder_case(f"mate.{impl}", "train", input_ids, layout, cases.dims_of("base"), dtype, device)
    for _ in range(2):  # the first steps build what later steps reuse (the optimiser's state)
        case.call()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        case.call()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return f"mate.{impl}, {length} tokens, {dtype}: a training step ran with no host synchronisation"


def main() -> None:
    args = cases.gpu_tool_args("host_sync", __doc__, impl=dict(default="triton"), length=dict(type=int, default=2048))
    print(check(args.impl, args.length))


if __name__ == "__main__":
    main()
