"""Exact MATE at block-sparse cost (``impl=block_sparse``). After a head's sort (``layout.sort_order``) each row or
column is one contiguous segment: the pattern is block-diagonal plus a dense query-set stripe. Two exact ways to skip
the rest, their structure cached on the layout:

- :func:`block_sparse_attention` (pure PyTorch, any device, with backward): the query-set rows are one dense SDPA;
  table tokens are packed segment by segment into bins of padded size ``S`` (:func:`_bin_size`), each bin one batched
  SDPA against its example's query set and itself. Work ~ sum over segments of ``len * (|Q| + S)`` instead of ``N^2``.
- :func:`flex_mate_attention`: the same mask in FlexAttention, its ``BlockMask`` built from segment ranges (no ``N^2``
  evaluation). ``block_sparse`` runs it on CUDA without dropout only (on CPU, torch 2.13, it has no backward and
  measured slower); ``mate bench`` also times it as the exact-mask anchor.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mate_cli.modeling.attention.mate.plan import (
    PADDING_GROUP,
    group_of_heads,
    head_groups,
    mate_allowed,
    sort_heads,
    sorted_groups,
    unsort_heads,
)
from mate_cli.layout import TableLayout


def _bin_size(length: int) -> int:
    """Smallest ladder size >= length: 16, 24, 32, 48, 64, 96, 128, ... (ratio <= 1.5)."""
    size = 16
    while size < length:
        size = size * 3 // 2 if (size & (size - 1)) == 0 else (size // 3) * 4
    return size


@dataclass(eq=False)
class _Bin:
    """``n`` segments padded to ``size`` tokens: ``example [n]``, ``tokens [n, size]`` (positions), ``valid``."""

    size: int
    example: torch.Tensor
    tokens: torch.Tensor
    valid: torch.Tensor


@dataclass(eq=False)
class SegmentPlan:
    """Packing of one layout for :func:`block_sparse_attention` (cached on the layout): ``query_tokens`` ``[B, P]``,
    the positions of each example's query-set tokens (padded with 0, ``query_valid`` marking the real ones); per head
    view present, its head slice and bins (``views``) and ``out_rows`` ``[B, N]``, the row of the concatenated
    ``[dense rows ; bin rows ... ; zero row]`` that holds each token's output."""

    query_tokens: torch.Tensor
    query_valid: torch.Tensor
    views: list[tuple[str, slice, list[_Bin]]]
    out_rows: list[torch.Tensor]


def segment_plan(layout: TableLayout, num_heads: int, row_heads_ratio: float) -> SegmentPlan:
    """Segments of every view, binned by length (cached on the layout)."""

    def build() -> SegmentPlan:
        dev = layout.device
        is_q = layout.is_query
        q_len = is_q.sum(1)
        P = max(1, int(q_len.max()))
        order = torch.argsort((~is_q).to(torch.int8), dim=1, stable=True)[:, :P]
        query_valid = torch.arange(P, device=dev)[None, :] < q_len[:, None]
        query_tokens = torch.where(query_valid, order, 0)
        views, out_rows = [], []
        for view, heads in head_groups(layout, num_heads, row_heads_ratio):
            bins, rows = _pack_view(layout, view, P, query_tokens, query_valid)
            views.append((view, heads, bins))
            out_rows.append(rows)
        return SegmentPlan(query_tokens, query_valid, views, out_rows)

    return layout.cached(("mate.segment_plan", num_heads, float(row_heads_ratio)), build)


def _pack_view(layout: TableLayout, view: str, P: int, query_tokens, query_valid):
    """Bins of one view's segments and the token -> source-row map."""
    B, N, dev = layout.batch_size, layout.seq_len, layout.device
    perm, _ = layout.sort_order(view)
    ids = layout.view_ids(view).gather(1, perm)
    table = layout.is_table.gather(1, perm)
    segments = []  # (example, start in sorted order, length)
    for b in range(B):
        where = table[b].nonzero()[:, 0]
        if where.numel() == 0:
            continue
        _, counts = torch.unique_consecutive(ids[b, where], return_counts=True)
        starts = torch.cumsum(counts, 0) - counts + where[0]
        segments += [(b, int(s), int(c)) for s, c in zip(starts.tolist(), counts.tolist())]
    by_size: dict[int, list[tuple[int, int, int]]] = {}
    for seg in segments:
        by_size.setdefault(_bin_size(seg[2]), []).append(seg)
    out_rows = torch.full((B, N), -1, dtype=torch.long, device=dev)
    b_idx = torch.arange(B, device=dev)[:, None].expand(B, P)
    out_rows[b_idx[query_valid], query_tokens[query_valid]] = torch.arange(B * P, device=dev).view(B, P)[query_valid]
    bins, offset = [], B * P
    for size in sorted(by_size):
        segs = torch.tensor(by_size[size], dtype=torch.long, device=dev)  # [n, 3]
        slot = torch.arange(size, device=dev)[None, :]
        valid = slot < segs[:, 2:3]
        sorted_pos = (segs[:, 1:2] + slot).clamp(max=N - 1)
        tokens = torch.where(valid, perm[segs[:, 0:1], sorted_pos], 0)
        bins.append(_Bin(size, segs[:, 0], tokens, valid))
        source = offset + torch.arange(segs.shape[0] * size, device=dev).view(-1, size)
        out_rows[segs[:, 0:1].expand_as(tokens)[valid], tokens[valid]] = source[valid]
        offset += segs.shape[0] * size
    out_rows[out_rows < 0] = offset  # padding tokens -> the trailing zero row
    return bins, out_rows


