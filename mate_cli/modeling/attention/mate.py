"""MATE attention (Eisenschlos et al., EMNLP 2021, §3): row heads and column heads.

The first ``h_r = round(row_heads_ratio * heads)`` heads are *row heads*, the rest
*column heads*. Token k of the query set Q (query, [CLS], [SEP]) attends to every
real token; a table token attends to Q plus the tokens of its own row (row head) or
column (column head). Padding keys are never attended (paper, eq. for A_k^i).

One config key, ``impl``, picks how that pattern is computed:

- ``masked``: the exact reference, SDPA with the per-head boolean mask
  (quadratic time and memory).
- ``bucketed``: the paper's efficient algorithm (§3.1, App. D; explained in
  :mod:`.mate_reference`, run fused by :mod:`.mate_bucketed`): per-head sort,
  ``global_size`` global tokens, buckets of ``radius`` tokens attending to a 3-bucket
  window. Linear; equals ``masked`` when Q fits in the globals and every row/column
  in ``radius`` tokens, otherwise the paper's approximation. ``cpu_kernel`` lets it
  run its CPU inference forward in a fused C++ kernel.
- ``block_sparse``: exact ``masked`` semantics at block-sparse cost (see
  :mod:`.mate_block_sparse`): FlexAttention where it runs (CUDA), otherwise a
  pure-PyTorch path that packs each row/column segment into a dense block.
- ``auto``: the fastest valid implementation for (device, length, grad mode), as
  the paper does ("the best of the two functionally equivalent implementations is
  chosen for each use case"): ``masked`` up to a device-dependent length,
  ``bucketed`` beyond. Each backend logs its choice once per (device, length bucket, grad).

No parameters: a MATE checkpoint is a BERT/TAPAS checkpoint (§3.2).
"""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F

from mate_cli.errors import MateError
from mate_cli.modeling.attention import mate_cpu_kernel
from mate_cli.modeling.attention.base import AttentionBackend, check_range, register
from mate_cli.modeling.attention.mate_block_sparse import block_sparse_attention, flex_mate_attention
from mate_cli.modeling.attention.mate_bucketed import Workspace, bucketed_attention
from mate_cli.modeling.attention.mate_plan import bucket_plan, head_groups
from mate_cli.modeling.layout import TableLayout

__all__ = ["MateAttention", "IMPLS", "head_masks", "masked_attention", "flex_mate_attention", "choose_impl"]

logger = logging.getLogger(__name__)

IMPLS = ("masked", "bucketed", "block_sparse", "auto")

#: ``auto``: longest sequence for which ``masked`` (fused dense SDPA with a mask) is
#: still the fastest, per (device type, grad mode). CPU: measured on 2 cores, torch
#: 2.13, 12 heads x 64 (masked vs bucketed, ms inference / fwd+bwd: 512: 4.2 vs 4.5 /
#: 14.5 vs 17.9; 640: 7.2 vs 6.2 / 24.9 vs 23.6; 1024: 15.3 vs 8.1 / 50.7 vs 33.9).
#: With the fused CPU kernel (float32 inference, ``mate_cpu_kernel``), bucketed wins from
#: ~384 tokens (ms, masked vs bucketed: 256: 1.1 vs 2.2; 384: 3.2 vs 3.0; 512: 5.1 vs 3.4).
#: CUDA: not measured here; a conservative guess that keeps the exact path longer.
AUTO_MASKED_MAX_LEN = {
    ("cpu", False): 576, ("cpu", True): 576, ("cpu-kernel", False): 384, ("cuda", False): 2048, ("cuda", True): 2048,
}  # fmt: skip


# ------------------------------------------------------------------- reference
def head_masks(layout: TableLayout, num_heads: int, row_heads_ratio: float) -> torch.Tensor:
    """The exact MATE pattern of every head, ``[batch, heads, seq, seq]`` bool (from, to).

    Quadratic: for references, tests and short sequences only.
    """
    views = layout.head_views(num_heads, row_heads_ratio)
    return torch.stack([layout.allowed(v) for v in views], dim=1)


def masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TableLayout, row_heads_ratio: float = 0.5,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Exact MATE by masking dense attention. ``q, k, v``: ``[batch, heads, seq, head_dim]``.

    Row heads and column heads run as two SDPA calls, each with one
    ``[batch, 1, seq, seq]`` mask (``layout.allowed``) broadcast over its heads.
    """
    parts = [
        F.scaled_dot_product_attention(
            q[:, heads], k[:, heads], v[:, heads], attn_mask=layout.allowed(view)[:, None], dropout_p=dropout_p
        )
        for view, heads in head_groups(layout, q.shape[1], row_heads_ratio)
    ]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


# ------------------------------------------------------------------------ auto
def _length_bucket(n: int) -> int:
    """Power-of-two bucket of a sequence length (for logging the auto choice once)."""
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def choose_impl(device: torch.device, seq_len: int, grad: bool, cpu_kernel: bool = True) -> str:
    """``auto``'s choice for (device, length, grad mode): ``masked`` or ``bucketed``.

    ``cpu_kernel``: whether bucketed may use the fused CPU kernel (its limits apply on
    CPU without grad when it is also available).
    """
    kind = device.type
    if kind == "cpu" and not grad and cpu_kernel and mate_cpu_kernel.available():
        kind = "cpu-kernel"
    limit = AUTO_MASKED_MAX_LEN.get((kind, grad), AUTO_MASKED_MAX_LEN[("cuda", grad)])
    return "masked" if seq_len <= limit else "bucketed"


# --------------------------------------------------------------------- backend
@register("mate")
class MateAttention(AttentionBackend):
    """MATE: row and column heads (no parameters).

    Args:
        row_heads_ratio: fraction of row heads; the first ``round(ratio * heads)``
            heads are row heads, the rest column heads (paper: 1:1, i.e. 0.5).
        global_size: ``G``, the global tokens of the bucketed implementation
            (paper: 116). Only used by ``impl=bucketed`` (and ``auto`` when long).
        radius: ``R``, the bucket size of the bucketed implementation (paper: 42).
        impl: ``masked`` | ``bucketed`` | ``block_sparse`` | ``auto`` (module docstring).
        cpu_kernel: let ``bucketed`` run its float32 CPU inference forward in the fused
            C++ kernel (:mod:`.mate_cpu_kernel`) where it builds; False always takes the
            torch path (same function).
        (plus the shared ``num_heads, head_dim, max_length, dropout, layer_index``)
    """

    def __init__(
        self,
        *,
        row_heads_ratio: float = 0.5,
        global_size: int = 116,
        radius: int = 42,
        impl: str = "auto",
        cpu_kernel: bool = True,
        **shared,
    ) -> None:
        super().__init__(**shared)
        check_range("attention.row_heads_ratio", row_heads_ratio, 0.0, 1.0)
        check_range("attention.global_size", global_size, 1)
        check_range("attention.radius", radius, 1)
        if impl not in IMPLS:
            raise MateError(
                f"attention.impl={impl!r} is unknown: choose one of {', '.join(IMPLS)}; "
                "set attention.impl=<name> accordingly"
            )
        for key, value in (("attention.global_size", global_size), ("attention.radius", radius)):
            if int(value) != value:
                raise MateError(f"{key}={value} is invalid: it must be a whole number; set {key}=<int>")
        self.row_heads_ratio = float(row_heads_ratio)
        self.global_size = int(global_size)
        self.radius = int(radius)
        self.impl = impl
        self.cpu_kernel = bool(cpu_kernel)
        #: (device, length bucket, grad) keys whose ``auto`` choice this backend has logged
        self._auto_logged: set[tuple] = set()
        if impl in ("bucketed", "auto") and self.cpu_kernel:
            # build/load the fused CPU kernel now (once per process), not inside the first
            # forward: a FlopCounterMode opened before that call would miss its formula
            mate_cpu_kernel.available()

    def extra_repr(self) -> str:
        return (
            f"impl={self.impl}, row_heads_ratio={self.row_heads_ratio}, "
            f"global_size={self.global_size}, radius={self.radius}, cpu_kernel={self.cpu_kernel}"
        )

    def resolve_impl(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
        """The implementation this call will run (resolves ``auto``, logging each choice once)."""
        if self.impl != "auto":
            return self.impl
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        seq_len = q.shape[2]
        choice = choose_impl(q.device, seq_len, grad, self.cpu_kernel)
        key = (str(q.device), _length_bucket(seq_len), grad)
        if key not in self._auto_logged:
            self._auto_logged.add(key)
            logger.info(
                "mate attention impl=auto: using '%s' on %s for sequences of ~%d tokens (%s)",
                choice, q.device, _length_bucket(seq_len), "training" if grad else "inference",
            )  # fmt: skip
        return choice

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TableLayout | None
    ) -> torch.Tensor:
        """``q, k, v``: ``[batch, heads, seq, head_dim]`` (q not pre-scaled) -> same shape."""
        layout = self.require_layout(layout)
        dropout_p = self.dropout if self.training else 0.0
        impl = self.resolve_impl(q, k, v)
        if impl == "masked":
            return masked_attention(q, k, v, layout, self.row_heads_ratio, dropout_p)
        if impl == "bucketed":
            plan = bucket_plan(layout, q.shape[1], self.row_heads_ratio, self.global_size, self.radius)
            # scratch shared by every layer (and call) that sees this layout, like the plan
            workspace = layout.cached(("mate.workspace",), Workspace)
            return bucketed_attention(
                q, k, v, plan, dropout_p, use_cpu_kernel=self.cpu_kernel, workspace=workspace
            )
        return block_sparse_attention(q, k, v, layout, self.row_heads_ratio, dropout_p)
