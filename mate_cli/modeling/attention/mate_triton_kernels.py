"""The Triton kernels of :mod:`.mate_triton` (forward and the merge of its splits; dQ, dK/dV and the sum of their
splits) and their device functions; imported only through :func:`.mate_triton.kernels`, which checks Triton's mode."""

import triton
import triton.language as tl


@triton.jit
def allowed(rows, cols, g_row, g_col, dense, G, R, PAD: tl.constexpr):
    """MATE's pattern within the globals and the 3-bucket window; dense rows reach every key."""
    mate = (g_col[None, :] < PAD) & ((g_row[:, None] == 0) | (g_col[None, :] == 0) | (g_row[:, None] == g_col[None, :]))
    near = tl.abs(rows[:, None] // R - cols[None, :] // R) <= 1
    return mate & ((rows[:, None] < dense) | (cols[None, :] < G) | near)


@triton.jit
def keep_scale(seed, bh, tok_row, tok_col, dropout_p, DROPOUT: tl.constexpr):
    """``1/(1-p)`` where the Philox draw for (bh, query token, key token) keeps the score, else 0."""
    zero = (tok_row[:, None] * 0 + tok_col[None, :] * 0).to(tl.uint32)
    if DROPOUT:
        c0 = zero + tok_col[None, :].to(tl.uint32)
        c1 = zero + tok_row[:, None].to(tl.uint32)
        c2 = zero + bh.to(tl.uint32)
        r, _, _, _ = tl.philox(seed, c0, c1, c2, zero)
        u = tl.uint_to_uniform_float(r)
        return tl.where(u >= dropout_p, 1.0 / (1.0 - dropout_p), 0.0)
    else:
        return zero.to(tl.float32) + 1.0


@triton.jit
def load_rows(X, base, tok, ok, stride, dcol, d_ok):
    return tl.load(X + base + tok[:, None] * stride + dcol[None, :], mask=ok[:, None] & d_ok[None, :], other=0.0)


@triton.jit
def store_rows(X, base, tok, ok, stride, dcol, d_ok, value):
    tl.store(X + base + tok[:, None] * stride + dcol[None, :], value.to(X.dtype.element_ty),
             mask=ok[:, None] & d_ok[None, :])  # fmt: skip


@triton.jit
def own_tile(tile, PERM, GROUPS, DENSE, REAL, SEED, H, N, D: tl.constexpr, BLOCK_D: tl.constexpr,
             BLOCK: tl.constexpr, PAD: tl.constexpr):  # fmt: skip
    """Tile ``tile`` of ``BLOCK`` sorted positions (query rows; key columns in the dK/dV pass) of this program's
    example x head: first position, (bh, b, h), the example's dense and real counts, the seed, positions and their
    mask, head-dim columns and mask, and the positions' tokens and groups."""
    m0 = tile * BLOCK
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    dense, real, seed = tl.load(DENSE + b), tl.load(REAL + b), tl.load(SEED)
    rows = m0 + tl.arange(0, BLOCK)
    row_ok = rows < N
    dcol = tl.arange(0, BLOCK_D)
    d_ok = dcol < D
    tok_row = tl.load(PERM + bh * N + rows, mask=row_ok, other=0)
    g_row = tl.load(GROUPS + bh * N + rows, mask=row_ok, other=PAD)
    return m0, bh, b, h, dense, real, seed, rows, row_ok, dcol, d_ok, tok_row, g_row


@triton.jit
def key_tile(start, hi, q, rows, g_row, K, V, kbase, vbase, skn, svn, PERM, GROUPS, bh, N, dense, G, R, scale,
             dcol, d_ok, BLOCK_N: tl.constexpr, PAD: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """Key tile ``[start, start + BLOCK_N)`` of the interval ending at ``hi``: its tokens, k, v, the query tile's scaled
    scores and where MATE allows them."""
    cols = start + tl.arange(0, BLOCK_N)
    col_ok = cols < hi
    tok_col = tl.load(PERM + bh * N + cols, mask=col_ok, other=0)
    g_col = tl.load(GROUPS + bh * N + cols, mask=col_ok, other=PAD)
    k = load_rows(K, kbase, tok_col, col_ok, skn, dcol, d_ok)
    v = load_rows(V, vbase, tok_col, col_ok, svn, dcol, d_ok)
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
    ok = allowed(rows, cols, g_row, g_col, dense, G, R, PAD) & col_ok[None, :]
    return tok_col, k, v, s, ok


@triton.jit
def forward_tiles(acc, l_i, m_i, lo, hi, q, rows, g_row, tok_row, K, V, kbase, vbase, skn, svn,
                  PERM, GROUPS, bh, N, dense, G, R, scale, dropout_p, seed, dcol, d_ok, VISITS,
                  BLOCK_N: tl.constexpr, PAD: tl.constexpr, DROPOUT: tl.constexpr, PREC: tl.constexpr,
                  COUNT: tl.constexpr):  # fmt: skip
    for start in range(lo, hi, BLOCK_N):
        if COUNT:  # the (query tile, key tile) pairs visited, for checking the work
            tl.atomic_add(VISITS, 1)
        tok_col, k, v, s, ok = key_tile(start, hi, q, rows, g_row, K, V, kbase, vbase, skn, svn, PERM, GROUPS, bh, N,
                                        dense, G, R, scale, dcol, d_ok, BLOCK_N, PAD, PREC)  # fmt: skip
        s = tl.where(ok, s, -1.0e30)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.where(ok, tl.exp(s - m_new[:, None]), 0.0)
        l_i = l_i * alpha + tl.sum(p, 1)
        p = p * keep_scale(seed, bh, tok_row, tok_col, dropout_p, DROPOUT)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def split_tile(pid, TILES, S):
    """Program ``pid`` of a pass's grid: ``(True, tile, 0)`` for the ``TILES`` tiles of sorted positions, then
    ``(False, tile, split)`` for a long tile's ``S`` splits of its other axis."""
    own = pid < TILES
    rest = tl.maximum(pid - TILES, 0)
    return own, tl.where(own, pid, rest // S), rest % S


@triton.jit
def part_offsets(bh, tile, split, T, S, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
    """Offsets of split ``split`` of long tile ``tile`` of ``bh`` in a float32 partials buffer: its ``[BLOCK]`` row
    statistics and its ``[BLOCK, BLOCK_D]`` block."""
    part = (bh * T + tile) * S + split
    r = tl.arange(0, BLOCK)
    return part * BLOCK + r, (part * BLOCK + r)[:, None] * BLOCK_D + tl.arange(0, BLOCK_D)[None, :]


@triton.jit
def query_tile_bounds(own, m0, split, N, real, G, R, CHUNK, BLOCK_M: tl.constexpr):
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
    Q, K, V, OUT, LSE, M_PART, L_PART, ACC_PART, PERM, GROUPS, DENSE, REAL, SEED, VISITS,
    sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son,
    H, N, G, R, scale, dropout_p, TILES, T, S, CHUNK,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PAD: tl.constexpr, DROPOUT: tl.constexpr, PREC: tl.constexpr, COUNT: tl.constexpr = False,
):  # fmt: skip
    """``TILES`` programs, one per query tile of table rows, then ``T x S``, one per ``CHUNK`` of the keys of a tile
    holding a dense row (a partial softmax, merged by :func:`combine_kernel`)."""
    own, tile, split = split_tile(tl.program_id(0), TILES, S)
    m0, bh, b, h, dense, real, seed, rows, row_ok, dcol, d_ok, tok_row, g_row = own_tile(
        tile, PERM, GROUPS, DENSE, REAL, SEED, H, N, D, BLOCK_D, BLOCK_M, PAD
    )
    if own != (m0 < dense):  # a dense tile is done by its splits only
        q = load_rows(Q, b * sqb + h * sqh, tok_row, row_ok, sqn, dcol, d_ok)
        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        kbase, vbase = b * skb + h * skh, b * svb + h * svh
        lo1, hi1, lo2, hi2 = query_tile_bounds(own, m0, split, N, real, G, R, CHUNK, BLOCK_M)
        acc, l_i, m_i = forward_tiles(acc, l_i, m_i, lo1, hi1, q, rows, g_row, tok_row, K, V, kbase, vbase, skn, svn,
                                      PERM, GROUPS, bh, N, dense, G, R, scale, dropout_p, seed, dcol, d_ok, VISITS,
                                      BLOCK_N, PAD, DROPOUT, PREC, COUNT)  # fmt: skip
        acc, l_i, m_i = forward_tiles(acc, l_i, m_i, lo2, hi2, q, rows, g_row, tok_row, K, V, kbase, vbase, skn, svn,
                                      PERM, GROUPS, bh, N, dense, G, R, scale, dropout_p, seed, dcol, d_ok, VISITS,
                                      BLOCK_N, PAD, DROPOUT, PREC, COUNT)  # fmt: skip
        if own:
            store_rows(OUT, b * sob + h * soh, tok_row, row_ok, son, dcol, d_ok, acc / l_i[:, None])
            tl.store(LSE + bh * N + tok_row, m_i + tl.log(l_i), mask=row_ok)
        else:
            stat, block = part_offsets(bh, tile, split, T, S, BLOCK_M, BLOCK_D)
            tl.store(M_PART + stat, m_i)
            tl.store(L_PART + stat, l_i)
            tl.store(ACC_PART + block, acc)


@triton.jit
def combine_kernel(
    OUT, LSE, M_PART, L_PART, ACC_PART, PERM, GROUPS, DENSE, REAL, SEED, sob, soh, son, H, N, T, S,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, PAD: tl.constexpr,
):  # fmt: skip
    """A dense tile's output and log-sum-exp from its splits' partial softmaxes."""
    tile = tl.program_id(0)
    m0, bh, b, h, dense, _, _, _, row_ok, dcol, d_ok, tok_row, _ = own_tile(
        tile, PERM, GROUPS, DENSE, REAL, SEED, H, N, D, BLOCK_D, BLOCK_M, PAD
    )
    if m0 < dense:
        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for split in range(0, S):
            stat, block = part_offsets(bh, tile, split, T, S, BLOCK_M, BLOCK_D)
            m_s = tl.load(M_PART + stat)
            m_new = tl.maximum(m_i, m_s)
            alpha, beta = tl.exp(m_i - m_new), tl.exp(m_s - m_new)
            l_i = l_i * alpha + tl.load(L_PART + stat) * beta
            acc = acc * alpha[:, None] + tl.load(ACC_PART + block) * beta[:, None]
            m_i = m_new
        store_rows(OUT, b * sob + h * soh, tok_row, row_ok, son, dcol, d_ok, acc / l_i[:, None])
        tl.store(LSE + bh * N + tok_row, m_i + tl.log(l_i), mask=row_ok)


@triton.jit
def dq_tiles(dq, lo, hi, q, do, lse, delta, rows, g_row, tok_row, K, V, kbase, vbase, skn, svn,
             PERM, GROUPS, bh, N, dense, G, R, scale, dropout_p, seed, dcol, d_ok,
             BLOCK_N: tl.constexpr, PAD: tl.constexpr, DROPOUT: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    for start in range(lo, hi, BLOCK_N):
        tok_col, k, v, s, ok = key_tile(start, hi, q, rows, g_row, K, V, kbase, vbase, skn, svn, PERM, GROUPS, bh, N,
                                        dense, G, R, scale, dcol, d_ok, BLOCK_N, PAD, PREC)  # fmt: skip
        p = tl.where(ok, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)
        dp = dp * keep_scale(seed, bh, tok_row, tok_col, dropout_p, DROPOUT)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
    return dq


@triton.jit
def dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, DQ_PART, PERM, GROUPS, DENSE, REAL, SEED,
    sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdob, sdoh, sdon, sdqb, sdqh, sdqn,
    H, N, G, R, scale, dropout_p, TILES, T, S, CHUNK,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PAD: tl.constexpr, DROPOUT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """dQ over the forward's key tiles; a dense tile's in ``S`` key chunks, summed by :func:`reduce_kernel`."""
    own, tile, split = split_tile(tl.program_id(0), TILES, S)
    m0, bh, b, h, dense, real, seed, rows, row_ok, dcol, d_ok, tok_row, g_row = own_tile(
        tile, PERM, GROUPS, DENSE, REAL, SEED, H, N, D, BLOCK_D, BLOCK_M, PAD
    )
    if own != (m0 < dense):
        q = load_rows(Q, b * sqb + h * sqh, tok_row, row_ok, sqn, dcol, d_ok)
        do = load_rows(DO, b * sdob + h * sdoh, tok_row, row_ok, sdon, dcol, d_ok)
        lse = tl.load(LSE + bh * N + tok_row, mask=row_ok, other=0.0)
        delta = tl.load(DELTA + bh * N + tok_row, mask=row_ok, other=0.0)
        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        kbase, vbase = b * skb + h * skh, b * svb + h * svh
        lo1, hi1, lo2, hi2 = query_tile_bounds(own, m0, split, N, real, G, R, CHUNK, BLOCK_M)
        dq = dq_tiles(dq, lo1, hi1, q, do, lse, delta, rows, g_row, tok_row, K, V, kbase, vbase, skn, svn, PERM,
                      GROUPS, bh, N, dense, G, R, scale, dropout_p, seed, dcol, d_ok, BLOCK_N, PAD, DROPOUT, PREC)  # fmt: skip
        dq = dq_tiles(dq, lo2, hi2, q, do, lse, delta, rows, g_row, tok_row, K, V, kbase, vbase, skn, svn, PERM,
                      GROUPS, bh, N, dense, G, R, scale, dropout_p, seed, dcol, d_ok, BLOCK_N, PAD, DROPOUT, PREC)  # fmt: skip
        if own:
            store_rows(DQ, b * sdqb + h * sdqh, tok_row, row_ok, sdqn, dcol, d_ok, dq * scale)
        else:
            block = part_offsets(bh, tile, split, T, S, BLOCK_M, BLOCK_D)[1]
            tl.store(DQ_PART + block, dq)


@triton.jit
def dkdv_tiles(dk, dv, lo, hi, k, v, cols, col_ok, g_col, tok_col, Q, DO, LSE, DELTA, qbase, dobase, sqn, sdon,
               PERM, GROUPS, bh, N, dense, G, R, scale, dropout_p, seed, dcol, d_ok,
               BLOCK_M: tl.constexpr, PAD: tl.constexpr, DROPOUT: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    for start in range(lo, hi, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        row_ok = rows < N
        tok_row = tl.load(PERM + bh * N + rows, mask=row_ok, other=0)
        g_row = tl.load(GROUPS + bh * N + rows, mask=row_ok, other=PAD)
        q = load_rows(Q, qbase, tok_row, row_ok, sqn, dcol, d_ok)
        do = load_rows(DO, dobase, tok_row, row_ok, sdon, dcol, d_ok)
        lse = tl.load(LSE + bh * N + tok_row, mask=row_ok, other=0.0)
        delta = tl.load(DELTA + bh * N + tok_row, mask=row_ok, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
        ok = allowed(rows, cols, g_row, g_col, dense, G, R, PAD) & row_ok[:, None] & col_ok[None, :]
        p = tl.where(ok, tl.exp(s - lse[:, None]), 0.0)
        keep = keep_scale(seed, bh, tok_row, tok_col, dropout_p, DROPOUT)
        dv += tl.dot(tl.trans((p * keep).to(do.dtype)), do, input_precision=PREC)
        dp = tl.dot(do, tl.trans(v), input_precision=PREC) * keep
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PREC)
    return dk, dv


@triton.jit
def dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, DK_PART, DV_PART, PERM, GROUPS, DENSE, REAL, SEED,
    sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdob, sdoh, sdon, sdkb, sdkh, sdkn, sdvb, sdvh, sdvn,
    H, N, G, R, scale, dropout_p, TILES, J, S, CHUNK,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PAD: tl.constexpr, DROPOUT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """dK, dV of a key tile over the query tiles that attend it; a global key tile (one of the first ``J``) is
    attended by every row, so it is done in ``S`` chunks of rows, summed by :func:`reduce_kernel`."""
    own, tile, split = split_tile(tl.program_id(0), TILES, S)
    n0, bh, b, h, dense, _, seed, cols, col_ok, dcol, d_ok, tok_col, g_col = own_tile(
        tile, PERM, GROUPS, DENSE, REAL, SEED, H, N, D, BLOCK_D, BLOCK_N, PAD
    )
    if own != (n0 < G):
        k = load_rows(K, b * skb + h * skh, tok_col, col_ok, skn, dcol, d_ok)
        v = load_rows(V, b * svb + h * svh, tok_col, col_ok, svn, dcol, d_ok)
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        # a table key: the dense rows (whole tiles from 0), then the rows whose window reaches it, starting after
        # the last dense tile so no tile is visited twice; a global key: one chunk of every row
        last = tl.minimum(n0 + BLOCK_N, N) - 1
        lo1 = tl.where(own, 0, split * CHUNK)
        hi1 = tl.where(own, dense, tl.minimum(split * CHUNK + CHUNK, N))
        lo2 = tl.where(own, tl.maximum(tl.cdiv(dense, BLOCK_M) * BLOCK_M, (n0 // R - 1) * R), 0)
        hi2 = tl.where(own, tl.minimum(N, (last // R + 2) * R), 0)
        qbase, dobase = b * sqb + h * sqh, b * sdob + h * sdoh
        dk, dv = dkdv_tiles(dk, dv, lo1, hi1, k, v, cols, col_ok, g_col, tok_col, Q, DO, LSE, DELTA, qbase, dobase,
                            sqn, sdon, PERM, GROUPS, bh, N, dense, G, R, scale, dropout_p, seed, dcol, d_ok, BLOCK_M,
                            PAD, DROPOUT, PREC)  # fmt: skip
        dk, dv = dkdv_tiles(dk, dv, lo2, hi2, k, v, cols, col_ok, g_col, tok_col, Q, DO, LSE, DELTA, qbase, dobase,
                            sqn, sdon, PERM, GROUPS, bh, N, dense, G, R, scale, dropout_p, seed, dcol, d_ok, BLOCK_M,
                            PAD, DROPOUT, PREC)  # fmt: skip
        if own:
            store_rows(DK, b * sdkb + h * sdkh, tok_col, col_ok, sdkn, dcol, d_ok, dk * scale)
            store_rows(DV, b * sdvb + h * sdvh, tok_col, col_ok, sdvn, dcol, d_ok, dv)
        else:
            block = part_offsets(bh, tile, split, J, S, BLOCK_N, BLOCK_D)[1]
            tl.store(DK_PART + block, dk)
            tl.store(DV_PART + block, dv)


@triton.jit
def sum_parts(PART, bh, tile, T, S, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
    """The ``S`` splits' partial ``[BLOCK, BLOCK_D]`` blocks of a long tile, summed in split order."""
    total = tl.zeros([BLOCK, BLOCK_D], tl.float32)
    for split in range(0, S):
        total += tl.load(PART + part_offsets(bh, tile, split, T, S, BLOCK, BLOCK_D)[1])
    return total


@triton.jit
def reduce_kernel(
    DQ, DK, DV, DQ_PART, DK_PART, DV_PART, PERM, GROUPS, DENSE, REAL, SEED,
    sdqb, sdqh, sdqn, sdkb, sdkh, sdkn, sdvb, sdvh, sdvn, H, N, scale, T, J, S,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAD: tl.constexpr,
):  # fmt: skip
    """The split tiles' gradients, summed: dQ of the ``T`` dense tiles, then dK, dV of the ``J`` global tiles."""
    pid = tl.program_id(0)
    if pid < T:
        m0, bh, b, h, dense, _, _, _, row_ok, dcol, d_ok, tok_row, _ = own_tile(
            pid, PERM, GROUPS, DENSE, REAL, SEED, H, N, D, BLOCK_D, BLOCK_M, PAD
        )
        if m0 < dense:
            dq = sum_parts(DQ_PART, bh, pid, T, S, BLOCK_M, BLOCK_D)
            store_rows(DQ, b * sdqb + h * sdqh, tok_row, row_ok, sdqn, dcol, d_ok, dq * scale)
    else:  # global key tile pid - T: its splits summed
        tile = pid - T
        n0, bh, b, h, dense, real, seed, cols, col_ok, dcol, d_ok, tok_col, g_col = own_tile(
            tile, PERM, GROUPS, DENSE, REAL, SEED, H, N, D, BLOCK_D, BLOCK_N, PAD
        )
        dk = sum_parts(DK_PART, bh, tile, J, S, BLOCK_N, BLOCK_D)
        dv = sum_parts(DV_PART, bh, tile, J, S, BLOCK_N, BLOCK_D)
        store_rows(DK, b * sdkb + h * sdkh, tok_col, col_ok, sdkn, dcol, d_ok, dk * scale)
        store_rows(DV, b * sdvb + h * sdvh, tok_col, col_ok, sdvn, dcol, d_ok, dv)