def block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: TableLayout,
    row_heads_ratio: float = 0.5,
    dropout_p: float = 0.0,
    use_flex: bool | None = None,
) -> torch.Tensor:
    """Exact MATE, ``[batch, heads, seq, head_dim]`` in and out (padding rows: zeros on the pure path).
    ``use_flex=None``: FlexAttention on CUDA without dropout (:func:`uses_flex`), the pure path elsewhere."""
    if use_flex is None:
        use_flex = uses_flex(q, dropout_p)
    if use_flex:
        return flex_mate_attention(q, k, v, layout, row_heads_ratio)
    plan = segment_plan(layout, q.shape[1], row_heads_ratio)
    B, H, N, D = q.shape
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # [B, N, H, D] views
    b_idx = torch.arange(B, device=q.device)[:, None]
    q_rows, k_rows, v_rows = (x[b_idx, plan.query_tokens].transpose(1, 2) for x in (qt, kt, vt))  # [B, H, P, D]
    key_real = layout.attention_mask[:, None, None, :]
    dense = F.scaled_dot_product_attention(q_rows, k, v, attn_mask=key_real, dropout_p=dropout_p)
    outs = []
    for (view, heads, bins), out_rows in zip(plan.views, plan.out_rows):
        sources = [dense[:, heads].transpose(1, 2).reshape(-1, heads.stop - heads.start, D)]
        view_inputs = (qt[:, :, heads], kt[:, :, heads], vt[:, :, heads], k_rows[:, heads], v_rows[:, heads])
        sources += [_segment_block(bin_, *view_inputs, plan.query_valid, dropout_p) for bin_ in bins]
        sources.append(q.new_zeros(1, heads.stop - heads.start, D))
        outs.append(torch.cat(sources)[out_rows])  # [B, N, heads, D]
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    return out.transpose(1, 2)


def _segment_block(bin_: _Bin, qt, kt, vt, k_query, v_query, query_valid, dropout_p):
    """One bin: its ``[n, size]`` segments attend to their example's query set and themselves. ``qt, kt, vt``:
    ``[B, N, h, D]`` (this view's heads); ``k_query, v_query``: ``[B, h, P, D]``; returns ``[n * size, h, D]`` rows."""
    ex = bin_.example
    seg_q, seg_k, seg_v = (x[ex[:, None], bin_.tokens].transpose(1, 2) for x in (qt, kt, vt))  # [n, h, S, D]
    keys = torch.cat([k_query[ex], seg_k], dim=2)
    values = torch.cat([v_query[ex], seg_v], dim=2)
    mask = torch.cat([query_valid[ex], bin_.valid], dim=1)[:, None, None, :]
    out = F.scaled_dot_product_attention(seg_q, keys, values, attn_mask=mask, dropout_p=dropout_p)
    return out.transpose(1, 2).reshape(-1, out.shape[1], out.shape[-1])


def uses_flex(q: torch.Tensor, dropout_p: float) -> bool:
    """Whether :func:`block_sparse_attention` runs FlexAttention: on CUDA without dropout, with torch >= 2.5."""
    return q.is_cuda and dropout_p == 0.0 and importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


