"""Bucketed MATE (the function of :mod:`.reference`) in one ``autograd.Function`` over a
:class:`~.plan.BucketPlan`; backward recomputes the probabilities. Two paths:

- **torch path** (``impl=eager``; any device, dtype, dropout): k and v sorted once into a bucket-aligned buffer
  (:class:`_Buffers`) whose 3-bucket windows are zero-copy ``unfold`` views; the sorted rows walked in cache-sized
  chunks (:data:`CHUNK_ELEMENTS`). Global keys masked for a whole chunk are skipped, and dense rows read only the real
  keys (a sorted prefix). Linear time and memory. Dropout masks come from a generator seeded by (seed, chunk), so
  backward redraws them.
- **fused CPU kernel** (``impl=kernel``; :mod:`.cpu_kernel`), where ``use_cpu_kernel`` allows it and the kernel
  loads: float32 math, bfloat16/float16 inputs widened exactly and results rounded once (:func:`_widened`).
"""

from __future__ import annotations

import math
import threading
from typing import Sequence

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from mate_cli.modeling.attention.mate import cpu_kernel
from mate_cli.modeling.attention.mate.plan import BucketPlan, Chunk

#: Score elements per chunk of the torch path (CPU: 4 MiB of float32, about L2-sized).
CHUNK_ELEMENTS = {"cpu": 1 << 20, "cuda": 1 << 25}


class Workspace:
    """Uninitialised scratch tensors, reused across calls on CPU, per thread (the MATE backend keeps one per layout).

    Fresh multi-MB CPU allocations are ``mmap``-ed and page-faulted on every call (glibc, above 32 MiB), which costs
    as much as a GEMM pass here. Only for buffers that do not outlive the call (not outputs, not saved for backward).
    On CUDA, whose caching allocator already reuses memory, :meth:`get` is a plain ``empty``.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}

    def get(
        self, role: str, shape: tuple[int, ...], like: torch.Tensor, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        dtype = like.dtype if dtype is None else dtype
        if like.device.type != "cpu":
            return like.new_empty(shape, dtype=dtype)
        key = (threading.get_ident(), role, dtype)
        numel = math.prod(shape)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < numel:
            buf = self._buffers[key] = like.new_empty(numel, dtype=dtype)
        return buf[:numel].view(shape)


def _flat_rows(x: torch.Tensor) -> tuple[torch.Tensor, str]:
    """``[B, H, N, D]`` -> (``[rows, D]`` view without copying when possible, layout kind)."""
    if x.transpose(1, 2).is_contiguous():
        return x.transpose(1, 2).reshape(-1, x.shape[-1]), "bnhd"
    return x.contiguous().view(-1, x.shape[-1]), "bhnd"


class _Buffers:
    """Sorted, bucket-aligned k/v and their App. D views, plus the unsorted q. ``data[i]`` (0 keys, 1 values) is
    ``[R + B*H*T + R, D]``: a zero bucket, each head's sorted rows zero-padded to T, a zero bucket; so flat bucket w's
    window is rows ``[w*R, w*R + 3R)``, an ``unfold`` view."""

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
    def gather(plan: BucketPlan, xs: Sequence[torch.Tensor], role: str, workspace: Workspace) -> torch.Tensor:
        """Sort ``xs`` (each ``[B, H, N, D]``) into one ``[len(xs), R + B*H*T + R, D]`` scratch buffer (``role``)."""
        BH, T, R, N = plan.batch * plan.heads, plan.padded_len, plan.radius, plan.seq_len
        D = xs[0].shape[-1]
        data = workspace.get(role, (len(xs), R + BH * T + R, D), xs[0])
        data[:, :R].zero_()
        data[:, R + BH * T :].zero_()
        for i, x in enumerate(xs):
            flat, kind = _flat_rows(x)
            body = data[i, R : R + BH * T]
            torch.index_select(flat, 0, plan.source_rows(kind), out=body)
            body.view(BH, T, D)[:, N:].zero_()
        return data


def _long_probs(plan: BucketPlan, bufs: _Buffers, c: Chunk, dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """App. D's ``attention_prob_from_long`` for one chunk, ``[hc, rows, g + 3R]``, scoring only the ``g = c.keys``
    global keys not masked for the whole chunk. Returns ``(probs, q_long [hc, rows, D], q_buckets [hc * buckets, R,
    D])``."""
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


def _windows(plan: BucketPlan, c: Chunk) -> slice:
    """The windows of a chunk's buckets: flat bucket f (= head * nb + n) has window f."""
    nb = plan.num_buckets
    return slice(c.h0 * nb + c.n0, (c.h1 - 1) * nb + c.n1)


