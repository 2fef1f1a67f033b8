"""MATE attention (Eisenschlos et al., EMNLP 2021, §3): row heads and column heads.

The first ``round(row_heads_ratio * heads)`` heads are row heads, the rest column heads. A query-set token attends to
every real token; a table token to the query set and its own row (row head) or column (column head); padding keys
never. No parameters: a MATE checkpoint is a BERT/TAPAS checkpoint (§3.2).

``variant`` is *which function* the model computes (training, evaluation, PointR and exported encoders alike):

- ``exact``: the pattern above.
- ``bucketed``: the paper's linear-cost approximation (§3.1, App. D; explained in :mod:`.reference`, with the one
  way it differs from App. D):
  ``global_size`` (G) global tokens per head, buckets of ``radius`` (R) tokens. It equals ``exact`` when the query set
  fits in G and every row/column in R tokens; otherwise a table token outside the global part loses the part of its
  row/column beyond its window (the paper's fine-tuning setting: G=116, R=42 at 2048 tokens, App. A).

``impl`` is *how* (the same output up to float rounding; different, equally valid dropout masks):

- ``exact``: ``masked`` (SDPA with the per-view mask; quadratic) or ``block_sparse`` (:mod:`.block_sparse`).
- ``bucketed``: ``eager`` (:mod:`.bucketed`'s torch path), ``kernel`` (:mod:`.cpu_kernel`; ``eager`` where
  it does not apply) or ``triton`` (:mod:`.triton`).
- ``auto``: the variant's fastest implementation as measured (:data:`AUTO`), never another function: ``exact`` runs
  ``masked`` up to a length, else ``block_sparse``; ``bucketed`` runs ``kernel`` on CPU, ``triton`` on CUDA in
  bf16, fp16 and float32 where the compiled kernels run (:func:`.triton.triton_runs_on`), else ``eager``. Each
  choice is logged once per process.

A key bias (``layout.key_bias``, DoT's pruning scores) always runs ``masked`` (DoT's task model reads few tokens);
only ``variant=exact`` supports it.

This package: the backend (here), the bucket plan (:mod:`.plan`), the algorithm in plain views (:mod:`.reference`:
read it first), and the implementations that compute the same function (:mod:`.bucketed`, :mod:`.cpu_kernel` with
``csrc/``, :mod:`.triton` with :mod:`.triton_kernels`, :mod:`.block_sparse`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F

from mate_cli.errors import MateError
from mate_cli.modeling.attention.mate import cpu_kernel
from mate_cli.modeling.attention.backend import AttentionBackend, check_range, register, with_key_bias
from mate_cli.modeling.attention.mate.block_sparse import block_sparse_attention
from mate_cli.modeling.attention.mate.bucketed import Workspace, bucketed_attention, cpu_kernel_applies
from mate_cli.modeling.attention.mate.plan import bucket_plan, head_groups
from mate_cli.modeling.attention.mate.triton import triton_available, triton_runs_on
from mate_cli.layout import TableLayout

logger = logging.getLogger(__name__)

#: ``attention.global_rows``: which tokens of the global part get a dense row (:mod:`.plan`)
GLOBAL_ROWS = ("all", "query")

#: ``attention.variant`` -> its valid ``attention.impl`` values (``auto`` first).
VARIANTS = {"exact": ("auto", "masked", "block_sparse"), "bucketed": ("auto", "eager", "kernel", "triton")}

#: ``attention.impl=auto``'s table: (variant, device type, dtype (None: any), grad mode) -> (the longest sequence
#: for the first implementation, it, the one beyond, why the boundary is there). The comparisons are at kernel level
#: (forward and backward in grad mode); their figures are in BENCHMARKS.md, "`attention.impl=auto`'s choices"
#: (bucketed bf16 on CUDA: "NVIDIA H200"). No row: ``eager``. On CPU, bucketed runs the fused kernel wherever it
#: applies (faster than ``eager`` at every length: BENCHMARKS.md, "CPU kernels"), before this table is read.
# fmt: off
AUTO: dict[tuple[str, str, torch.dtype | None, bool], tuple[int, str, str, str]] = {
    ("exact", "cpu", None, False): (576, "masked", "block_sparse",
        "masked is faster at 512 tokens, block_sparse at 1,024"),
    ("exact", "cpu", None, True): (1024, "masked", "block_sparse",
        "masked is faster at 1,024 tokens, block_sparse at 2,048"),
    ("exact", "cuda", None, False): (4096, "masked", "block_sparse",
        "masked is faster at 4,096 tokens, block_sparse at 8,192, in bf16 and float32 (float16: bf16's boundary)"),
    ("exact", "cuda", None, True): (4096, "masked", "block_sparse",
        "bf16: masked is faster at 4,096 tokens, block_sparse at 8,192; float32: masked is faster up to 16,384, but "
        "its backward keeps an L x L float bias per head view and layer (float16: bf16's boundary)"),
    ("bucketed", "cuda", torch.bfloat16, False): (0, "triton", "triton",
        "faster than eager and than bucketed FlexAttention at 2,048-32,768 tokens"),
    ("bucketed", "cuda", torch.bfloat16, True): (0, "triton", "triton", "faster than eager at 2,048-32,768 tokens"),
    ("bucketed", "cuda", torch.float16, False): (0, "triton", "triton", "faster than eager at 2,048-32,768 tokens"),
    ("bucketed", "cuda", torch.float16, True): (0, "triton", "triton", "faster than eager at 2,048-32,768 tokens"),
    ("bucketed", "cuda", torch.float32, False): (0, "triton", "triton", "faster than eager at 2,048-32,768 tokens"),
    ("bucketed", "cuda", torch.float32, True): (0, "triton", "triton", "faster than eager at 2,048-32,768 tokens"),
}
# fmt: on


def auto_choice(variant: str, device: torch.device, dtype: torch.dtype, grad: bool, seq_len: int) -> str | None:
    """:data:`AUTO`'s implementation for this call (a device type without rows reads CUDA's), else None."""
    device_type = device.type if any(key[1] == device.type for key in AUTO) else "cuda"
    row = AUTO.get((variant, device_type, dtype, grad)) or AUTO.get((variant, device_type, None, grad))
    if row is None:
        return None
    limit, first, beyond, _ = row
    return first if seq_len <= limit else beyond


def head_masks(layout: TableLayout, num_heads: int, row_heads_ratio: float) -> torch.Tensor:
    """Exact MATE pattern of every head, ``[batch, heads, seq, seq]`` bool (from, to); quadratic, for tests."""
    views = layout.head_views(num_heads, row_heads_ratio)
    return torch.stack([layout.allowed(v) for v in views], dim=1)


def masked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: TableLayout,
    row_heads_ratio: float = 0.5,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Exact MATE by masking dense attention, ``[batch, heads, seq, head_dim]`` in and out: one SDPA call per head
    view, with a ``[batch, 1, seq, seq]`` mask (plus ``layout.key_bias``)."""
    parts = []
    for view, heads in head_groups(layout, q.shape[1], row_heads_ratio):
        mask = with_key_bias(layout.allowed(view)[:, None], layout, q.dtype)
        parts.append(F.scaled_dot_product_attention(q[:, heads], k[:, heads], v[:, heads], mask, dropout_p))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def choose_bucketed_impl(impl: str, q: torch.Tensor, grad: bool) -> str:
    """What ``variant=bucketed`` runs on this call for ``attention.impl=impl`` (module docstring)."""
    if impl == "triton":
        return "triton"
    if impl in ("auto", "kernel") and cpu_kernel_applies(q):
        return "kernel"
    if impl == "auto" and q.is_cuda:
        choice = auto_choice("bucketed", q.device, q.dtype, grad, q.shape[2]) or "eager"
        return choice if choice != "triton" or triton_runs_on(q) else "eager"
    return "eager"


