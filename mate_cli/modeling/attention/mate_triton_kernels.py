"""The Triton kernels of :mod:`.mate_triton` (forward and the merge of its splits; dQ, dK/dV and the sum of their
splits) and their device functions; imported only through :func:`.mate_triton.kernels`, which checks Triton's mode.

Every ``[B, H, N, D]`` tensor they read or write is a view of a ``[B, N, H, D]`` buffer (what the encoder's
projections give): element ``(b, h, n, d)`` at ``((b * N + n) * H + h) * D + d``, so no strides are passed. Heads,
globals, radius, scale and dropout rate are compile-time settings (fixed by the model's config); a launch takes
pointers and the sequence's sizes only, which keeps its host time short."""

import triton
import triton.language as tl


@triton.jit
def allowed(rows, cols, g_row, g_col, dense, G: tl.constexpr, R: tl.constexpr, PAD: tl.constexpr):
    """MATE's pattern within the globals and the 3-bucket window; dense rows reach every key."""
    mate = (g_col[None, :] < PAD) & ((g_row[:, None] == 0) | (g_col[None, :] == 0) | (g_row[:, None] == g_col[None, :]))
    near = tl.abs(rows[:, None] // R - cols[None, :] // R) <= 1
    return mate & ((rows[:, None] < dense) | (cols[None, :] < G) | near)


@triton.jit
def keep_scale(seed, bh, tok_row, tok_col, DROPOUT_P: tl.constexpr):
    """``1/(1-p)`` where the Philox draw for (bh, query token, key token) keeps the score, else 0."""
    zero = (tok_row[:, None] * 0 + tok_col[None, :] * 0).to(tl.uint32)
    if DROPOUT_P > 0:
        c0 = zero + tok_col[None, :].to(tl.uint32)
        c1 = zero + tok_row[:, None].to(tl.uint32)
        c2 = zero + bh.to(tl.uint32)
        r, _, _, _ = tl.philox(seed, c0, c1, c2, zero)
        u = tl.uint_to_uniform_float(r)
        return tl.where(u >= DROPOUT_P, 1.0 / (1.0 - DROPOUT_P), 0.0)
    else:
        return zero.to(tl.float32) + 1.0


@triton.jit
def load_rows(X, base, tok, ok, dcol, d_ok, H: tl.constexpr, D: tl.constexpr):
    return tl.load(X + base + tok[:, None] * (H * D) + dcol[None, :], mask=ok[:, None] & d_ok[None, :], other=0.0)


@triton.jit
def store_rows(X, base, tok, ok, dcol, d_ok, value, H: tl.constexpr, D: tl.constexpr):
    tl.store(X + base + tok[:, None] * (H * D) + dcol[None, :], value.to(X.dtype.element_ty),
             mask=ok[:, None] & d_ok[None, :])  # fmt: skip


@triton.jit
def own_tile(tile, PERM, GROUPS, DENSE, REAL, SEED, N, H: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
             BLOCK: tl.constexpr, PAD: tl.constexpr):  # fmt: skip
    """Tile ``tile`` of ``BLOCK`` sorted positions (query rows; key columns in the dK/dV pass) of this program's
    example x head: first position, bh, the offset of (b, h) in every ``[B, N, H, D]`` buffer, the example's dense
    and real counts, the seed, positions and their mask, head-dim columns and mask, and the positions' tokens and
    groups."""
    m0 = tile * BLOCK
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    base = b.to(tl.int64) * N * (H * D) + h * D
    dense, real, seed = tl.load(DENSE + b), tl.load(REAL + b), tl.load(SEED)
    rows = m0 + tl.arange(0, BLOCK)
    row_ok = rows < N
    dcol = tl.arange(0, BLOCK_D)
    d_ok = dcol < D
    tok_row = tl.load(PERM + bh * N + rows, mask=row_ok, other=0)
    g_row = tl.load(GROUPS + bh * N + rows, mask=row_ok, other=PAD)
    return m0, bh, base, dense, real, seed, rows, row_ok, dcol, d_ok, tok_row, g_row


@triton.jit
def key_tile(start, hi, q, rows, g_row, K, V, base, PERM, GROUPS, bh, N, dense, dcol, d_ok, H: tl.constexpr,
             D: tl.constexpr, G: tl.constexpr, R: tl.constexpr, SCALE: tl.constexpr, BLOCK_N: tl.constexpr,
             PAD: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """Key tile ``[start, start + BLOCK_N)`` of the interval ending at ``hi``: its tokens, k, v, the query tile's scaled
    scores and where MATE allows them."""
    cols = start + tl.arange(0, BLOCK_N)
    col_ok = cols < hi
    tok_col = tl.load(PERM + bh * N + cols, mask=col_ok, other=0)
    g_col = tl.load(GROUPS + bh * N + cols, mask=col_ok, other=PAD)
    k = load_rows(K, base, tok_col, col_ok, dcol, d_ok, H, D)
    v = load_rows(V, base, tok_col, col_ok, dcol, d_ok, H, D)
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * SCALE
    ok = allowed(rows, cols, g_row, g_col, dense, G, R, PAD) & col_ok[None, :]
    return tok_col, k, v, s, ok


@triton.jit
def forward_tiles(acc, l_i, m_i, lo, hi, q, rows, g_row, tok_row, K, V, base, PERM, GROUPS, bh, N, dense, seed,
                  dcol, d_ok, VISITS, H: tl.constexpr, D: tl.constexpr, G: tl.constexpr, R: tl.constexpr,
                  SCALE: tl.constexpr, DROPOUT_P: tl.constexpr, BLOCK_N: tl.constexpr, PAD: tl.constexpr,
                  PREC: tl.constexpr, COUNT: tl.constexpr):  # fmt: skip
    for start in range(lo, hi, BLOCK_N):
        if COUNT:  # the (query tile, key tile) pairs visited, for checking the work
            tl.atomic_add(VISITS, 1)
        tok_col, k, v, s, ok = key_tile(start, hi, q, rows, g_row, K, V, base, PERM, GROUPS, bh, N, dense, dcol, d_ok,
                                        H, D, G, R, SCALE, BLOCK_N, PAD, PREC)  # fmt: skip
        s = tl.where(ok, s, -1.0e30)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.where(ok, tl.exp(s - m_new[:, None]), 0.0)
        l_i = l_i * alpha + tl.sum(p, 1)
        p = p * keep_scale(seed, bh, tok_row, tok_col, DROPOUT_P)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
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
def query_tile_bounds(own, m0, split, N, real, CHUNK, G: tl.constexpr, R: tl.constexpr, BLOCK_M: tl.constexpr):
    """The key intervals ``[lo1, hi1)``, ``[lo2, hi2)`` a query program visits: a table-row tile's globals and its
    buckets' window, or one ``CHUNK`` of every real key (a dense tile's split)."""
    last = tl.minimum(m0 + BLOCK_M, N) - 1
    # window: buckets m0 // R - 1 .. last // R + 1, from G on (keys below G are the first interval)
    lo1 = tl.where(own, 0, split * CHUNK)
    hi1 = tl.where(own, tl.minimum(G, real), tl.minimum(split * CHUNK + CHUNK, real))
    lo2 = tl.where(own, tl.maximum(G, (m0 // R - 1) * R), 0)
    hi2 = tl.where(own, tl.minimum(real, (last // R + 2) * R), 0)
    return lo1, hi1, lo2, hi2


@triton.jit
def forward_kernel(
    Q, K, V, OUT, LSE, M_PART, L_PART, ACC_PART, PERM, GROUPS, DENSE, REAL, SEED, VISITS, N, T, S, CHUNK,
    H: tl.constexpr, D: tl.constexpr, G: tl.constexpr, R: tl.constexpr, SCALE: tl.constexpr,
    DROPOUT_P: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PAD: tl.constexpr, PREC: tl.constexpr, COUNT: tl.constexpr = False,
):  # fmt: skip
    """``T x S`` programs, one per ``CHUNK`` of the keys of a tile that may hold a dense row (a partial softmax,
    merged by :func:`combine_kernel`), then one per query tile of table rows."""
    own, tile, split = split_tile(tl.program_id(0), T, S)
    m0, bh, base, dense, real, seed, rows, row_ok, dcol, d_ok, tok_row, g_row = own_tile(
        tile, PERM, GROUPS, DENSE, REAL, SEED, N, H, D, BLOCK_D, BLOCK_M, PAD
    )
    if own != (m0 < dense):  # a dense tile is done by its splits only
        q = load_rows(Q, base, tok_row, row_ok, dcol, d_ok, H, D)
        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        lo1, hi1, lo2, hi2 = query_tile_bounds(own, m0, split, N, real, CHUNK, G, R, BLOCK_M)
        acc, l_i, m_i = forward_tiles(acc, l_i, m_i, lo1, hi1, q, rows, g_row, tok_row, K, V, base, PERM, GROUPS, bh,
                                      N, dense, seed, dcol, d_ok, VISITS, H, D, G, R, SCALE, DROPOUT_P, BLOCK_N,
                                      PAD, PREC, COUNT)  # fmt: skip
        acc, l_i, m_i = forward_tiles(acc, l_i, m_i, lo2, hi2, q, rows, g_row, tok_row, K, V, base, PERM, GROUPS, bh,
                                      N, dense, seed, dcol, d_ok, VISITS, H, D, G, R, SCALE, DROPOUT_P, BLOCK_N,
                                      PAD, PREC, COUNT)  # fmt: skip
        if own:
            store_rows(OUT, base, tok_row, row_ok, dcol, d_ok, acc / l_i[:, None], H, D)
            tl.store(LSE + bh * N + tok_row, m_i + tl.log(l_i), mask=row_ok)
        else:
            stat, block = part_offsets(bh, tile, split, T, S, BLOCK_M, BLOCK_D)
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
    first, so that the splits' loads do not wait on each other."""
    tile = tl.program_id(0)
    m0, bh, base, dense, _, _, _, row_ok, dcol, d_ok, tok_row, _ = own_tile(
        tile, PERM, GROUPS, DENSE, REAL, SEED, N, H, D, BLOCK_D, BLOCK_M, PAD
    )
    if m0 < dense:
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
        store_rows(OUT, base, tok_row, row_ok, dcol, d_ok, acc / l_i[:, None], H, D)
        tl.store(LSE + bh * N + tok_row, m_i + tl.log(l_i), mask=row_ok)


@triton.jit
def dq_tiles(dq, lo, hi, q, do, lse, delta, rows, g_row, tok_row, K, V, base, PERM, GROUPS, bh, N, dense, seed,
             dcol, d_ok, H: tl.constexpr, D: tl.constexpr, G: tl.constexpr, R: tl.constexpr, SCALE: tl.constexpr,
             DROPOUT_P: tl.constexpr, BLOCK_N: tl.constexpr, PAD: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    for start in range(lo, hi, BLOCK_N):
        tok_col, k, v, s, ok = key_tile(start, hi, q, rows, g_row, K, V, base, PERM, GROUPS, bh, N, dense, dcol, d_ok,
                                        H, D, G, R, SCALE, BLOCK_N, PAD, PREC)  # fmt: skip
        p = tl.where(ok, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)
        dp = dp * keep_scale(seed, bh, tok_row, tok_col, DROPOUT_P)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
    return dq


@triton.jit
def dq_kernel(
    Q, K, V, OUT, DO, LSE, DELTA, DQ, DQ_PART, PERM, GROUPS, DENSE, REAL, SEED, N, T, S, CHUNK,
    H: tl.constexpr, D: tl.constexpr, G: tl.constexpr, R: tl.constexpr, SCALE: tl.constexpr,
    DROPOUT_P: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PAD: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """dQ over the forward's key tiles; a dense tile's in ``S`` key chunks, summed by :func:`reduce_kernel`. Each
    program computes its rows' ``delta = rowsum(dO * O)`` and stores it (the first split of a dense tile) for
    :func:`dkdv_kernel`, launched after it."""
    own, tile, split = split_tile(tl.program_id(0), T, S)
    m0, bh, base, dense, real, seed, rows, row_ok, dcol, d_ok, tok_row, g_row = own_tile(
        tile, PERM, GROUPS, DENSE, REAL, SEED, N, H, D, BLOCK_D, BLOCK_M, PAD
    )
    if own != (m0 < dense):
        q = load_rows(Q, base, tok_row, row_ok, dcol, d_ok, H, D)
        do = load_rows(DO, base, tok_row, row_ok, dcol, d_ok, H, D)
        out = load_rows(OUT, base, tok_row, row_ok, dcol, d_ok, H, D)
        delta = tl.sum(do.to(tl.float32) * out.to(tl.float32), 1)
        if split == 0:
            tl.store(DELTA + bh * N + tok_row, delta, mask=row_ok)
        lse = tl.load(LSE + bh * N + tok_row, mask=row_ok, other=0.0)
        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        lo1, hi1, lo2, hi2 = query_tile_bounds(own, m0, split, N, real, CHUNK, G, R, BLOCK_M)
        dq = dq_tiles(dq, lo1, hi1, q, do, lse, delta, rows, g_row, tok_row, K, V, base, PERM, GROUPS, bh, N, dense,
                      seed, dcol, d_ok, H, D, G, R, SCALE, DROPOUT_P, BLOCK_N, PAD, PREC)  # fmt: skip
        dq = dq_tiles(dq, lo2, hi2, q, do, lse, delta, rows, g_row, tok_row, K, V, base, PERM, GROUPS, bh, N, dense,
                      seed, dcol, d_ok, H, D, G, R, SCALE, DROPOUT_P, BLOCK_N, PAD, PREC)  # fmt: skip
        if own:
            store_rows(DQ, base, tok_row, row_ok, dcol, d_ok, dq * SCALE, H, D)
        else:
            block = part_offsets(bh, tile, split, T, S, BLOCK_M, BLOCK_D)[1]
            tl.store(DQ_PART + block, dq)


@triton.jit
def dkdv_tiles(dk, dv, lo, hi, k, v, cols, col_ok, g_col, tok_col, Q, DO, LSE, DELTA, base, PERM, GROUPS, bh, N,
               dense, seed, dcol, d_ok, H: tl.constexpr, D: tl.constexpr, G: tl.constexpr, R: tl.constexpr,
               SCALE: tl.constexpr, DROPOUT_P: tl.constexpr, BLOCK_M: tl.constexpr, PAD: tl.constexpr,
               PREC: tl.constexpr):  # fmt: skip
    for start in range(lo, hi, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        row_ok = rows < N
        tok_row = tl.load(PERM + bh * N + rows, mask=row_ok, other=0)
        g_row = tl.load(GROUPS + bh * N + rows, mask=row_ok, other=PAD)
        q = load_rows(Q, base, tok_row, row_ok, dcol, d_ok, H, D)
        do = load_rows(DO, base, tok_row, row_ok, dcol, d_ok, H, D)
        lse = tl.load(LSE + bh * N + tok_row, mask=row_ok, other=0.0)
        delta = tl.load(DELTA + bh * N + tok_row, mask=row_ok, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * SCALE
        ok = allowed(rows, cols, g_row, g_col, dense, G, R, PAD) & row_ok[:, None] & col_ok[None, :]
        p = tl.where(ok, tl.exp(s - lse[:, None]), 0.0)
        keep = keep_scale(seed, bh, tok_row, tok_col, DROPOUT_P)
        dv += tl.dot(tl.trans((p * keep).to(do.dtype)), do, input_precision=PREC)
        dp = tl.dot(do, tl.trans(v), input_precision=PREC) * keep
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PREC)
    return dk, dv


@triton.jit
def dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, DK_PART, DV_PART, PERM, GROUPS, DENSE, REAL, SEED, N, J, S, CHUNK,
    H: tl.constexpr, D: tl.constexpr, G: tl.constexpr, R: tl.constexpr, SCALE: tl.constexpr,
    DROPOUT_P: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PAD: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """dK, dV of a key tile over the query tiles that attend it; a global key tile (one of the first ``J``) is
    attended by every row, so it is done in ``S`` chunks of rows, summed by :func:`reduce_kernel`."""
    own, tile, split = split_tile(tl.program_id(0), J, S)
    n0, bh, base, dense, _, seed, cols, col_ok, dcol, d_ok, tok_col, g_col = own_tile(
        tile, PERM, GROUPS, DENSE, REAL, SEED, N, H, D, BLOCK_D, BLOCK_N, PAD
    )
    if own != (n0 < G):
        k = load_rows(K, base, tok_col, col_ok, dcol, d_ok, H, D)
        v = load_rows(V, base, tok_col, col_ok, dcol, d_ok, H, D)
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        # a table key: the dense rows (whole tiles from 0), then the rows whose window reaches it, starting after
        # the last dense tile so no tile is visited twice; a global key: one chunk of every row
        last = tl.minimum(n0 + BLOCK_N, N) - 1
        lo1 = tl.where(own, 0, split * CHUNK)
        hi1 = tl.where(own, dense, tl.minimum(split * CHUNK + CHUNK, N))
        lo2 = tl.where(own, tl.maximum(tl.cdiv(dense, BLOCK_M) * BLOCK_M, (n0 // R - 1) * R), 0)
        hi2 = tl.where(own, tl.minimum(N, (last // R + 2) * R), 0)
        dk, dv = dkdv_tiles(dk, dv, lo1, hi1, k, v, cols, col_ok, g_col, tok_col, Q, DO, LSE, DELTA, base, PERM,
                            GROUPS, bh, N, dense, seed, dcol, d_ok, H, D, G, R, SCALE, DROPOUT_P, BLOCK_M, PAD,
                            PREC)  # fmt: skip
        dk, dv = dkdv_tiles(dk, dv, lo2, hi2, k, v, cols, col_ok, g_col, tok_col, Q, DO, LSE, DELTA, base, PERM,
                            GROUPS, bh, N, dense, seed, dcol, d_ok, H, D, G, R, SCALE, DROPOUT_P, BLOCK_M, PAD,
                            PREC)  # fmt: skip
        if own:
            store_rows(DK, base, tok_col, col_ok, dcol, d_ok, dk * SCALE, H, D)
            store_rows(DV, base, tok_col, col_ok, dcol, d_ok, dv, H, D)
        else:
            block = part_offsets(bh, tile, split, J, S, BLOCK_N, BLOCK_D)[1]
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
    """The split tiles' gradients, summed: dQ of the ``T`` dense tiles, then dK, dV of the ``J`` global tiles."""
    pid = tl.program_id(0)
    if pid < T:
        m0, bh, base, dense, _, _, _, row_ok, dcol, d_ok, tok_row, _ = own_tile(
            pid, PERM, GROUPS, DENSE, REAL, SEED, N, H, D, BLOCK_D, BLOCK_M, PAD
        )
        if m0 < dense:
            dq = sum_parts(DQ_PART, bh, pid, T, S, BLOCK_M, BLOCK_D, MAX_SPLITS)
            store_rows(DQ, base, tok_row, row_ok, dcol, d_ok, dq * SCALE, H, D)
    else:  # global key tile pid - T: its splits summed
        tile = pid - T
        n0, bh, base, dense, real, seed, cols, col_ok, dcol, d_ok, tok_col, g_col = own_tile(
            tile, PERM, GROUPS, DENSE, REAL, SEED, N, H, D, BLOCK_D, BLOCK_N, PAD
        )
        dk = sum_parts(DK_PART, bh, tile, J, S, BLOCK_N, BLOCK_D, MAX_SPLITS)
        dv = sum_parts(DV_PART, bh, tile, J, S, BLOCK_N, BLOCK_D, MAX_SPLITS)
        store_rows(DK, base, tok_col, col_ok, dcol, d_ok, dk * SCALE, H, D)
        store_rows(DV, base, tok_col, col_ok, dcol, d_ok, dv, H, D)
