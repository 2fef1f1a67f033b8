"""MATE's bucketed attention as one FlexAttention call (``variant=bucketed impl=flex``; :mod:`.mate`): the function
of :mod:`.mate_bucketed` (explained in :mod:`.mate_reference`), written in each head's sorted space.

Per head, tokens are sorted by the plan's order and padded to whole blocks; one ``flex_attention`` call masks
``allowed(i, j) = mate(i, j) and (i is a dense row or j < G or |i // R - j // R| <= 1)``; outputs are scattered
back to token order. The ``BlockMask`` is built from the structure, never by evaluating the mask on ``T x T`` (a
query block reads the global blocks, its rows' window blocks, and every block with a real key when it holds a dense
row): linear work.

On CUDA FlexAttention is compiled (forward and backward fused; bf16, fp16, float32). On CPU it runs eagerly, the
scores materialised (quadratic memory), with its own backward (:class:`_SortedFlex`) as torch's CPU FlexAttention
has none: a check of the GPU path, not a fast path (``impl=kernel`` is). FlexAttention has no attention dropout
(:mod:`.mate` runs ``eager`` for a call with it).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from mate_cli.modeling.attention.mate_plan import (
    BucketPlan,
    head_groups,
    mate_allowed,
    sort_heads,
    sorted_groups,
    unsort_heads,
)
from mate_cli.modeling.layout import TableLayout

__all__ = ["BLOCK_SIZE", "blocks_of", "flex_available", "flex_bucketed_attention", "flex_call", "flex_fn"]

#: FlexAttention's block (query and key/value), the unit of its sparsity
BLOCK_SIZE = 128


def flex_available() -> bool:
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except Exception:  # pragma: no cover - old torch
        return False
    return True


@functools.cache
def _compiled_flex():
    """``torch.compile``d FlexAttention, compiled on first use; after the first change of sorted length (batches are
    padded to their longest example) torch compiles one kernel with the length dynamic, not one per length."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def flex_fn(compiled: bool):
    """FlexAttention: compiled (once per process) or eager."""
    from torch.nn.attention.flex_attention import flex_attention

    return _compiled_flex() if compiled else flex_attention


#: compiled FlexAttention's smallest head dim (torch 2.11-2.13 on CUDA)
MIN_COMPILED_HEAD_DIM = 16


def flex_call(qs, ks, vs, block_mask, scale: float, compiled: bool) -> torch.Tensor:
    """``flex_attention(qs, ks, vs, block_mask, scale)``, a head dim below compiled FlexAttention's minimum zero-padded
    (the given scale keeps the scores; the padded output columns are dropped)."""
    D = qs.shape[-1]
    if compiled and D < MIN_COMPILED_HEAD_DIM:
        qs, ks, vs = (F.pad(x, (0, MIN_COMPILED_HEAD_DIM - D)) for x in (qs, ks, vs))
    return flex_fn(compiled)(qs, ks, vs, block_mask=block_mask, scale=scale)[..., :D]


def blocks_of(allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, H, nq, nk]`` bool block matrix -> FlexAttention's ``(num_blocks, indices)`` (int32)."""
    return allowed.sum(-1).to(torch.int32), torch.argsort((~allowed).to(torch.int8), dim=-1, stable=True).to(
        torch.int32
    )


