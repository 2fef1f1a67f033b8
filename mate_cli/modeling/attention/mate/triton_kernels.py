"""The Triton kernels of :mod:`.triton` (forward and the merge of its splits; dQ, dK/dV and the sum of their
splits) and their device functions; imported only through :func:`.triton.kernels`, which checks Triton's mode.

Every ``[B, H, N, D]`` tensor they read or write is a view of a ``[B, N, H, D]`` buffer (what the encoder's
projections give): element ``(b, h, n, d)`` at ``((b * N + n) * H + h) * D + d``, so no strides are passed. Heads,
globals, radius, scale and dropout rate are compile-time settings (fixed by the model's config); a launch takes
pointers and the sequence's sizes only, which keeps its host time short.

Each kernel takes its arguments flat (what a launch passes: the settings it reads) and bundles them for its device
functions: the compile-time settings as one :class:`Settings`, the layout's tensors as a :class:`Structure`, what a
program knows of its example x head as a :class:`Program` and a tile of sorted positions as a :class:`Tile`. The
bundles are named tuples, which Triton unpacks at compile time: they cost nothing when the kernels run."""

from collections import namedtuple

import triton
import triton.language as tl


#: the compile-time settings: heads, head size (and its power-of-two block), globals, bucket radius, score scale,
#: dropout rate, tile sizes, the padding group id, the products' precision, the most splits
Settings = namedtuple("Settings", "H D G R SCALE DROPOUT_P BLOCK_D BLOCK_M BLOCK_N PAD PREC MAX_SPLITS")
#: the layout's int32 tensors (:class:`.triton.TritonStructure`), the int64 dropout seed, the padded length
Structure = namedtuple("Structure", "PERM GROUPS DENSE REAL SEED N")
#: this program's example x head: ``bh``, the offset of (b, h) in every ``[B, N, H, D]`` buffer, the example's dense
#: and real counts, the seed, and the head-dim columns with their mask
Program = namedtuple("Program", "bh base dense real seed dcol d_ok")
#: sorted positions from ``start`` (query rows; key columns): the positions, which are in the sequence, their tokens
#: and their groups
Tile = namedtuple("Tile", "start pos ok tok group")


@triton.jit
def gathered(start, pos, ok, st, bh, PAD: tl.constexpr):
    """The :class:`Tile` of sorted positions ``pos`` (from ``start``) of ``bh`` where ``ok``: their tokens and
    groups read."""
    tok = tl.load(st.PERM + bh * st.N + pos, mask=ok, other=0)
    group = tl.load(st.GROUPS + bh * st.N + pos, mask=ok, other=PAD)
    return Tile(start, pos, ok, tok, group)


@triton.jit
def positions(start, end, st, bh, BLOCK: tl.constexpr, PAD: tl.constexpr):
    """The :class:`Tile` of ``BLOCK`` sorted positions from ``start`` of ``bh``, those at ``end`` or later masked."""
    pos = start + tl.arange(0, BLOCK)
    return gathered(start, pos, pos < end, st, bh, PAD)


@triton.jit
def own_tile(tile, st, cfg: tl.constexpr, BLOCK: tl.constexpr):
    """This program's :class:`Program` and its tile ``tile`` of ``BLOCK`` sorted positions (query rows; key columns
    in the dK/dV pass)."""
    start = tile * BLOCK
    bh = tl.program_id(1)
    b, h = bh // cfg.H, bh % cfg.H
    base = b.to(tl.int64) * st.N * (cfg.H * cfg.D) + h * cfg.D
    dense, real, seed = tl.load(st.DENSE + b), tl.load(st.REAL + b), tl.load(st.SEED)
    pos = start + tl.arange(0, BLOCK)
    ok = pos < st.N
    dcol = tl.arange(0, cfg.BLOCK_D)
    d_ok = dcol < cfg.D
    return Program(bh, base, dense, real, seed, dcol, d_ok), gathered(start, pos, ok, st, bh, cfg.PAD)