def _dense_probs(plan: BucketPlan, bufs: _Buffers, c: Chunk, dtype) -> tuple[torch.Tensor, torch.Tensor, int]:
    """App. D's ``attention_prob_from_global``, ``[hc, P, n]``: the real keys are the sorted prefix ``[0, n)``, under
    MATE's pattern (the global part's table tokens see the query set and their row/column). Returns ``(probs,
    q_dense unscaled, n)``."""
    n = max(plan.real_len[c.b], 1)
    q_dense = bufs.query(c.h0, c.h1, slice(0, plan.dense_rows))
    scale = q_dense.shape[-1] ** -0.5
    scores = torch.bmm(q_dense * scale, bufs.full[0][c.h0 : c.h1, :n].transpose(1, 2))
    scores.masked_fill_(~plan.dense_allowed[c.b, c.view, :, :n], torch.finfo(scores.dtype).min / 2)
    return torch.softmax(scores, -1, out=scores), q_dense, n


def _dropout_mask(like: torch.Tensor, p: float, seed: int, index: int) -> torch.Tensor:
    """Keep-mask of ``like``'s shape scaled by 1/(1-p); regenerated identically in backward."""
    gen = torch.Generator(device=like.device).manual_seed((seed + 7919 * index) % (2**63 - 1))
    keep = torch.rand(like.shape, generator=gen, device=like.device) >= p
    return keep.to(like.dtype).div_(1.0 - p)


def _fold_windows(
    target: torch.Tensor, grads: torch.Tensor, first_window: int, radius: int, alpha: float = 1.0
) -> None:
    """Add window gradients ``[w, 3R, D]`` onto ``target`` ``[R + B*H*T + R, D]``: window ``first_window + i``
    covers buckets ``first_window + i + (0, 1, 2)``."""
    buckets = target.view(-1, radius, target.shape[-1])
    parts = grads.view(grads.shape[0], 3, radius, grads.shape[-1])
    w = grads.shape[0]
    for p in range(3):
        buckets[first_window + p : first_window + p + w].add_(parts[:, p], alpha=alpha)


#: Dtypes the fused CPU kernel takes (:func:`_widened`).
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _widened(x: torch.Tensor, role: str, workspace: Workspace) -> torch.Tensor:
    """``x`` ``[B, H, N, D]`` in float32 for the kernel: ``x`` itself, or a copy in ``workspace`` scratch that keeps
    ``x``'s row layout (copying the buffer whole is several times faster than through the transposed view)."""
    if x.dtype == torch.float32:
        return x
    B, H, N, D = x.shape
    if x.transpose(1, 2).is_contiguous():
        return workspace.get(role, (B, N, H, D), x, torch.float32).copy_(x.transpose(1, 2)).transpose(1, 2)
    return workspace.get(role, (B, H, N, D), x, torch.float32).copy_(x)


def _narrowed(rows: torch.Tensor, shape: tuple[int, ...], kind: str, dtype: torch.dtype) -> torch.Tensor:
    """Flat float32 result rows (layout ``kind``) as ``[B, H, N, D]`` in ``dtype``: one rounding."""
    B, H, N, D = shape
    if kind == "bnhd":
        return rows.view(B, N, H, D).to(dtype).transpose(1, 2)
    return rows.view(B, H, N, D).to(dtype)


def _kernel_rows(q, k, v, plan: BucketPlan):
    """q, k, v as ``[rows, D]`` in one row layout, and each sorted slot's row: ``(qf, kf, vf, src, kind)``."""
    B, H, N, D = q.shape
    flats = [_flat_rows(x) for x in (q, k, v)]
    if len({kind for _, kind in flats}) > 1:  # one row layout for all three
        flats = [(x.contiguous().view(-1, D), "bhnd") for x in (q, k, v)]
    (qf, kind), (kf, _), (vf, _) = flats
    return qf, kf, vf, plan.source_rows(kind).view(B * H, plan.padded_len), kind