#: (variant, impl, device, length bucket, grad, choice) already logged: every layer makes the same choice
LOGGED_CHOICES: set[tuple] = set()


@register("mate")
class MateAttention(AttentionBackend):
    """MATE (module docstring); the paper's ``row_heads_ratio`` is 0.5 (1:1). ``global_rows``: ``all`` (the paper:
    the global part attends to everything) or ``query`` (only its query-set tokens do: the bucketed function of runs
    whose config has no ``global_rows``, which they are rebuilt with: :mod:`mate_cli.config.recorded`)."""

    def __init__(
        self,
        *,
        variant: str = "bucketed",
        impl: str = "auto",
        row_heads_ratio: float = 0.5,
        global_size: int = 116,
        radius: int = 42,
        global_rows: str = "all",
        **shared,
    ) -> None:
        super().__init__(**shared)
        if variant not in VARIANTS:
            raise MateError(
                f"attention.variant={variant!r} is unknown: choose {' or '.join(VARIANTS)}; "
                "set attention.variant=<name> accordingly"
            )
        if impl == "flex" and variant == "bucketed":
            raise MateError(
                "attention.impl=flex was removed (bucketed FlexAttention; measured slower, BENCHMARKS.md): "
                "set attention.impl=auto, the same function (a trained run: overrides=[attention.impl=auto])"
            )
        if impl not in VARIANTS[variant]:
            raise MateError(
                f"attention.impl={impl!r} is not an implementation of attention.variant={variant}: "
                f"choose one of {', '.join(VARIANTS[variant])}; set attention.impl=<name> accordingly"
            )
        if global_rows not in GLOBAL_ROWS:
            raise MateError(
                f"attention.global_rows={global_rows!r} is unknown: choose {' or '.join(GLOBAL_ROWS)}; "
                "set attention.global_rows=<name> accordingly"
            )
        check_range("attention.row_heads_ratio", row_heads_ratio, 0.0, 1.0)
        check_range("attention.global_size", global_size, 1)
        check_range("attention.radius", radius, 1)
        for key, value in (("attention.global_size", global_size), ("attention.radius", radius)):
            if int(value) != value:
                raise MateError(f"{key}={value} is invalid: it must be a whole number; set {key}=<int>")
        self.variant, self.impl, self.global_rows = variant, impl, global_rows
        self.row_heads_ratio, self.global_size, self.radius = float(row_heads_ratio), int(global_size), int(radius)
        if impl == "triton" and not triton_available():
            raise MateError(
                "attention.impl=triton needs Triton: GPU builds of PyTorch ship it, elsewhere "
                "pip install triton; or choose another attention.impl"
            )
        if variant == "bucketed" and impl in ("auto", "kernel"):
            # load the CPU kernel now, not in the first forward: a FlopCounterMode open then would miss its formula
            cpu_kernel.available()

    @property
    def supports_key_bias(self) -> bool:
        return self.variant == "exact"

    def extra_repr(self) -> str:
        text = f"variant={self.variant}, impl={self.impl}, row_heads_ratio={self.row_heads_ratio}"
        if self.variant == "bucketed":
            text += f", global_size={self.global_size}, radius={self.radius}, global_rows={self.global_rows}"
        return text

    def resolve_impl(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
        """The implementation this call runs (``auto`` resolved, an impl that cannot run replaced), logged once."""
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        if self.variant == "bucketed":
            choice = choose_bucketed_impl(self.impl, q, grad)
        elif self.impl != "auto":
            return self.impl
        else:
            choice = auto_choice("exact", q.device, q.dtype, grad, q.shape[2])
        length = 1 << (max(q.shape[2], 1) - 1).bit_length()  # logged once per power-of-two length bucket
        key = (self.variant, self.impl, str(q.device), length, grad, choice)
        if (self.impl == "auto" or choice != self.impl) and key not in LOGGED_CHOICES:
            LOGGED_CHOICES.add(key)
            logger.info(
                "mate attention variant=%s impl=%s: using '%s' on %s for sequences of ~%d tokens (%s)",
                self.variant, self.impl, choice, q.device, length, "training" if grad else "inference",
            )  # fmt: skip
        return choice

    @torch.compiler.disable
    def prepare(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TableLayout) -> tuple[str, Any]:
        """``(impl, structure)``: the implementation calls like this one run and what they read of the layout (Triton's
        structure; the bucketed plan and its scratch), built once per layout, dtype and gradient need and shared by
        every layer. Eager under ``torch.compile``: the choice, its log line and the layout's cache are host logic."""
        return layout.cached(self._prepared_key(q, k, v), lambda: self._prepare(q, k, v, layout))

    def _prepared_key(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple:
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        settings = (self.variant, self.impl, self.row_heads_ratio, self.global_size, self.radius, self.global_rows)
        return ("mate.prepared", *settings, q.dtype, q.shape[1], grad)

    def _prepare(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TableLayout) -> tuple[str, Any]:
        impl = "masked" if layout.key_bias is not None else self.resolve_impl(q, k, v)
        if impl in ("masked", "block_sparse"):
            return impl, None
        if impl == "triton":  # its own structure, built on the device without the plan's host reads
            from mate_cli.modeling.attention.mate.triton import TritonStructure

            return impl, TritonStructure.of(
                layout, q.shape[1], self.row_heads_ratio, self.global_size, self.radius, self.global_rows
            )
        plan = bucket_plan(layout, q.shape[1], self.row_heads_ratio, self.global_size, self.radius, self.global_rows)
        # scratch shared, like the plan, by every layer that sees this layout
        return impl, (plan, layout.cached(("mate.workspace",), Workspace))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TableLayout | None) -> torch.Tensor:
        layout = self.require_layout(layout)
        dropout_p = self.dropout if self.training else 0.0
        # prepared before a compiled stack (TableEncoder.prepare_backends): found here without a graph break
        impl, structure = layout.cached(self._prepared_key(q, k, v), lambda: self.prepare(q, k, v, layout))
        if impl == "masked":
            return masked_attention(q, k, v, layout, self.row_heads_ratio, dropout_p)
        if impl == "block_sparse":
            return block_sparse_attention(q, k, v, layout, self.row_heads_ratio, dropout_p)
        if impl == "triton":
            from mate_cli.modeling.attention.mate.triton import triton_bucketed_attention

            return triton_bucketed_attention(q, k, v, structure, dropout_p)
        plan, workspace = structure
        return bucketed_attention(q, k, v, plan, dropout_p, use_cpu_kernel=impl == "kernel", workspace=workspace)