@functools.cache
def _compiled_flex():
    """``torch.compile``d FlexAttention; after the first change of sorted length torch compiles one kernel with the
    length dynamic, not one per length."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


#: compiled FlexAttention's smallest head dim (torch 2.11-2.13 on CUDA)
MIN_COMPILED_HEAD_DIM = 16


def flex_call(qs, ks, vs, block_mask, scale: float, compiled: bool) -> torch.Tensor:
    """``flex_attention``, compiled (once per process) or eager; a head dim below compiled FlexAttention's minimum is
    zero-padded (the given scale keeps the scores; the padded columns are dropped)."""
    from torch.nn.attention.flex_attention import flex_attention

    D = qs.shape[-1]
    if compiled and D < MIN_COMPILED_HEAD_DIM:
        qs, ks, vs = (F.pad(x, (0, MIN_COMPILED_HEAD_DIM - D)) for x in (qs, ks, vs))
    fn = _compiled_flex() if compiled else flex_attention
    return fn(qs, ks, vs, block_mask=block_mask, scale=scale)[..., :D]


def _flex_structure(layout: TableLayout, num_heads: int, row_heads_ratio: float, block_size: int):
    """``(Np, block_mask)``, cached on the layout: the length padded to whole blocks, and the BlockMask over the
    per-head sorted groups ``[B, H, Np]``."""

    def build():
        from torch.nn.attention.flex_attention import BlockMask

        B, N, dev = layout.batch_size, layout.seq_len, layout.device
        Np = -(-N // block_size) * block_size
        nblk = Np // block_size
        groups = head_groups(layout, num_heads, row_heads_ratio)
        props, kv_any, kv_full = [], [], []
        for view, _ in groups:
            group = sorted_groups(layout, view, Np)  # [B, Np]: 0 = Q, >0 table, PADDING_GROUP padding
            props.append(group)
            blocks = group.view(B, nblk, block_size)
            real = blocks < PADDING_GROUP
            is_q, is_tab = blocks == 0, (blocks > 0) & real
            big = torch.iinfo(group.dtype).max
            tmin = torch.where(is_tab, blocks, big).amin(-1)
            tmax = torch.where(is_tab, blocks, -1).amax(-1)
            q_any, q_all = is_q.any(-1), is_q.all(-1)
            tab_any = is_tab.any(-1)
            one_group = tab_any & is_tab.all(-1) & (tmin == tmax)
            # [B, q block, kv block]
            overlap = (tmin[:, :, None] <= tmax[:, None, :]) & (tmin[:, None, :] <= tmax[:, :, None])
            same_segment = overlap & tab_any[:, :, None] & tab_any[:, None, :]
            any_ = (q_any[:, :, None] & real.any(-1)[:, None, :]) | q_any[:, None, :] | same_segment
            full = (q_all[:, :, None] & real.all(-1)[:, None, :]) | q_all[:, None, :]
            full |= one_group[:, :, None] & one_group[:, None, :] & (tmin[:, :, None] == tmin[:, None, :])
            kv_any.append(any_ & ~full)
            kv_full.append(full)
        index = torch.tensor(group_of_heads(groups), device=dev)
        group = torch.stack(props, 1)[:, index]  # [B, H, Np]

        def to_blocks(m):  # [B, H, nq, nk] bool block matrix -> FlexAttention's (num_blocks, indices), int32
            allowed = torch.stack(m, 1)[:, index]
            order = torch.argsort((~allowed).to(torch.int8), dim=-1, stable=True)
            return allowed.sum(-1).to(torch.int32), order.to(torch.int32)

        def mask_mod(b, h, q_idx, kv_idx):
            return mate_allowed(group[b, h, q_idx], group[b, h, kv_idx])

        partial_n, partial_i = to_blocks(kv_any)
        full_n, full_i = to_blocks(kv_full)
        block_mask = BlockMask.from_kv_blocks(
            partial_n, partial_i, full_n, full_i, BLOCK_SIZE=block_size, mask_mod=mask_mod, seq_lengths=(Np, Np)
        )
        return Np, block_mask

    return layout.cached(("mate.flex", num_heads, float(row_heads_ratio), block_size), build)


def flex_mate_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: TableLayout,
    row_heads_ratio: float = 0.5,
    *,
    block_size: int = 128,
    compiled: bool = True,
) -> torch.Tensor:
    """Exact MATE with FlexAttention on the per-head sorted sequence, ``[batch, heads, seq, head_dim]`` in and out
    (q not pre-scaled). ``compiled=False`` runs it eagerly (materialising the scores; for tests); on CPU (torch 2.13)
    call it without grad."""
    H, D = q.shape[1], q.shape[-1]
    Np, block_mask = _flex_structure(layout, H, row_heads_ratio, block_size)
    perm, inverse = layout.head_sort_order(H, row_heads_ratio)
    qs, ks, vs = (sort_heads(x, perm, Np) for x in (q, k, v))
    out = flex_call(qs, ks, vs, block_mask, D**-0.5, compiled)
    return unsort_heads(out, inverse)