def _fused_cpu_forward(q, k, v, plan: BucketPlan, dropout_p: float, seed: int, workspace: Workspace) -> torch.Tensor:
    """The kernel's forward: q, k, v read through the sort order (no sorted copies), results written to their
    tokens' rows of a ``[B, N, H, D]`` buffer; long rows, then the dense rows (disjoint: the long op skips them)."""
    B, H, N, D = q.shape
    dtype = q.dtype
    q, k, v = (_widened(x, f"kernel_{name}", workspace) for x, name in zip((q, k, v), "qkv"))
    qf, kf, vf, src, kind = _kernel_rows(q, k, v, plan)
    allowed, keys, free, dense, head_view, real, groups, token_groups = plan.kernel_args
    # float32 results are returned as they are; others are rounded from scratch
    out = q.new_empty(B * N * H, D) if dtype == torch.float32 else workspace.get("kernel_out", (B * N * H, D), q)
    torch.ops.mate_cpu.bucketed_forward(qf, kf, vf, src, plan.dest_rows, allowed, keys, free, dense, head_view, out,
                                        plan.radius, D**-0.5, dropout_p, seed)  # fmt: skip
    if plan.dense_rows:
        token_rows = plan.token_rows(kind)
        torch.ops.mate_cpu.dense_forward(qf, kf, vf, src, plan.dest_rows, dense, real, token_rows, head_view, groups,
                                         token_groups, out, D**-0.5, dropout_p, seed)  # fmt: skip
    return _narrowed(out, (B, H, N, D), "bnhd", dtype)


def _fused_cpu_backward(
    q, k, v, out, grad_out, plan: BucketPlan, dropout_p: float, seed: int, workspace: Workspace
) -> tuple[torch.Tensor, ...]:
    """dq, dk, dv of :func:`_fused_cpu_forward`, in q, k and v's dtypes; ``out`` is the forward's result."""
    B, H, N, D = q.shape
    dtypes = (q.dtype, k.dtype, v.dtype)
    names = ("q", "k", "v", "out", "grad_out")
    q, k, v, out, grad_out = (_widened(x, f"kernel_{n}", workspace) for x, n in zip((q, k, v, out, grad_out), names))
    qf, kf, vf, src, kind = _kernel_rows(q, k, v, plan)
    grad_rows, grad_kind = _flat_rows(grad_out)  # read in its own layout: no copy for either
    grad_src = plan.source_rows(grad_kind).view(B * H, plan.padded_len)
    out_rows = out.transpose(1, 2).reshape(-1, D)  # the forward's [B, N, H, D] buffer (a view)
    grads = [
        torch.empty_like(qf) if t == torch.float32 else workspace.get(f"kernel_d{name}", qf.shape, qf)
        for t, name in zip(dtypes, "qkv")
    ]
    allowed, keys, free, dense, head_view, real, groups, _ = plan.kernel_args
    torch.ops.mate_cpu.bucketed_backward(
        qf, kf, vf, grad_rows, grad_src, out_rows, src, plan.dest_rows, allowed, keys, free, dense, head_view, real,
        plan.token_rows(kind), groups, *grads, plan.radius, D**-0.5, dropout_p, seed,
    )  # fmt: skip
    return tuple(_narrowed(g, (B, H, N, D), kind, t) for g, t in zip(grads, dtypes))


def _torch_forward(q, k, v, plan: BucketPlan, dropout_p: float, seed: int, workspace: Workspace) -> torch.Tensor:
    B, H, N, D = q.shape
    R, P, T = plan.radius, plan.dense_rows, plan.padded_len
    bufs = _Buffers(plan, _Buffers.gather(plan, (k, v), "kv", workspace), q)
    budget = CHUNK_ELEMENTS.get(q.device.type, CHUNK_ELEMENTS["cuda"])
    # context in sorted order: every chunk's rows are one contiguous block of it
    # (whole heads, or a bucket range of one head), so the GEMMs write straight in
    ctx_sorted = workspace.get("context", (B * H, T, D), q)

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
        for i, c in enumerate(plan.dense_chunks(budget), start=1 << 20):
            probs, _, n = _dense_probs(plan, bufs, c, q.dtype)
            if dropout_p:
                probs.mul_(_dropout_mask(probs, dropout_p, seed, i))
            context = torch.bmm(probs, bufs.full[1][c.h0 : c.h1, :n])  # context_layer_from_global
            dense = ctx_sorted[c.h0 : c.h1, :P]
            torch.where(take[c.h0 : c.h1], context, dense, out=dense)

    return ctx_sorted.view(B * H * T, D).index_select(0, plan.unsort_bnhd).view(B, N, H, D).transpose(1, 2)


