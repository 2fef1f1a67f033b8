"""The per-layout structure of MATE's bucketed attention (the *bucket plan*; the algorithm: :mod:`.reference`).

:func:`bucket_plan` builds what does not depend on q, k, v (sort orders, masks of the long and dense rows) once per
layout, cached on it so every layer shares it; what is derived from it (mask biases, chunk lists, gather rows, the CPU
kernel's arguments) is memoised on the plan. The head and sort helpers before :class:`Chunk` serve the block-sparse
path too.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from functools import cached_property

import torch
import torch.nn.functional as F

from mate_cli.layout import PADDING_GROUP, TableLayout, View, memoized


def head_groups(layout: TableLayout, num_heads: int, row_heads_ratio: float) -> list[tuple[View, slice]]:
    """The non-empty ``(view, head slice)`` groups in head order: row heads, then column heads."""
    num_row = layout.head_views(num_heads, row_heads_ratio).count("row")
    groups = (("row", slice(0, num_row)), ("column", slice(num_row, num_heads)))
    return [(view, heads) for view, heads in groups if heads.start < heads.stop]


def group_of_heads(groups: list[tuple[View, slice]]) -> list[int]:
    """``[H]``: for each head, the index of its group in ``groups`` (:func:`head_groups`)."""
    return [i for i, (_, heads) in enumerate(groups) for _ in range(heads.start, heads.stop)]


def mate_allowed(q_group: torch.Tensor, k_group: torch.Tensor) -> torch.Tensor:
    """MATE's pattern on broadcastable query/key group ids (``TableLayout.group_ids``), except that padding query rows
    (ignored by contract) attend to the query set: finite, and never more than the query-set globals."""
    return (k_group < PADDING_GROUP) & ((q_group == 0) | (k_group == 0) | (q_group == k_group))


def sorted_groups(layout: TableLayout, view: View, length: int) -> torch.Tensor:
    """``[batch, length]``: ``layout.group_ids(view)`` in the view's sort order, padded with ``PADDING_GROUP``."""
    perm, _ = layout.sort_order(view)
    return F.pad(layout.group_ids(view).gather(1, perm), (0, length - layout.seq_len), value=PADDING_GROUP)


def sort_heads(x: torch.Tensor, perm: torch.Tensor, length: int) -> torch.Tensor:
    """``x`` ``[B, H, N, D]`` in each head's sort order (``perm`` ``[B, H, N]``), zero-padded to ``length``."""
    B, H, N, D = x.shape
    return F.pad(x.gather(2, perm[..., None].expand(B, H, N, D)), (0, 0, 0, length - N))


