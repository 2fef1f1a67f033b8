"""MATE's efficient implementation (paper §3.1, App. D): sort per head, then bucket.

Every head sorts its tokens by its own traversal (``layout.head_sort_order``: the
query set Q first, then row by row for row heads / column by column for column
heads, padding last). In that order:

- the first ``G`` tokens are the **global** part: every token may attend to them
  (subject to the row/column mask), and the query-set tokens among them attend to
  every real token (their own row of the dense matrix);
- the whole sorted sequence is padded to ``T = nb * R`` and cut into ``nb`` buckets of
  ``R`` tokens (the **long** part); a bucket attends to the globals plus a **window**
  of three buckets (previous, itself, next: ``3R`` keys). Window keys inside the
  global part are masked out, so no key is counted twice.

Inside the window and towards the globals the exact MATE pattern is applied as a
mask: key j is allowed for query i iff j is real and (i is in Q, or j is in Q, or i
and j share the head's row/column id). One softmax runs over ``[globals ; window]``.
Hence the result equals the masked reference whenever every query-set token is among
the first ``G`` sorted tokens and every row (row heads) / column (column heads) spans
at most ``R`` tokens; otherwise a table token loses the part of its row/column beyond
its window, and query tokens beyond ``G`` see only the globals and their window (the
paper's approximation). Padding query rows (ignored by contract) attend to Q only.

Design choice where App. D is silent: only query-set tokens among the first ``G``
get a dense row; a table token sorted into the global part is computed like every
long token (globals + window, masked), because MATE never lets it see more than Q
and its own row/column anyway. This keeps the exactness condition above simple.

Two implementations of the same function live here:

- :func:`bucketed_attention_reference` spells App. D out with einsum strings over a
  :class:`MultiView` of tensor views (full / global / long / window). Readable,
  autograd-differentiable, O(N) memory, but several full passes over the scores.
- :func:`bucketed_attention` is what the backend runs: one ``autograd.Function``.
  It sorts k and v once into a bucket-aligned buffer (every 3-bucket window is a
  zero-copy ``unfold`` view of it), then walks the sorted rows in cache-sized
  chunks: gather the chunk's queries, one GEMM to the globals and one batched GEMM
  to the windows, add the mask bias (the query-set keys, allowed for every row, need
  none), one in-place softmax, two GEMMs for the context, scattered straight back to
  token order. Global keys that are masked for a whole chunk (table tokens of the
  first row/column, for every chunk past that row/column) are skipped, and the dense
  query rows only read the real keys (a sorted prefix). Backward recomputes each
  chunk's probabilities (flash-attention style): only q, k, v and the output are
  kept. Time and memory are linear in the sequence length, forward and backward.

On CPU in float32 without attention dropout, the forward runs in compiled kernels
instead (:mod:`mate_cpu_kernel`, ``csrc/mate_bucketed_cpu.cpp``): per bucket, scores to
``[globals ; window]``, mask, softmax and context while they sit in cache, buckets
in parallel; per head, the dense query rows likewise. Same function (tested against
both paths above), faster than the chunked torch ops. Backward, dropout, other
dtypes and CUDA use the torch path.

All structure (permutations, bucket masks as additive biases, chunk lists) is
computed once per ``TableLayout`` and cached on it, so the encoder's layers share it;
call-internal scratch buffers are reused across calls on CPU (:func:`_workspace`).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace
from typing import Sequence

import torch
import torch.nn.functional as F

from mate_cli.modeling.attention import mate_cpu_kernel
from mate_cli.modeling.layout import TableLayout

__all__ = [
    "MultiView", "BucketPlan", "bucket_plan", "bucketed_attention", "bucketed_attention_reference", "release_workspace",
]

#: Score elements per chunk of the fused path (~4 MiB of float32: about L2-sized).
CHUNK_ELEMENTS = {"cpu": 1 << 20, "cuda": 1 << 25}


# --------------------------------------------------------------------------- plan
@dataclass(eq=False)
class BucketPlan:
    """Per-layout structure of the bucketed algorithm (cached on the layout).

    Shapes use ``B`` batch, ``H`` heads, ``V`` distinct head views (1 or 2),
    ``N`` sequence, ``T = nb * R`` padded sorted length, ``P`` dense (query) rows.
    """

    batch: int
    heads: int
    seq_len: int  # N
    global_len: int  # G (<= N)
    radius: int  # R
    padded_len: int  # T
    num_buckets: int  # nb
    dense_rows: int  # P = min(G, max |Q|)
    head_view: list[int]  # [H] index into the V axis of the biases
    perm: torch.Tensor  # [B, H, N] long: sorted position -> token position
    inverse: torch.Tensor  # [B, H, N] long: token position -> sorted position
    long_allowed: torch.Tensor  # [B, V, T, G + 3R] bool: [globals ; window] per sorted row
    dense_allowed: torch.Tensor  # [B, V, P, T] bool: dense rows against every key (reference path)
    dense_take: torch.Tensor  # [B, P] bool: dense row i is a query-set token (its dense row is used)
    real_len: list[int]  # [B] real tokens: the sorted prefix every query-set token attends
    query_len: list[int]  # [B] min(|Q|, G): leading global keys every row may attend (no bias needed)
    global_needed: torch.Tensor  # [B, V, T] long: 1 + the last global key a sorted row may attend

    @property
    def window(self) -> int:
        return 3 * self.radius

    # --- lazily derived, cached on the plan -------------------------------------
    def bias(self, part: str, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask (0 allowed, a huge negative otherwise), contiguous, cached.

        ``part``: ``"global"`` ``[B, V, T, G]`` or ``"window"`` ``[B, V, T, 3R]`` (long rows
        to the globals / to their window). Finite, so a fully masked row stays finite.
        """
        key = f"_bias_{part}_{dtype}"
        if not hasattr(self, key):
            G = self.global_len
            allowed = self.long_allowed[..., :G] if part == "global" else self.long_allowed[..., G:]
            neg = torch.finfo(dtype).min / 2
            bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, neg)
            setattr(self, key, bias)
        return getattr(self, key)

    @property
    def needs_table_globals(self) -> list[list[int]]:
        """``[B][V]``: sorted rows ``[0, n)`` may attend global keys beyond the query set."""
        if not hasattr(self, "_needs_table_globals"):
            free = torch.tensor(self.query_len, device=self.global_needed.device)[:, None, None]
            rows = torch.arange(1, self.padded_len + 1, device=free.device)
            self._needs_table_globals = ((self.global_needed > free) * rows).amax(-1).tolist()
        return self._needs_table_globals

    def long_chunks(self, budget: int) -> list["_Chunk"]:
        """Chunks of long rows, each knowing how many global keys its rows may attend (cached)."""
        key = f"_long_chunks_{budget}"
        if not hasattr(self, key):
            R, G = self.radius, self.global_len
            chunks = []
            for c in _chunks(self, R, self.num_buckets, G + 3 * R, budget):
                # rows that need table globals form a prefix (Q, then the first group):
                # split a bucket range there so the rest skips those keys
                cut = -(-self.needs_table_globals[c.b][c.view] // R)
                if c.h1 - c.h0 == 1 and c.n0 < cut < c.n1:
                    chunks += [replace(c, n1=cut), replace(c, n0=cut)]
                else:
                    chunks.append(c)
            bounds = torch.tensor([[c.b, c.view, c.n0 * R, c.n1 * R] for c in chunks])
            needed = [int(self.global_needed[b, v, lo:hi].max()) for b, v, lo, hi in bounds.tolist()]
            chunks = [
                replace(c, keys=max(n, self.query_len[c.b], 1), free=self.query_len[c.b]) for c, n in zip(chunks, needed)
            ]
            setattr(self, key, chunks)
        return getattr(self, key)

    def source_rows(self, layout_kind: str) -> torch.Tensor:
        """``[B*H*T]``: for every sorted slot, its row in the flat input (0 for slots >= N).

        ``layout_kind`` is ``"bnhd"`` (a ``[B, N, H, D]`` buffer seen as ``[B, H, N, D]``,
        what the encoder produces) or ``"bhnd"`` (contiguous ``[B, H, N, D]``).
        """
        key = f"_src_{layout_kind}"
        if not hasattr(self, key):
            B, H, N, T = self.batch, self.heads, self.seq_len, self.padded_len
            b = torch.arange(B, device=self.perm.device)[:, None, None]
            h = torch.arange(H, device=self.perm.device)[None, :, None]
            rows = (b * N + self.perm) * H + h if layout_kind == "bnhd" else (b * H + h) * N + self.perm
            setattr(self, key, F.pad(rows, (0, T - N)).reshape(-1))
        return getattr(self, key)

    def kernel_args(self) -> tuple[torch.Tensor, ...]:
        """Per-layout inputs of the fused CPU kernel (cached): ``(allowed, keys, free, head_view, real)``.

        ``keys[f]``: global keys flat bucket ``f`` (= head * nb + bucket) reads, as
        :meth:`long_chunks` computes per chunk but per bucket.
        """
        if not hasattr(self, "_kernel_args"):
            B, nb, R = self.batch, self.num_buckets, self.radius
            needed = self.global_needed.view(B, -1, nb, R).amax(-1)  # [B, V, nb]
            free = torch.tensor(self.query_len, dtype=torch.long, device=needed.device)
            keys = torch.maximum(needed, free[:, None, None]).clamp(min=1)[:, self.head_view]  # [B, H, nb]
            self._kernel_args = (
                self.long_allowed.contiguous(),
                keys.reshape(-1).to(torch.int32),
                free.to(torch.int32),
                torch.tensor(self.head_view, dtype=torch.int32),
                torch.tensor(self.real_len, dtype=torch.int32),
            )
        return self._kernel_args

    @property
    def dest_rows(self) -> torch.Tensor:
        """``[B*H, T]``: row of a ``[B*N*H, D]`` output for each sorted slot (-1: slot >= N)."""
        if not hasattr(self, "_dest_rows"):
            B, H, N = self.batch, self.heads, self.seq_len
            rows = self.source_rows("bnhd").view(B * H, self.padded_len).clone()
            rows[:, N:] = -1
            self._dest_rows = rows
        return self._dest_rows

    @property
    def unsort_bnhd(self) -> torch.Tensor:
        """``[B*N*H]``: for token (b, n, h) in ``[B, N, H]`` order, its row in ``[B*H*T, D]``.

        One ``index_select`` with it turns the sorted output into the ``[B, N, H, D]``
        buffer the encoder's head merge reads for free.
        """
        if not hasattr(self, "_unsort_bnhd"):
            B, H, T = self.batch, self.heads, self.padded_len
            bh = torch.arange(B * H, device=self.perm.device).view(B, H, 1)
            self._unsort_bnhd = (bh * T + self.inverse).transpose(1, 2).reshape(-1)
        return self._unsort_bnhd

    @property
    def unsort_rows(self) -> torch.Tensor:
        """``[B*H*N]``: for token (b, h, n) in ``[B, H, N]`` order, its row in ``[B*H*T, D]``."""
        if not hasattr(self, "_unsort_rows"):
            B, H, T = self.batch, self.heads, self.padded_len
            bh = torch.arange(B * H, device=self.perm.device).view(B, H, 1)
            self._unsort_rows = (bh * T + self.inverse).reshape(-1)
        return self._unsort_rows


def _sorted_props(layout: TableLayout, view: str, padded_len: int):
    """Sorted ``(perm, inverse, group, real, is_query)`` of one view, padded to T.

    ``group`` is 0 for Q, row/column id + 1 for table tokens and -1 for padding; the
    tensors are ``[B, T]`` (``perm``/``inverse``: ``[B, N]``).
    """
    perm, inverse = layout.sort_order(view)
    group = torch.where(layout.is_query, 0, layout.view_ids(view) + 1)
    group = torch.where(layout.attention_mask, group, -1)
    pad = padded_len - layout.seq_len
    sort = lambda x, value: F.pad(x.gather(1, perm), (0, pad), value=value)  # noqa: E731
    return perm, inverse, sort(group, -1), sort(layout.attention_mask, False), sort(layout.is_query, False)


def _allowed(q_group, q_real, q_query, k_group, k_real, k_query) -> torch.Tensor:
    """MATE's pattern on broadcastable query/key properties.

    Padding query rows (ignored by contract) attend to Q only: finite, and they never
    need more than the query-set globals.
    """
    return k_real & (q_query | k_query | ((q_group == k_group) & q_real))


def _unfold_windows(x: torch.Tensor, radius: int, value) -> torch.Tensor:
    """``[..., T]`` -> ``[..., nb, 3R]``: for each bucket, the previous, own and next bucket."""
    return F.pad(x, (radius, radius), value=value).unfold(-1, 3 * radius, radius)


def bucket_plan(
    layout: TableLayout, num_heads: int, row_heads_ratio: float, global_size: int, radius: int
) -> BucketPlan:
    """Build (once per layout, cached) the sort orders and bucket masks."""

    def build() -> BucketPlan:
        B, N, R = layout.batch_size, layout.seq_len, radius
        G = min(global_size, N)
        nb = -(-N // R)
        T = nb * R
        head_views = layout.head_views(num_heads, row_heads_ratio)
        views = sorted(set(head_views), key=("row", "column").index)
        q_len = layout.is_query.sum(1)
        P = int(min(G, int(q_len.max()) if B else 0))
        pos = torch.arange(T, device=layout.device)
        long_allowed, dense_allowed = [], []
        for view in views:
            _, _, grp, real, isq = _sorted_props(layout, view, T)
            # rows: [B, nb, R, 1]; global keys: [B, 1, 1, G]; window keys: [B, nb, 1, 3R]
            rows = [x.view(B, nb, R, 1) for x in (grp, real, isq)]
            to_global = _allowed(*rows, *(x[:, None, None, :G] for x in (grp, real, isq)))
            win = [_unfold_windows(x, R, v)[:, :, None, :] for x, v in ((grp, -1), (real, False), (isq, False))]
            in_window = (_unfold_windows(pos, R, -1) >= G)[None, :, None, :]  # globals are not repeated
            to_window = _allowed(*rows, *win) & in_window
            long_allowed.append(torch.cat([to_global, to_window], -1).view(B, T, G + 3 * R))
            dense_allowed.append(
                _allowed(*(x[:, :P, None] for x in (grp, real, isq)), *(x[:, None, :] for x in (grp, real, isq)))
            )
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
            head_view=[views.index(v) for v in head_views],
            perm=perm,
            inverse=inverse,
            long_allowed=long_stack,
            dense_allowed=torch.stack(dense_allowed, 1),
            dense_take=torch.arange(P, device=layout.device)[None, :] < q_len.clamp(max=G)[:, None],
            real_len=layout.attention_mask.sum(1).tolist(),
            query_len=q_len.clamp(max=G).tolist(),
            global_needed=(long_stack[..., :G] * torch.arange(1, G + 1, device=layout.device)).amax(-1),
        )

    key = ("mate.bucket_plan", num_heads, float(row_heads_ratio), int(global_size), int(radius))
    return layout.cached(key, build)


# ---------------------------------------------------------------- App. D, literally
@dataclass
class MultiView:
    """Views of one per-head sorted tensor (App. D's ``MultiViewEmbedding``).

    Attributes:
        full: ``[batch, heads, T, head_dim]`` sorted and zero-padded to ``T = nb * R``.
        global_: ``[batch, heads, G, head_dim]``, the first ``G`` sorted tokens.
        long: ``[batch, heads, nb, R, head_dim]``, every bucket of ``R`` tokens.
        window: ``[batch, heads, nb, 3R, head_dim]``, each bucket with its previous
            and next bucket (zeros beyond the ends).
    """

    full: torch.Tensor
    global_: torch.Tensor
    long: torch.Tensor
    window: torch.Tensor

    @classmethod
    def of(cls, x: torch.Tensor, plan: BucketPlan) -> "MultiView":
        """Sort ``x`` ``[batch, heads, seq, head_dim]`` by the plan's per-head order and view it."""
        B, H, N, D = x.shape
        R, nb, G = plan.radius, plan.num_buckets, plan.global_len
        full = F.pad(x.gather(2, plan.perm[..., None].expand(B, H, N, D)), (0, 0, 0, plan.padded_len - N))
        long = full.view(B, H, nb, R, D)
        padded = F.pad(long, (0, 0, 0, 0, 1, 1))
        window = torch.cat([padded[:, :, :-2], padded[:, :, 1:-1], padded[:, :, 2:]], dim=3)
        return cls(full=full, global_=full[:, :, :G], long=long, window=window)


def _per_head(x: torch.Tensor, plan: BucketPlan) -> torch.Tensor:
    """``[B, V, ...]`` per view -> ``[B, H, ...]`` per head."""
    return x[:, plan.head_view]


def bucketed_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: BucketPlan
) -> torch.Tensor:
    """App. D with einsum strings; same function as :func:`bucketed_attention` (no dropout).

    ``q, k, v``: ``[batch, heads, seq, head_dim]``; returns the same shape. Materialises
    ``[batch, heads, T, G + 3R]`` scores; used to document and test the fused path.
    """
    B, H, N, D = q.shape
    G, R, P = plan.global_len, plan.radius, plan.dense_rows
    Q, K, V = (MultiView.of(x, plan) for x in (q * D**-0.5, k, v))
    neg = torch.finfo(q.dtype).min
    long_allowed = _per_head(plan.long_allowed, plan).view(B, H, plan.num_buckets, R, G + 3 * R)

    score_to_global = torch.einsum("BHNFE,BHTE->BHNFT", Q.long, K.global_)
    score_to_window = torch.einsum("BHNFE,BHNTE->BHNFT", Q.long, K.window)
    prob_from_long = torch.softmax(
        torch.cat([score_to_global, score_to_window], -1).masked_fill(~long_allowed, neg), -1
    )
    context_from_long = torch.einsum("BHNFT,BHTE->BHNFE", prob_from_long[..., :G], V.global_) + torch.einsum(
        "BHNFT,BHNTE->BHNFE", prob_from_long[..., G:], V.window
    )
    context = context_from_long.reshape(B, H, plan.padded_len, D)

    if P:  # query-set tokens among the globals: one dense row each
        score_from_global = torch.einsum("BHFE,BHTE->BHFT", Q.full[:, :, :P], K.full)
        prob_from_global = torch.softmax(score_from_global.masked_fill(~_per_head(plan.dense_allowed, plan), neg), -1)
        context_from_global = torch.einsum("BHFT,BHTE->BHFE", prob_from_global, V.full)
        take = plan.dense_take[:, None, :, None]
        context = torch.cat([torch.where(take, context_from_global, context[:, :, :P]), context[:, :, P:]], 2)
    return context.gather(2, plan.inverse[..., None].expand(B, H, N, D))