def _torch_backward(
    q, k, v, out, grad_out, plan: BucketPlan, p: float, seed: int, workspace: Workspace
) -> tuple[torch.Tensor, ...]:
    """dq, dk, dv of :func:`_torch_forward` (``out`` its result), the probabilities recomputed chunk by chunk."""
    B, H, N, D = q.shape
    R, P, T = plan.radius, plan.dense_rows, plan.padded_len
    BH = B * H
    data = _Buffers.gather(plan, (k, v), "kv", workspace)
    bufs = _Buffers(plan, data, q)
    scale = D**-0.5
    budget = CHUNK_ELEMENTS.get(data.device.type, CHUNK_ELEMENTS["cuda"])
    grad_sorted = _Buffers(plan, _Buffers.gather(plan, (grad_out,), "grad_out", workspace)).full[0]  # [BH, T, D]
    # D_i = rowsum(dO * O) (flash-attention's identity; holds with dropout too)
    delta = (grad_out * out).sum(-1).reshape(BH, N).gather(1, plan.perm.reshape(BH, N))
    delta = F.pad(delta, (0, T - N)).to(data.dtype)
    grads = workspace.get("grads", (3, *data.shape[1:]), data)  # dQ, dK, dV in the buffer layout
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
        _fold_windows(grads[1], torch.bmm(d_scores_w.transpose(1, 2), q_buckets), windows.start, R, alpha=scale)

    if P:
        for i, c in enumerate(plan.dense_chunks(budget), start=1 << 20):
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

    flat = grads[:, R : R + BH * T]
    dq_, dk_, dv_ = (flat[i].index_select(0, plan.unsort_rows).view(B, H, N, D) for i in range(3))
    return dq_.mul_(D**-0.5), dk_, dv_


class _BucketedAttention(torch.autograd.Function):
    """Fused bucketed MATE attention; backward recomputes the probabilities (first-order gradients only)."""

    @staticmethod
    def forward(ctx, q, k, v, plan: BucketPlan, dropout_p: float, seed: int, workspace: Workspace, fused_cpu: bool):
        out = (_fused_cpu_forward if fused_cpu else _torch_forward)(q, k, v, plan, dropout_p, seed, workspace)
        if any(ctx.needs_input_grad[:3]):
            ctx.save_for_backward(q, k, v, out)
            ctx.args, ctx.fused_cpu = (plan, dropout_p, seed, workspace), fused_cpu
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, k, v, out = ctx.saved_tensors
        backward = _fused_cpu_backward if ctx.fused_cpu else _torch_backward  # the kernel ran the forward: it applies
        return (*backward(q, k, v, out, grad_out, *ctx.args), None, None, None, None, None)


def cpu_kernel_applies(q: torch.Tensor) -> bool:
    return q.device.type == "cpu" and q.dtype in KERNEL_DTYPES and cpu_kernel.available()


def bucketed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: BucketPlan,
    dropout_p: float = 0.0,
    *,
    use_cpu_kernel: bool = True,
    workspace: Workspace | None = None,
    seed: int | None = None,
) -> torch.Tensor:
    """Bucketed MATE: ``q, k, v`` ``[batch, heads, seq, head_dim]`` (q not pre-scaled) -> the same shape, a
    transposed view of a ``[batch, seq, heads, head_dim]`` buffer (so the encoder's merge of heads is free).
    ``use_cpu_kernel=False`` forces the torch path; ``seed`` (default: from torch's global generator) keys dropout."""
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)).item()) if dropout_p else 0
    fused_cpu = use_cpu_kernel and cpu_kernel_applies(q)
    workspace = Workspace() if workspace is None else workspace
    return _BucketedAttention.apply(q, k, v, plan, float(dropout_p), seed, workspace, fused_cpu)