@triton.jit
def allowed(rows, cols, dense, cfg: tl.constexpr):
    """MATE's pattern within the globals and the 3-bucket window; dense rows reach every key."""
    g_row, g_col = rows.group, cols.group
    mate = (g_col[None, :] < cfg.PAD) & (
        (g_row[:, None] == 0) | (g_col[None, :] == 0) | (g_row[:, None] == g_col[None, :])
    )
    near = tl.abs(rows.pos[:, None] // cfg.R - cols.pos[None, :] // cfg.R) <= 1
    return mate & ((rows.pos[:, None] < dense) | (cols.pos[None, :] < cfg.G) | near)


@triton.jit
def keep_scale(prog, rows, cols, cfg: tl.constexpr):
    """``1/(1-p)`` where the Philox draw for (bh, query token, key token) keeps the score, else 0."""
    zero = (rows.tok[:, None] * 0 + cols.tok[None, :] * 0).to(tl.uint32)
    if cfg.DROPOUT_P > 0:
        c0 = zero + cols.tok[None, :].to(tl.uint32)
        c1 = zero + rows.tok[:, None].to(tl.uint32)
        c2 = zero + prog.bh.to(tl.uint32)
        r, _, _, _ = tl.philox(prog.seed, c0, c1, c2, zero)
        u = tl.uint_to_uniform_float(r)
        return tl.where(u >= cfg.DROPOUT_P, 1.0 / (1.0 - cfg.DROPOUT_P), 0.0)
    else:
        return zero.to(tl.float32) + 1.0


@triton.jit
def load_rows(X, prog, tile, cfg: tl.constexpr):
    """The ``[BLOCK, BLOCK_D]`` rows of ``X`` at the tile's tokens (0 outside the sequence and the head size)."""
    return tl.load(X + prog.base + tile.tok[:, None] * (cfg.H * cfg.D) + prog.dcol[None, :],
                   mask=tile.ok[:, None] & prog.d_ok[None, :], other=0.0)  # fmt: skip


@triton.jit
def store_rows(X, prog, tile, value, cfg: tl.constexpr):
    tl.store(X + prog.base + tile.tok[:, None] * (cfg.H * cfg.D) + prog.dcol[None, :], value.to(X.dtype.element_ty),
             mask=tile.ok[:, None] & prog.d_ok[None, :])  # fmt: skip


@triton.jit
def row_values(P, prog, tile, st, other):
    """A ``[B*H, N]`` float32 statistic (log-sum-exp, delta) at the tile's tokens."""
    return tl.load(P + prog.bh * st.N + tile.tok, mask=tile.ok, other=other)


@triton.jit
def key_tile(start, hi, q, rows, K, V, st, prog, cfg: tl.constexpr):
    """Key tile ``[start, start + BLOCK_N)`` of the interval ending at ``hi``: its :class:`Tile`, k, v, the query
    tile's scaled scores and where MATE allows them."""
    cols = positions(start, hi, st, prog.bh, cfg.BLOCK_N, cfg.PAD)
    k = load_rows(K, prog, cols, cfg)
    v = load_rows(V, prog, cols, cfg)
    s = tl.dot(q, tl.trans(k), input_precision=cfg.PREC) * cfg.SCALE
    ok = allowed(rows, cols, prog.dense, cfg) & cols.ok[None, :]
    return cols, k, v, s, ok


@triton.jit
def forward_tiles(acc, l_i, m_i, lo, hi, q, rows, K, V, st, prog, VISITS, cfg: tl.constexpr, COUNT: tl.constexpr):
    for start in range(lo, hi, cfg.BLOCK_N):
        if COUNT:  # the (query tile, key tile) pairs visited, for checking the work
            tl.atomic_add(VISITS, 1)
        cols, k, v, s, ok = key_tile(start, hi, q, rows, K, V, st, prog, cfg)
        s = tl.where(ok, s, -1.0e30)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.where(ok, tl.exp(s - m_new[:, None]), 0.0)
        l_i = l_i * alpha + tl.sum(p, 1)
        p = p * keep_scale(prog, rows, cols, cfg)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=cfg.PREC)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def split_tile(pid, T, S):
    """Program ``pid`` of a pass's grid: ``(False, tile, split)`` for the ``S`` splits of the other axis of each of
    the ``T`` long tiles, first (the longest programs start first), then ``(True, tile, 0)`` for every tile of
    sorted positions."""
    own = pid >= T * S
    return own, tl.where(own, pid - T * S, pid // S), tl.where(own, 0, pid % S)


@triton.jit
def part_offsets(bh, tile, split, T, S, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
    """Offsets of split ``split`` of long tile ``tile`` of ``bh`` in a float32 partials buffer: its ``[BLOCK]`` row
    statistics and its ``[BLOCK, BLOCK_D]`` block."""
    part = (bh * T + tile) * S + split
    r = tl.arange(0, BLOCK)
    return part * BLOCK + r, (part * BLOCK + r)[:, None] * BLOCK_D + tl.arange(0, BLOCK_D)[None, :]


@triton.jit
def query_tile_bounds(own, m0, split, N, real, CHUNK, cfg: tl.constexpr):
    """The key intervals ``[lo1, hi1)``, ``[lo2, hi2)`` a query program visits: a table-row tile's globals and its
    buckets' window, or one ``CHUNK`` of every real key (a dense tile's split)."""
    last = tl.minimum(m0 + cfg.BLOCK_M, N) - 1
    # window: buckets m0 // R - 1 .. last // R + 1, from G on (keys below G are the first interval)
    lo1 = tl.where(own, 0, split * CHUNK)
    hi1 = tl.where(own, tl.minimum(cfg.G, real), tl.minimum(split * CHUNK + CHUNK, real))
    lo2 = tl.where(own, tl.maximum(cfg.G, (m0 // cfg.R - 1) * cfg.R), 0)
    hi2 = tl.where(own, tl.minimum(real, (last // cfg.R + 2) * cfg.R), 0)
    return lo1, hi1, lo2, hi2


@triton.jit
def forward_kernel(
    Q, K, V, OUT, LSE, M_PART, L_PART, ACC_PART, PERM, GROUPS, DENSE, REAL, SEED, VISITS, N, T, S, CHUNK,
    H: tl.constexpr, D: tl.constexpr, G: tl.constexpr, R: tl.constexpr, SCALE: tl.constexpr,
    DROPOUT_P: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PAD: tl.constexpr, PREC: tl.constexpr, MAX_SPLITS: tl.constexpr, COUNT: tl.constexpr = False,
):  # fmt: skip
    """``T x S`` programs, one per ``CHUNK`` of the keys of a tile that may hold a dense row (a partial softmax,
    merged by :func:`combine_kernel`), then one per query tile of table rows."""
    cfg: tl.constexpr = Settings(H, D, G, R, SCALE, DROPOUT_P, BLOCK_D, BLOCK_M, BLOCK_N, PAD, PREC, MAX_SPLITS)
    st = Structure(PERM, GROUPS, DENSE, REAL, SEED, N)
    own, tile, split = split_tile(tl.program_id(0), T, S)
    prog, rows = own_tile(tile, st, cfg, BLOCK_M)
    if own != (rows.start < prog.dense):  # a dense tile is done by its splits only
        q = load_rows(Q, prog, rows, cfg)
        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        lo1, hi1, lo2, hi2 = query_tile_bounds(own, rows.start, split, N, prog.real, CHUNK, cfg)
        acc, l_i, m_i = forward_tiles(acc, l_i, m_i, lo1, hi1, q, rows, K, V, st, prog, VISITS, cfg, COUNT)
        acc, l_i, m_i = forward_tiles(acc, l_i, m_i, lo2, hi2, q, rows, K, V, st, prog, VISITS, cfg, COUNT)
        if own:
            store_rows(OUT, prog, rows, acc / l_i[:, None], cfg)
            tl.store(LSE + prog.bh * N + rows.tok, m_i + tl.log(l_i), mask=rows.ok)
        else:
            stat, block = part_offsets(prog.bh, tile, split, T, S, BLOCK_M, BLOCK_D)
            tl.store(M_PART + stat, m_i)
            tl.store(L_PART + stat, l_i)
            tl.store(ACC_PART + block, acc)


@triton.jit
def combine_kernel(
    OUT, LSE, M_PART, L_PART, ACC_PART, PERM, GROUPS, DENSE, REAL, SEED, N, T, S,
    H: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, PAD: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
):  # fmt: skip
    """A dense tile's output and log-sum-exp from its splits' partial softmaxes: the rows' maximum over all splits
    first, so that the splits' loads do not wait on each other. It takes only the settings it reads (None in the
    bundle for the rest), so training and evaluation, whose dropout differs, share one compiled kernel."""
    cfg: tl.constexpr = Settings(H, D, None, None, None, None, BLOCK_D, BLOCK_M, None, PAD, None, MAX_SPLITS)
    tile = tl.program_id(0)
    prog, rows = own_tile(tile, Structure(PERM, GROUPS, DENSE, REAL, SEED, N), cfg, BLOCK_M)
    if rows.start < prog.dense:
        bh = prog.bh
        splits = tl.arange(0, MAX_SPLITS)
        stats = ((bh * T + tile) * S + splits)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
        m_all = tl.load(M_PART + stats, mask=splits[:, None] < S, other=-1.0e30)
        m_i = tl.max(m_all, 0)
        w_all = tl.where(splits[:, None] < S, tl.exp(m_all - m_i[None, :]), 0.0)
        l_i = tl.sum(w_all * tl.load(L_PART + stats, mask=splits[:, None] < S, other=0.0), 0)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for split in tl.static_range(MAX_SPLITS):
            if split < S:
                stat, block = part_offsets(bh, tile, split, T, S, BLOCK_M, BLOCK_D)
                acc += tl.load(ACC_PART + block) * tl.exp(tl.load(M_PART + stat) - m_i)[:, None]
        store_rows(OUT, prog, rows, acc / l_i[:, None], cfg)
        tl.store(LSE + bh * N + rows.tok, m_i + tl.log(l_i), mask=rows.ok)


@triton.jit
def dq_tiles(dq, lo, hi, q, do, lse, delta, rows, K, V, st, prog, cfg: tl.constexpr):
    for start in range(lo, hi, cfg.BLOCK_N):
        cols, k, v, s, ok = key_tile(start, hi, q, rows, K, V, st, prog, cfg)
        p = tl.where(ok, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=cfg.PREC)
        dp = dp * keep_scale(prog, rows, cols, cfg)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=cfg.PREC)
    return dq


@triton.jit
def dq_kernel(
    Q, K, V, OUT, DO, LSE, DELTA, DQ, DQ_PART, PERM, GROUPS, DENSE, REAL, SEED, N, T, S, CHUNK,
    H: tl.constexpr, D: tl.constexpr, G: tl.constexpr, R: tl.constexpr, SCALE: tl.constexpr,
    DROPOUT_P: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PAD: tl.constexpr, PREC: tl.constexpr, MAX_SPLITS: tl.constexpr,
):  # fmt: skip
    """dQ over the forward's key tiles; a dense tile's in ``S`` key chunks, summed by :func:`reduce_kernel`. Each
    program computes its rows' ``delta = rowsum(dO * O)`` and stores it (the first split of a dense tile) for
    :func:`dkdv_kernel`, launched after it."""
    cfg: tl.constexpr = Settings(H, D, G, R, SCALE, DROPOUT_P, BLOCK_D, BLOCK_M, BLOCK_N, PAD, PREC, MAX_SPLITS)
    st = Structure(PERM, GROUPS, DENSE, REAL, SEED, N)
    own, tile, split = split_tile(tl.program_id(0), T, S)
    prog, rows = own_tile(tile, st, cfg, BLOCK_M)
    if own != (rows.start < prog.dense):
        q = load_rows(Q, prog, rows, cfg)
        do = load_rows(DO, prog, rows, cfg)
        out = load_rows(OUT, prog, rows, cfg)
        delta = tl.sum(do.to(tl.float32) * out.to(tl.float32), 1)
        if split == 0:
            tl.store(DELTA + prog.bh * N + rows.tok, delta, mask=rows.ok)
        lse = row_values(LSE, prog, rows, st, 0.0)
        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        lo1, hi1, lo2, hi2 = query_tile_bounds(own, rows.start, split, N, prog.real, CHUNK, cfg)
        dq = dq_tiles(dq, lo1, hi1, q, do, lse, delta, rows, K, V, st, prog, cfg)
        dq = dq_tiles(dq, lo2, hi2, q, do, lse, delta, rows, K, V, st, prog, cfg)
        if own:
            store_rows(DQ, prog, rows, dq * SCALE, cfg)
        else:
            block = part_offsets(prog.bh, tile, split, T, S, BLOCK_M, BLOCK_D)[1]
            tl.store(DQ_PART + block, dq)


@triton.jit
def dkdv_tiles(dk, dv, lo, hi, k, v, cols, Q, DO, LSE, DELTA, st, prog, cfg: tl.constexpr):
    for start in range(lo, hi, cfg.BLOCK_M):
        rows = positions(start, st.N, st, prog.bh, cfg.BLOCK_M, cfg.PAD)
        q = load_rows(Q, prog, rows, cfg)
        do = load_rows(DO, prog, rows, cfg)
        lse = row_values(LSE, prog, rows, st, 0.0)
        delta = row_values(DELTA, prog, rows, st, 0.0)
        s = tl.dot(q, tl.trans(k), input_precision=cfg.PREC) * cfg.SCALE
        ok = allowed(rows, cols, prog.dense, cfg) & rows.ok[:, None] & cols.ok[None, :]
        p = tl.where(ok, tl.exp(s - lse[:, None]), 0.0)
        keep = keep_scale(prog, rows, cols, cfg)
        dv += tl.dot(tl.trans((p * keep).to(do.dtype)), do, input_precision=cfg.PREC)
        dp = tl.dot(do, tl.trans(v), input_precision=cfg.PREC) * keep
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=cfg.PREC)
    return dk, dv


@triton.jit
def dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, DK_PART, DV_PART, PERM, GROUPS, DENSE, REAL, SEED, N, J, S, CHUNK,
    H: tl.constexpr, D: tl.constexpr, G: tl.constexpr, R: tl.constexpr, SCALE: tl.constexpr,
    DROPOUT_P: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PAD: tl.constexpr, PREC: tl.constexpr, MAX_SPLITS: tl.constexpr,
):  # fmt: skip
    """dK, dV of a key tile over the query tiles that attend it; a global key tile (one of the first ``J``) is
    attended by every row, so it is done in ``S`` chunks of rows, summed by :func:`reduce_kernel`."""
    cfg: tl.constexpr = Settings(H, D, G, R, SCALE, DROPOUT_P, BLOCK_D, BLOCK_M, BLOCK_N, PAD, PREC, MAX_SPLITS)
    st = Structure(PERM, GROUPS, DENSE, REAL, SEED, N)
    own, tile, split = split_tile(tl.program_id(0), J, S)
    prog, cols = own_tile(tile, st, cfg, BLOCK_N)
    n0 = cols.start
    if own != (n0 < G):
        k = load_rows(K, prog, cols, cfg)
        v = load_rows(V, prog, cols, cfg)
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        # a table key: the dense rows (whole tiles from 0), then the rows whose window reaches it, starting after
        # the last dense tile so no tile is visited twice; a global key: one chunk of every row
        last = tl.minimum(n0 + BLOCK_N, N) - 1
        lo1 = tl.where(own, 0, split * CHUNK)
        hi1 = tl.where(own, prog.dense, tl.minimum(split * CHUNK + CHUNK, N))
        lo2 = tl.where(own, tl.maximum(tl.cdiv(prog.dense, BLOCK_M) * BLOCK_M, (n0 // R - 1) * R), 0)
        hi2 = tl.where(own, tl.minimum(N, (last // R + 2) * R), 0)
        dk, dv = dkdv_tiles(dk, dv, lo1, hi1, k, v, cols, Q, DO, LSE, DELTA, st, prog, cfg)
        dk, dv = dkdv_tiles(dk, dv, lo2, hi2, k, v, cols, Q, DO, LSE, DELTA, st, prog, cfg)
        if own:
            store_rows(DK, prog, cols, dk * SCALE, cfg)
            store_rows(DV, prog, cols, dv, cfg)
        else:
            block = part_offsets(prog.bh, tile, split, J, S, BLOCK_N, BLOCK_D)[1]
            tl.store(DK_PART + block, dk)
            tl.store(DV_PART + block, dv)


@triton.jit
def sum_parts(PART, bh, tile, T, S, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, MAX_SPLITS: tl.constexpr):
    """The ``S`` splits' partial ``[BLOCK, BLOCK_D]`` blocks of a long tile, summed in split order (unrolled: the
    loads do not wait on each other)."""
    total = tl.zeros([BLOCK, BLOCK_D], tl.float32)
    for split in tl.static_range(MAX_SPLITS):
        if split < S:
            total += tl.load(PART + part_offsets(bh, tile, split, T, S, BLOCK, BLOCK_D)[1])
    return total


@triton.jit
def reduce_kernel(
    DQ, DK, DV, DQ_PART, DK_PART, DV_PART, PERM, GROUPS, DENSE, REAL, SEED, N, T, J, S,
    H: tl.constexpr, D: tl.constexpr, SCALE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PAD: tl.constexpr, MAX_SPLITS: tl.constexpr,
):  # fmt: skip
    """The split tiles' gradients, summed: dQ of the ``T`` dense tiles, then dK, dV of the ``J`` global tiles (only
    the settings it reads, as :func:`combine_kernel`)."""
    cfg: tl.constexpr = Settings(H, D, None, None, SCALE, None, BLOCK_D, BLOCK_M, BLOCK_N, PAD, None, MAX_SPLITS)
    st = Structure(PERM, GROUPS, DENSE, REAL, SEED, N)
    pid = tl.program_id(0)
    if pid < T:
        prog, rows = own_tile(pid, st, cfg, BLOCK_M)
        if rows.start < prog.dense:
            dq = sum_parts(DQ_PART, prog.bh, pid, T, S, BLOCK_M, BLOCK_D, MAX_SPLITS)
            store_rows(DQ, prog, rows, dq * SCALE, cfg)
    else:  # global key tile pid - T: its splits summed
        tile = pid - T
        prog, cols = own_tile(tile, st, cfg, BLOCK_N)
        dk = sum_parts(DK_PART, prog.bh, tile, J, S, BLOCK_N, BLOCK_D, MAX_SPLITS)
        dv = sum_parts(DV_PART, prog.bh, tile, J, S, BLOCK_N, BLOCK_D, MAX_SPLITS)
        store_rows(DK, prog, cols, dk * SCALE, cfg)
        store_rows(DV, prog, cols, dv, cfg)