# ------------------------------------------------------------------- fused path
@dataclass(frozen=True)
class _Chunk:
    """A block of sorted rows: heads ``[h0, h1)`` (flat b*H + h) x buckets ``[n0, n1)``.

    Either one head or whole heads, and never across examples or head views, so that
    bucket views stay plain strided tensors and one bias row-block serves all its heads.
    """

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


def _chunks(plan: BucketPlan, rows_per_unit: int, units: int, width: int, budget: int) -> list[_Chunk]:
    """Split every (example, view) head group into chunks of about ``budget`` scores.

    A unit is a bucket (``rows_per_unit = R``) or the dense block (one unit of P rows).
    """
    out = []
    H = plan.heads
    per_head = rows_per_unit * units * width
    for b in range(plan.batch):
        h = 0
        while h < H:
            end = h
            while end < H and plan.head_view[end] == plan.head_view[h]:
                end += 1
            if per_head <= budget:
                step = max(1, budget // per_head)
                for h0 in range(h, end, step):
                    out.append(_Chunk(b * H + h0, b * H + min(end, h0 + step), 0, units, b, plan.head_view[h]))
            else:
                step = max(1, budget // (rows_per_unit * width))
                for hh in range(h, end):
                    for n0 in range(0, units, step):
                        out.append(_Chunk(b * H + hh, b * H + hh + 1, n0, min(units, n0 + step), b, plan.head_view[h]))
            h = end
    return out


def _flat_rows(x: torch.Tensor) -> tuple[torch.Tensor, str]:
    """``[B, H, N, D]`` -> (``[rows, D]`` view without copying when possible, layout kind)."""
    if x.transpose(1, 2).is_contiguous():
        return x.transpose(1, 2).reshape(-1, x.shape[-1]), "bnhd"
    return x.contiguous().view(-1, x.shape[-1]), "bhnd"


_WORKSPACE: dict = {}


def _workspace(role: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """An uninitialised ``shape`` tensor for call-internal scratch, reused across calls on CPU.

    Fresh multi-MB CPU allocations are ``mmap``-ed and page-faulted on every call (glibc
    does so above 32 MiB), which costs as much as a GEMM pass here; the 12+ layers of an
    encoder reuse one buffer per role instead. Only for buffers that do not outlive the
    call (not outputs, not saved for backward). Kept per thread; CUDA's caching
    allocator already reuses memory, so there this is a plain ``empty``.
    """
    if like.device.type != "cpu":
        return like.new_empty(shape)
    key = (threading.get_ident(), role, like.dtype)
    numel = math.prod(shape)
    buf = _WORKSPACE.get(key)
    if buf is None or buf.numel() < numel:
        buf = _WORKSPACE[key] = like.new_empty(numel)
    return buf[:numel].view(shape)


def release_workspace() -> None:
    """Free the CPU scratch buffers kept between calls (e.g. after a long-sequence run)."""
    _WORKSPACE.clear()


class _Buffers:
    """Sorted, bucket-aligned k/v buffers and their App. D views, plus the unsorted q.

    ``data[i]`` (``i = 0`` keys, ``1`` values) is ``[R + B*H*T + R, D]``: one bucket of
    zeros, the sorted rows of every head back to back (each padded with zeros to T),
    one bucket of zeros. Hence the 3R-token window of flat bucket w is rows
    ``[w*R, w*R + 3R)``: ``unfold`` gives every window as a view, with no copy.
    Queries are gathered chunk by chunk (:meth:`query`), straight into cache.
    """

    def __init__(self, plan: BucketPlan, data: torch.Tensor, q: torch.Tensor | None = None):
        BH, T, R, G = plan.batch * plan.heads, plan.padded_len, plan.radius, plan.global_len
        self.data = data
        self.full = [data[i, R : R + BH * T].view(BH, T, -1) for i in range(data.shape[0])]
        self.global_ = [f[:, :G] for f in self.full]
        #: keys/values of each window, ``[BH*nb, D, 3R]`` (transposed, ready for Q @ K^T)
        self.window_t = [data[i].unfold(0, 3 * R, R) for i in range(data.shape[0])]
        if q is not None:
            self.q_flat, kind = _flat_rows(q)
            self.q_rows = plan.source_rows(kind).view(BH, T)

    def query(self, h0: int, h1: int, rows: slice) -> torch.Tensor:
        """Sorted (unscaled) queries of heads ``[h0, h1)``, ``rows``: ``[heads, rows, D]``."""
        index = self.q_rows[h0:h1, rows]
        return self.q_flat.index_select(0, index.reshape(-1)).view(*index.shape, -1)

    @staticmethod
    def gather(plan: BucketPlan, xs: Sequence[torch.Tensor], role: str) -> torch.Tensor:
        """Sort ``xs`` (each ``[B, H, N, D]``) into one ``[len(xs), R + B*H*T + R, D]`` buffer.

        The buffer is call-internal workspace (``role`` names it, see :func:`_workspace`).
        """
        BH, T, R, N = plan.batch * plan.heads, plan.padded_len, plan.radius, plan.seq_len
        D = xs[0].shape[-1]
        data = _workspace(role, (len(xs), R + BH * T + R, D), xs[0])
        data[:, :R].zero_()
        data[:, R + BH * T :].zero_()
        for i, x in enumerate(xs):
            flat, kind = _flat_rows(x)
            body = data[i, R : R + BH * T]
            torch.index_select(flat, 0, plan.source_rows(kind), out=body)
            body.view(BH, T, D)[:, N:].zero_()
        return data


def _long_probs(plan, bufs, c: _Chunk, dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention probabilities of one chunk of long rows: ``[hc, rows, G + 3R]``.

    App. D, one chunk at a time, into one ``[hc, rows, g + 3R]`` buffer:
    ``attention_score_to_global = einsum('BHNFE,BHTE->BHNFT', Q.long, K.global)`` fills
    ``[..., :g]``, ``attention_score_to_window = einsum('BHNFE,BHNTE->BHNFT', Q.long,
    K.window)`` fills ``[..., g:]``, the mask bias is added, then one in-place softmax
    (``attention_prob_from_long``). ``g = c.keys <= G``: global keys beyond are masked
    for every row of the chunk, so skipping them changes nothing. Returns
    ``(probs, q_long [hc, rows, D], q_buckets [hc * buckets, R, D])``.
    """
    R, g, free = plan.radius, c.keys, c.free
    hc, nbc = c.h1 - c.h0, c.n1 - c.n0
    rows = slice(c.n0 * R, c.n1 * R)
    q_long = bufs.query(c.h0, c.h1, rows)  # [hc, rows, D], unscaled
    q_buckets = q_long.view(hc * nbc, R, -1)
    scale = q_long.shape[-1] ** -0.5
    scores = torch.empty(hc, nbc * R, g + 3 * R, dtype=dtype, device=q_long.device)
    scores[..., :g].baddbmm_(q_long, bufs.global_[0][c.h0 : c.h1, :g].transpose(1, 2), beta=0, alpha=scale)
    if g > free:  # the query-set keys are allowed for every row: bias only the rest
        scores[..., free:g].add_(plan.bias("global", dtype)[c.b, c.view, rows, free:g])
    # a batched GEMM into a contiguous tensor, then one add into the strided half, beats
    # a GEMM written straight into the strided half (which runs bucket by bucket)
    to_window = torch.bmm(q_buckets, bufs.window_t[0][_windows(plan, c)]).view(hc, nbc * R, 3 * R)
    torch.add(plan.bias("window", dtype)[c.b, c.view, rows], to_window, alpha=scale, out=scores[..., g:])
    return torch.softmax(scores, -1, out=scores), q_long, q_buckets


def _windows(plan: BucketPlan, c: _Chunk) -> slice:
    """The windows of a chunk's buckets: flat bucket f (= head * nb + n) has window f."""
    nb = plan.num_buckets
    return slice(c.h0 * nb + c.n0, (c.h1 - 1) * nb + c.n1)


def _dense_probs(plan, bufs, c: _Chunk, dtype) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Probabilities of the dense (query-set) rows over every real key, ``[hc, P, n]``.

    App. D: ``attention_prob_from_global = softmax(einsum('BHFE,BHTE->BHFT', Q.global, K.full))``.
    The real keys of example b are exactly the sorted prefix ``[0, n)``, so no mask is
    needed (dense rows that are not query tokens are computed but never used). Returns
    ``(probs, q_dense [hc, P, D] unscaled, n)``.
    """
    n = max(plan.real_len[c.b], 1)
    q_dense = bufs.query(c.h0, c.h1, slice(0, plan.dense_rows))
    scale = q_dense.shape[-1] ** -0.5
    scores = torch.bmm(q_dense * scale, bufs.full[0][c.h0 : c.h1, :n].transpose(1, 2))
    return torch.softmax(scores, -1, out=scores), q_dense, n


def _dropout_mask(like: torch.Tensor, p: float, seed: int, index: int) -> torch.Tensor:
    """Keep-mask of ``like``'s shape scaled by 1/(1-p); regenerated identically in backward."""
    gen = torch.Generator(device=like.device).manual_seed((seed + 7919 * index) % (2**63 - 1))
    keep = torch.rand(like.shape, generator=gen, device=like.device) >= p
    return keep.to(like.dtype).div_(1.0 - p)


def _fold_windows(
    target: torch.Tensor, grads: torch.Tensor, first_window: int, radius: int, alpha: float = 1.0
) -> None:
    """Add window gradients ``[w, 3R, D]`` back onto the bucket-aligned rows of ``target``.

    ``target`` is ``[R + B*H*T + R, D]``; window ``first_window + i`` covers its buckets
    ``first_window + i + (0, 1, 2)``. Three non-overlapping shifted adds.
    """
    buckets = target.view(-1, radius, target.shape[-1])
    parts = grads.view(grads.shape[0], 3, radius, grads.shape[-1])
    w = grads.shape[0]
    for p in range(3):
        buckets[first_window + p : first_window + p + w].add_(parts[:, p], alpha=alpha)


def _fused_cpu_forward(q, k, v, plan: BucketPlan) -> torch.Tensor:
    """The forward in the compiled CPU kernels (:mod:`mate_cpu_kernel`): no sorted copies.

    The kernels read q, k, v rows through the per-head sort order and write each
    result row to its token's row of a ``[B, N, H, D]`` buffer (returned as
    ``[B, H, N, D]``): long rows first, then the dense query rows (disjoint rows).
    """
    B, H, N, D = q.shape
    R, T = plan.radius, plan.padded_len
    flats = [_flat_rows(x) for x in (q, k, v)]
    if len({kind for _, kind in flats}) > 1:  # one row layout for all three
        flats = [(x.contiguous().view(-1, D), "bhnd") for x in (q, k, v)]
    (qf, kind), (kf, _), (vf, _) = flats
    src = plan.source_rows(kind).view(B * H, T)
    allowed, keys, free, head_view, real = plan.kernel_args()
    out = q.new_empty(B * N * H, D)
    mate_cpu_kernel.bucketed_forward(qf, kf, vf, src, plan.dest_rows, allowed, keys, free, head_view, out, R, D**-0.5)
    if plan.dense_rows:
        mate_cpu_kernel.dense_forward(qf, kf, vf, src, plan.dest_rows, free, real, H, out, D**-0.5)
    return out.view(B, N, H, D).transpose(1, 2)


def _torch_forward(q, k, v, plan: BucketPlan, dropout_p: float, seed: int) -> torch.Tensor:
    """The forward in torch ops, chunk by chunk (module docstring)."""
    B, H, N, D = q.shape
    R, P, T = plan.radius, plan.dense_rows, plan.padded_len
    bufs = _Buffers(plan, _Buffers.gather(plan, (k, v), "kv"), q)
    budget = CHUNK_ELEMENTS.get(q.device.type, CHUNK_ELEMENTS["cuda"])
    # context in sorted order: every chunk's rows are one contiguous block of it
    # (whole heads, or a bucket range of one head), so the GEMMs write straight in
    ctx_sorted = _workspace("context", (B * H, T, D), q)

    for i, c in enumerate(plan.long_chunks(budget)):
        hc, nbc, rows = c.h1 - c.h0, c.n1 - c.n0, slice(c.n0 * R, c.n1 * R)
        probs, _, _ = _long_probs(plan, bufs, c, q.dtype)
        if dropout_p:
            probs.mul_(_dropout_mask(probs, dropout_p, seed, i))
        # context_layer_to_global + context_layer_to_window
        g = c.keys
        context = ctx_sorted[c.h0 : c.h1, rows]
        torch.bmm(probs[..., :g], bufs.global_[1][c.h0 : c.h1, :g], out=context)
        context.view(hc * nbc, R, D).baddbmm_(
            probs[..., g:].reshape(hc * nbc, R, 3 * R), bufs.window_t[1][_windows(plan, c)].transpose(1, 2)
        )

    if P:
        take = plan.dense_take[:, None, :, None].expand(B, H, P, 1).reshape(B * H, P, 1)
        for i, c in enumerate(_chunks(plan, P, 1, T, budget), start=1 << 20):
            probs, _, n = _dense_probs(plan, bufs, c, q.dtype)
            if dropout_p:
                probs.mul_(_dropout_mask(probs, dropout_p, seed, i))
            context = torch.bmm(probs, bufs.full[1][c.h0 : c.h1, :n])  # context_layer_from_global
            dense = ctx_sorted[c.h0 : c.h1, :P]
            torch.where(take[c.h0 : c.h1], context, dense, out=dense)

    return ctx_sorted.view(B * H * T, D).index_select(0, plan.unsort_bnhd).view(B, N, H, D).transpose(1, 2)


class _BucketedAttention(torch.autograd.Function):
    """Fused bucketed MATE attention; see the module docstring.

    Backward recomputes each chunk's probabilities (same ops as forward) instead of
    storing them: it keeps only q, k, v and the output, and sorts k, v again.
    """

    @staticmethod
    def forward(ctx, q, k, v, plan: BucketPlan, dropout_p: float, seed: int):
        B, H, N, D = q.shape
        if _use_cpu_kernel(q, dropout_p):
            out = _fused_cpu_forward(q, k, v, plan)
        else:
            out = _torch_forward(q, k, v, plan, dropout_p, seed)
        if any(ctx.needs_input_grad[:3]):
            ctx.save_for_backward(q, k, v, out)  # backward sorts k, v again (cheap, warm buffer)
            ctx.plan, ctx.dropout_p, ctx.seed, ctx.shape = plan, dropout_p, seed, (B, H, N, D)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out = ctx.saved_tensors
        plan, p, seed = ctx.plan, ctx.dropout_p, ctx.seed
        B, H, N, D = ctx.shape
        R, P, T = plan.radius, plan.dense_rows, plan.padded_len
        BH = B * H
        data = _Buffers.gather(plan, (k, v), "kv")
        bufs = _Buffers(plan, data, q)
        scale = D**-0.5
        budget = CHUNK_ELEMENTS.get(data.device.type, CHUNK_ELEMENTS["cuda"])
        grad_sorted = _Buffers(plan, _Buffers.gather(plan, (grad_out,), "grad_out")).full[0]  # dO sorted: [BH, T, D]
        # D_i = rowsum(dO * O) (flash-attention's identity; holds with dropout too)
        delta = (grad_out * out).sum(-1).reshape(BH, N).gather(1, plan.perm.reshape(BH, N))
        delta = F.pad(delta, (0, T - N)).to(data.dtype)
        grads = _workspace("grads", (3, *data.shape[1:]), data)  # dQ, dK, dV in the buffer layout
        grads[1:].zero_()  # dK, dV accumulate; every dQ row is first written by a long chunk
        dq, dk, dv = (grads[i, R : R + BH * T].view(BH, T, D) for i in range(3))
        if P:
            take = plan.dense_take[:, None, :].expand(B, H, P).reshape(BH, P, 1)
            grad_dense = grad_sorted[:, :P] * take  # dO of the rows the dense part answers
            delta_dense = delta[:, :P, None] * take
            # those rows take no gradient through the long part
            grad_sorted[:, :P].masked_fill_(take, 0)
            delta[:, :P].masked_fill_(take[..., 0], 0)

        for i, c in enumerate(plan.long_chunks(budget)):
            hs, hc, nbc, rows = slice(c.h0, c.h1), c.h1 - c.h0, c.n1 - c.n0, slice(c.n0 * R, c.n1 * R)
            windows, g = _windows(plan, c), c.keys
            probs, q_long, q_buckets = _long_probs(plan, bufs, c, data.dtype)
            d_out = grad_sorted[hs, rows]
            d_out_b = d_out.reshape(hc * nbc, R, D)
            # dP = dO V^T over [globals ; window]
            d_probs = torch.empty_like(probs)
            d_probs[..., :g].baddbmm_(d_out, bufs.global_[1][hs, :g].transpose(1, 2), beta=0)
            d_probs[..., g:] = torch.bmm(d_out_b, bufs.window_t[1][windows]).view(hc, nbc * R, 3 * R)
            used = probs
            if p:
                keep = _dropout_mask(probs, p, seed, i)
                d_probs.mul_(keep)
                used = probs * keep
            dv[hs, :g].baddbmm_(used[..., :g].transpose(1, 2), d_out)
            used_w = used[..., g:].reshape(hc * nbc, R, 3 * R)
            _fold_windows(grads[2], torch.bmm(used_w.transpose(1, 2), d_out_b), windows.start, R)
            # dS = P * (dP - D)
            d_scores = d_probs.sub_(delta[hs, rows, None]).mul_(probs)
            d_scores_w = d_scores[..., g:].reshape(hc * nbc, R, 3 * R)
            d_q = dq[hs, rows]
            torch.bmm(d_scores[..., :g], bufs.global_[0][hs, :g], out=d_q)
            d_q.view(hc * nbc, R, D).baddbmm_(d_scores_w, bufs.window_t[0][windows].transpose(1, 2))
            dk[hs, :g].baddbmm_(d_scores[..., :g].transpose(1, 2), q_long, alpha=scale)
            d_k_window = torch.bmm(d_scores_w.transpose(1, 2), q_buckets)
            _fold_windows(grads[1], d_k_window, windows.start, R, alpha=scale)

        if P:
            for i, c in enumerate(_chunks(plan, P, 1, T, budget), start=1 << 20):
                hs = slice(c.h0, c.h1)
                d_out = grad_dense[hs]
                probs, q_dense, n = _dense_probs(plan, bufs, c, data.dtype)
                d_probs = torch.bmm(d_out, bufs.full[1][hs, :n].transpose(1, 2))
                used = probs
                if p:
                    keep = _dropout_mask(probs, p, seed, i)
                    d_probs.mul_(keep)
                    used = probs * keep
                dv[hs, :n].baddbmm_(used.transpose(1, 2), d_out)
                d_scores = d_probs.sub_(delta_dense[hs]).mul_(probs)
                dq[hs, :P].baddbmm_(d_scores, bufs.full[0][hs, :n])
                dk[hs, :n].baddbmm_(d_scores.transpose(1, 2), q_dense, alpha=scale)

        unsort = plan.unsort_rows
        flat = grads[:, R : R + BH * T]
        dq_, dk_, dv_ = (flat[i].index_select(0, unsort).view(B, H, N, D) for i in range(3))
        return dq_.mul_(D**-0.5), dk_, dv_, None, None, None


#: use the fused CPU kernel (:mod:`mate_cpu_kernel`) where it applies; tests switch it off
#: to compare the two paths
USE_CPU_KERNEL = True


def _use_cpu_kernel(q: torch.Tensor, dropout_p: float) -> bool:
    """float32 CPU forward without attention dropout, and the kernel builds here."""
    return (
        USE_CPU_KERNEL and q.device.type == "cpu" and q.dtype == torch.float32 and not dropout_p and mate_cpu_kernel.available()
    )


def bucketed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: BucketPlan,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """MATE's bucketed attention, fused. ``q, k, v``: ``[batch, heads, seq, head_dim]``.

    ``q`` is not pre-scaled. Returns ``[batch, heads, seq, head_dim]`` (a transposed view
    of a ``[batch, seq, heads, head_dim]`` buffer, so the encoder's merge of heads is free).
    ``dropout_p`` > 0 applies dropout to the attention probabilities (reproducible in
    backward from one seed drawn from torch's global generator).
    """
    seed = int(torch.randint(0, 2**62, (1,)).item()) if dropout_p else 0
    return _BucketedAttention.apply(q, k, v, plan, float(dropout_p), seed)