def unsort_heads(x: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """Sorted ``[B, H, >= N, D]`` back to token order (``inverse`` ``[B, H, N]``): ``[B, H, N, D]``."""
    B, H, N = inverse.shape
    return x.gather(2, inverse[..., None].expand(B, H, N, x.shape[-1]))


@dataclass(frozen=True)
class Chunk:
    """A block of sorted rows: heads ``[h0, h1)`` (flat b*H + h) x buckets ``[n0, n1)``. One head or whole heads,
    never across examples or head views, so bucket views stay strided and one bias row-block serves all its heads."""

    h0: int
    h1: int
    n0: int
    n1: int
    b: int
    view: int
    #: long chunks: global keys any of its rows may attend (keys beyond are skipped:
    #: fully masked for the whole chunk), and how many leading ones are Q (never masked)
    keys: int = 0
    free: int = 0


@dataclass(eq=False)
class BucketPlan:
    """Per-layout structure of the bucketed algorithm. Shapes: ``B`` batch, ``H`` heads, ``V`` distinct head views
    (1 or 2), ``N`` sequence, ``T = nb * R`` padded sorted length, ``P`` dense rows (the global part's)."""

    batch: int
    heads: int
    seq_len: int  # N
    global_len: int  # G (<= N)
    radius: int  # R
    padded_len: int  # T
    num_buckets: int  # nb
    dense_rows: int  # P = max dense_len
    head_view: list[int]  # [H] index into the V axis of the biases
    perm: torch.Tensor  # [B, H, N] long: sorted position -> token position
    inverse: torch.Tensor  # [B, H, N] long: token position -> sorted position
    long_allowed: torch.Tensor  # [B, V, T, G + 3R] bool: [globals ; window] per sorted row
    dense_allowed: torch.Tensor  # [B, V, P, T] bool: dense rows against every key (reference path)
    dense_take: torch.Tensor  # [B, P] bool: dense row i is real (its dense row is used)
    dense_len: list[int]  # [B] min(real, G): the global part, every row of it dense (§3.1: attends to everything)
    real_len: list[int]  # [B] real tokens: the sorted prefix a dense row attends
    query_len: list[int]  # [B] min(|Q|, G): leading global keys every row may attend (no bias needed)
    sorted_groups: torch.Tensor  # [B, V, T] int32: each sorted slot's group (PADDING_GROUP past the real tokens)
    token_groups: torch.Tensor  # [B, V, N] int32: each token's group, in token order
    global_needed: torch.Tensor  # [B, V, T] long: 1 + the last global key a sorted row may attend
    #: the structure :func:`memoized` methods derive from the plan (:meth:`bias`, :meth:`long_chunks`, ...)
    _cache: dict = field(default_factory=dict, init=False, repr=False)

    @memoized
    def bias(self, part: str, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask of the long rows: 0 where allowed, else half the dtype's min (finite: a fully masked row stays
        finite, and adding a score cannot overflow). ``part``: ``"global"`` ``[B, V, T, G]`` or ``"window"``
        ``[B, V, T, 3R]``."""
        G = self.global_len
        allowed = self.long_allowed[..., :G] if part == "global" else self.long_allowed[..., G:]
        neg = torch.finfo(dtype).min / 2
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, neg)

    @cached_property
    def needs_table_globals(self) -> list[list[int]]:
        """``[B][V]``: sorted rows ``[0, n)`` may attend global keys beyond the query set."""
        free = torch.tensor(self.query_len, device=self.global_needed.device)[:, None, None]
        rows = torch.arange(1, self.padded_len + 1, device=free.device)
        return ((self.global_needed > free) * rows).amax(-1).tolist()

    @memoized
    def long_chunks(self, budget: int) -> list[Chunk]:
        """Chunks of long rows, each knowing how many global keys its rows may attend."""
        R, G = self.radius, self.global_len
        chunks = []
        for c in _chunks(self, R, self.num_buckets, G + 3 * R, budget):
            # rows that need table globals form a prefix (Q, then the first group):
            # split a bucket range there so the rest skips those keys
            cut = -(-self.needs_table_globals[c.b][c.view] // R)
            chunks += [replace(c, n1=cut), replace(c, n0=cut)] if c.h1 - c.h0 == 1 and c.n0 < cut < c.n1 else [c]
        needed = [int(self.global_needed[c.b, c.view, c.n0 * R : c.n1 * R].max()) for c in chunks]
        return [
            replace(c, keys=max(n, self.query_len[c.b], 1), free=self.query_len[c.b]) for c, n in zip(chunks, needed)
        ]

    @memoized
    def dense_chunks(self, budget: int) -> list[Chunk]:
        """Chunks of the dense rows (the global part): one unit of ``P`` rows per head."""
        return _chunks(self, self.dense_rows, 1, self.padded_len, budget)

    @memoized
    def source_rows(self, layout_kind: str) -> torch.Tensor:
        """``[B*H*T]``: each sorted slot's row in the flat input (0 for slots >= N). ``layout_kind``: ``"bnhd"`` (a
        ``[B, N, H, D]`` buffer seen as ``[B, H, N, D]``, what the encoder produces) or ``"bhnd"`` (contiguous)."""
        B, H, N, T = self.batch, self.heads, self.seq_len, self.padded_len
        b = torch.arange(B, device=self.perm.device)[:, None, None]
        h = torch.arange(H, device=self.perm.device)[None, :, None]
        rows = (b * N + self.perm) * H + h if layout_kind == "bnhd" else (b * H + h) * N + self.perm
        return F.pad(rows, (0, T - N)).reshape(-1)

    @memoized
    def token_rows(self, layout_kind: str) -> torch.Tensor:
        """``[B*H, 3]`` int64: (row of token 0, row stride, in order) of each head in a flat input of
        ``layout_kind``; in order is 0 where an example's real tokens are not its first ``real_len`` tokens. The CPU
        kernel reads the dense rows' keys through it in token order, and names keys by token position (so dropout
        masks ignore the memory layout)."""
        B, H, N = self.batch, self.heads, self.seq_len
        b = torch.arange(B)[:, None]
        h = torch.arange(H)[None, :]
        base, stride = (b * N * H + h, H) if layout_kind == "bnhd" else ((b * H + h) * N, 1)
        # the real tokens (the sorted prefix [0, n), all distinct) are tokens 0..n-1 iff
        # the largest of them is n - 1
        prefix = torch.tensor([n == 0 or int(self.perm[i, 0, :n].max()) == n - 1 for i, n in enumerate(self.real_len)])
        in_order = prefix[:, None].long().expand(B, H)
        strides = torch.full((B, H), stride)
        return torch.stack([base.expand(B, H), strides, in_order], -1).reshape(B * H, 3).contiguous()

    @cached_property
    def kernel_args(self) -> tuple[torch.Tensor, ...]:
        """The fused CPU kernel's per-layout inputs ``(allowed, keys, free, dense, head_view, real, groups,
        token_groups)`` (csrc/mate_bucketed_cpu.cpp's header); ``keys[f]``: the global keys flat bucket ``f``
        (= head * nb + bucket) reads, :meth:`long_chunks`' count per bucket."""
        B, nb, R = self.batch, self.num_buckets, self.radius
        needed = self.global_needed.view(B, -1, nb, R).amax(-1)  # [B, V, nb]
        free = torch.tensor(self.query_len, dtype=torch.long, device=needed.device)
        keys = torch.maximum(needed, free[:, None, None]).clamp(min=1)[:, self.head_view]  # [B, H, nb]
        return (
            self.long_allowed.contiguous(),
            keys.reshape(-1).to(torch.int32),
            free.to(torch.int32),
            torch.tensor(self.dense_len, dtype=torch.int32),
            torch.tensor(self.head_view, dtype=torch.int32),
            torch.tensor(self.real_len, dtype=torch.int32),
            self.sorted_groups,
            self.token_groups,
        )

    @cached_property
    def dest_rows(self) -> torch.Tensor:
        """``[B*H, T]``: row of a ``[B*N*H, D]`` output for each sorted slot (-1: slot >= N)."""
        rows = self.source_rows("bnhd").view(self.batch * self.heads, self.padded_len).clone()
        rows[:, self.seq_len :] = -1
        return rows

    @cached_property
    def unsort_bnhd(self) -> torch.Tensor:
        """``[B*N*H]``: each token's row in ``[B*H*T, D]``, in ``[B, N, H]`` order; one ``index_select`` gives the
        ``[B, N, H, D]`` buffer the encoder's head merge reads for free."""
        return self.unsort_rows.view(self.batch, self.heads, self.seq_len).transpose(1, 2).reshape(-1)

    @cached_property
    def unsort_rows(self) -> torch.Tensor:
        """``[B*H*N]``: for token (b, h, n) in ``[B, H, N]`` order, its row in ``[B*H*T, D]``."""
        B, H, T = self.batch, self.heads, self.padded_len
        bh = torch.arange(B * H, device=self.perm.device).view(B, H, 1)
        return (bh * T + self.inverse).reshape(-1)


def _chunks(plan: BucketPlan, rows_per_unit: int, units: int, width: int, budget: int) -> list[Chunk]:
    """Split every (example, view) head group into chunks of about ``budget`` scores; a unit is a bucket
    (``rows_per_unit = R``) or the dense block (one unit of P rows)."""
    out = []
    H = plan.heads
    per_head = rows_per_unit * units * width
    for b in range(plan.batch):
        for view, group in itertools.groupby(range(H), key=plan.head_view.__getitem__):
            heads = list(group)
            h, end = heads[0], heads[-1] + 1
            if per_head <= budget:
                step = max(1, budget // per_head)
                out += [Chunk(b * H + h0, b * H + min(end, h0 + step), 0, units, b, view) for h0 in range(h, end, step)]
            else:
                step = max(1, budget // (rows_per_unit * width))
                for hh in heads:
                    for n0 in range(0, units, step):
                        out.append(Chunk(b * H + hh, b * H + hh + 1, n0, min(units, n0 + step), b, view))
    return out


def _unfold_windows(x: torch.Tensor, radius: int, value) -> torch.Tensor:
    """``[..., T]`` -> ``[..., nb, 3R]``: for each bucket, the previous, own and next bucket."""
    return F.pad(x, (radius, radius), value=value).unfold(-1, 3 * radius, radius)


def _int32_groups(groups: torch.Tensor) -> torch.Tensor:
    """Group ids for the CPU kernel: int32, padding's as the largest int32 (still after every row/column)."""
    return groups.clamp(max=torch.iinfo(torch.int32).max).to(torch.int32).contiguous()


def bucket_plan(
    layout: TableLayout, num_heads: int, row_heads_ratio: float, global_size: int, radius: int, global_rows: str = "all"
) -> BucketPlan:
    """The layout's :class:`BucketPlan` for these settings, cached on the layout. ``global_rows``: ``all`` real tokens
    of the global part get a dense row (the paper), or its ``query``-set tokens only."""

    def build() -> BucketPlan:
        B, N, R = layout.batch_size, layout.seq_len, radius
        G = min(global_size, N)
        nb = -(-N // R)
        T = nb * R
        groups = head_groups(layout, num_heads, row_heads_ratio)
        q_len = layout.is_query.sum(1)
        real = layout.attention_mask.sum(1)
        dense_len = (real if global_rows == "all" else q_len).clamp(max=G)  # §3.1: "attends to and from everything"
        P = int(dense_len.max()) if B else 0
        in_window = (_unfold_windows(torch.arange(T, device=layout.device), R, -1) >= G)[None, :, None, :]
        long_allowed, dense_allowed, sorted_view_groups = [], [], []
        for view, _ in groups:
            group = sorted_groups(layout, view, T)  # [B, T]
            sorted_view_groups.append(group)
            # rows: [B, nb, R, 1]; global keys: [B, 1, 1, G]; window keys: [B, nb, 1, 3R]
            rows = group.view(B, nb, R, 1)
            to_global = mate_allowed(rows, group[:, None, None, :G])
            window = _unfold_windows(group, R, PADDING_GROUP)[:, :, None, :]
            to_window = mate_allowed(rows, window) & in_window  # globals are not repeated
            long_allowed.append(torch.cat([to_global, to_window], -1).view(B, T, G + 3 * R))
            dense_allowed.append(mate_allowed(group[:, :P, None], group[:, None, :]))
        perm, inverse = layout.head_sort_order(num_heads, row_heads_ratio)
        long_stack = torch.stack(long_allowed, 1)
        return BucketPlan(
            batch=B,
            heads=num_heads,
            seq_len=N,
            global_len=G,
            radius=R,
            padded_len=T,
            num_buckets=nb,
            dense_rows=P,
            head_view=group_of_heads(groups),
            perm=perm,
            inverse=inverse,
            long_allowed=long_stack,
            dense_allowed=torch.stack(dense_allowed, 1),
            dense_take=torch.arange(P, device=layout.device)[None, :] < dense_len[:, None],
            dense_len=dense_len.tolist(),
            real_len=real.tolist(),
            sorted_groups=_int32_groups(torch.stack(sorted_view_groups, 1)),
            token_groups=_int32_groups(torch.stack([layout.group_ids(view) for view, _ in groups], 1)),
            query_len=q_len.clamp(max=G).tolist(),
            global_needed=(long_stack[..., :G] * torch.arange(1, G + 1, device=layout.device)).amax(-1),
        )

    key = ("mate.bucket_plan", num_heads, float(row_heads_ratio), int(global_size), int(radius), global_rows)
    return layout.cached(key, build)