class _Structure:
    """The sorted-space structure of one plan (cached on it): per-head sorted groups
    ``[B, H, Tp]``, the dense-row count per example, and the BlockMask."""

    def __init__(self, layout: TableLayout, plan: BucketPlan, row_heads_ratio: float, block: int) -> None:
        from torch.nn.attention.flex_attention import BlockMask

        dev = plan.perm.device
        G, R = plan.global_len, plan.radius
        # buckets are i // R in sorted space; keys past the sequence are padding (never
        # allowed), so the sorted length is only padded to whole blocks
        self.padded_len = Tp = -(-plan.seq_len // block) * block
        groups = [sorted_groups(layout, view, Tp) for view, _ in head_groups(layout, plan.heads, row_heads_ratio)]
        self.groups = torch.stack(groups, 1)[:, torch.tensor(plan.head_view, device=dev)].contiguous()
        self.dense_len = torch.tensor(plan.query_len, device=dev)  # [B] dense rows: the sorted prefix
        real_len = torch.tensor(plan.real_len, device=dev)

        # block structure, [B, nq, nk]: globals, windows, dense rows, real keys only
        nq = Tp // block
        start = torch.arange(nq, device=dev) * block  # first row of each block
        first_bucket, last_bucket = start // R, (start + block - 1) // R
        keys = torch.arange(Tp, device=dev)
        key_bucket = keys // R
        near = (key_bucket[None, :] >= first_bucket[:, None] - 1) & (key_bucket[None, :] <= last_bucket[:, None] + 1)
        by_key = (near | (keys < G)[None, :]).view(nq, nq, block).any(-1)  # [nq, nk]
        dense = start[None, :] < self.dense_len[:, None]  # [B, nq]: the block holds a dense row
        real = start[None, :] < real_len[:, None]  # [B, nk]: the block holds a real key
        allowed = (by_key[None] | dense[:, :, None]) & real[:, None, :]
        # a padding query block still reads block 0 (the query set), like the other paths
        allowed[:, :, 0] = True
        num, idx = blocks_of(allowed[:, None])

        sorted_groups_ = self.groups
        dense_len = self.dense_len

        def mask_mod(b, h, i, j):
            gi, gj = sorted_groups_[b, h, i], sorted_groups_[b, h, j]
            reach = (i < dense_len[b]) | (j < G) | ((i // R - j // R).abs() <= 1)
            return mate_allowed(gi, gj) & reach

        self.mask_mod = mask_mod
        self.block_mask = BlockMask.from_kv_blocks(num, idx, BLOCK_SIZE=block, mask_mod=mask_mod, seq_lengths=(Tp, Tp))
        self.block = block


def _structure(layout: TableLayout, plan: BucketPlan, row_heads_ratio: float, block: int) -> _Structure:
    return plan.memoized(("flex", block), lambda: _Structure(layout, plan, row_heads_ratio, block))


class _SortedFlex(torch.autograd.Function):
    """FlexAttention in sorted space with a backward where torch has none (CPU): an eager forward; backward per query
    block over the keys its BlockMask row lists (union over batch and heads), mask and probabilities recomputed, then
    flash-attention's formulas (``dS = P * (dP - rowsum(dO * O))``)."""

    @staticmethod
    def forward(ctx, qs, ks, vs, structure: _Structure, scale: float):
        # detached: torch's CPU FlexAttention refuses inputs that require grad
        out = flex_fn(False)(qs.detach(), ks.detach(), vs.detach(), block_mask=structure.block_mask, scale=scale)
        ctx.save_for_backward(qs, ks, vs, out)
        ctx.structure, ctx.scale = structure, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        qs, ks, vs, out = ctx.saved_tensors
        st, scale = ctx.structure, ctx.scale
        B, H, Tp, D = qs.shape
        bs = st.block
        dq, dk, dv = torch.zeros_like(qs), torch.zeros_like(ks), torch.zeros_like(vs)
        num, idx = st.block_mask.kv_num_blocks, st.block_mask.kv_indices  # [B, 1, nq], [B, 1, nq, nk]
        b_ids = torch.arange(B, device=qs.device)[:, None, None, None]
        h_ids = torch.arange(H, device=qs.device)[None, :, None, None]
        for qb in range(Tp // bs):
            rows = slice(qb * bs, (qb + 1) * bs)
            listed = torch.zeros(Tp // bs, dtype=torch.bool, device=qs.device)
            for b in range(B):
                listed[idx[b, 0, qb, : int(num[b, 0, qb])].long()] = True
            keys = (torch.nonzero(listed)[:, 0, None] * bs + torch.arange(bs, device=qs.device)).reshape(-1)
            i = torch.arange(qb * bs, (qb + 1) * bs, device=qs.device)[None, None, :, None]
            allowed = st.mask_mod(b_ids, h_ids, i, keys[None, None, None, :])
            k_sel, v_sel = ks[:, :, keys], vs[:, :, keys]
            scores = (qs[:, :, rows] @ k_sel.transpose(-1, -2)).float() * scale
            probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1).nan_to_num_(0.0)
            d_out = grad_out[:, :, rows].float()
            delta = (d_out * out[:, :, rows].float()).sum(-1, keepdim=True)
            d_scores = probs * (d_out @ v_sel.float().transpose(-1, -2) - delta) * scale
            dq[:, :, rows] = (d_scores @ k_sel.float()).to(dq.dtype)
            dk[:, :, keys] += (d_scores.transpose(-1, -2) @ qs[:, :, rows].float()).to(dk.dtype)
            dv[:, :, keys] += (probs.transpose(-1, -2) @ d_out).to(dv.dtype)
        return dq, dk, dv, None, None


def flex_bucketed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: TableLayout,
    plan: BucketPlan,
    row_heads_ratio: float,
    *,
    compiled: bool | None = None,
    block_size: int = BLOCK_SIZE,
) -> torch.Tensor:
    """Bucketed MATE (:func:`.mate_bucketed.bucketed_attention`'s function, without dropout) as one FlexAttention call;
    ``q, k, v`` ``[batch, heads, seq, head_dim]`` (q not pre-scaled) -> the same shape. ``compiled``: None compiles on
    CUDA and runs eagerly elsewhere."""
    structure = _structure(layout, plan, row_heads_ratio, block_size)
    qs, ks, vs = (sort_heads(x, plan.perm, structure.padded_len) for x in (q, k, v))
    scale = q.shape[-1] ** -0.5
    if compiled is None:
        compiled = q.is_cuda
    needs_grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
    if needs_grad and q.device.type == "cpu":
        out = _SortedFlex.apply(qs, ks, vs, structure, scale)
    else:
        out = flex_call(qs, ks, vs, structure.block_mask, scale, compiled)
    return unsort_heads(out, plan.inverse)
