// MATE bucketed attention on CPU: fused kernels for the forward of the long (bucketed)
// rows and of the dense query rows, and one for the backward of both.
//
// The torch path (mate_bucketed.py) sorts k and v into a bucket-aligned buffer, then
// computes the long rows chunk by chunk with torch ops: scores to [globals ; window],
// mask bias, softmax, two context GEMMs (each a full pass over a multi-MB chunk), and
// unsorts the result. Here nothing is sorted in memory: each thread walks its chunks of
// kChunk buckets in order, gathering the rows it needs straight from q, k, v through
// the per-head sort order (a sliding window of k/v buckets: every row is read once),
// and does a chunk start to finish while its scores sit in L1/L2: one GEMM against the
// global keys for all the chunk's rows and one per bucket against its 3R-key window
// (BLAS sgemm, ldc = g + 3R, so window scores land next to the global ones), mask +
// exp + row sums in one loop, the context GEMMs likewise, then each output row is
// scaled and written to its token's row. Chunks are independent: at::parallel_for.
// Dense rows (query-set tokens among the globals attend every real key): per head,
// key blocks with an online softmax (flash-attention style), heads in parallel.
//
// Common inputs (contiguous, float32 on CPU; built and cached by BucketPlan):
//   q, k, v   [rows, D]           unsorted, flat (one row layout for all three)
//   src       [BH, T] int64       sorted slot -> row of q/k/v (slots >= N: any valid row)
//   dst       [BH, T] int64       sorted slot -> row of out (-1: slot >= N, not written)
//   free      [B] int32           query-set tokens among the globals (dense rows; never masked as keys)
//   out       [rows, D]           the result, in the output row layout (written, never read)
// Long rows only:
//   allowed   [B, V, T, G + 3R] bool  MATE's pattern per sorted row: [globals ; window]
//   keys      [BH * nb] int32     global keys bucket f reads (keys beyond: masked for all its rows)
//   head_view [H] int32           view (row/column) of each head
// Dense rows only:
//   real      [B] int32           real tokens (the sorted prefix the dense rows attend)
//   token_rows [BH, 3] int64      (row of token 0, row stride, 1 if the real tokens are the
//                                 example's first real[b] tokens) of each head's k rows
// Attention dropout (every kernel): dropout p in [0, 1) and seed; see struct Dropout.
// Softmax of a fully masked row is uniform over its keys (padding rows only).

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <vector>

extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);

namespace {

constexpr float kMasked = -1e30f;

// Row-major C[m, n] = A[m, k] . B[n, k]^T (+ beta C). Column-major BLAS sees C^T = B . A^T.
inline void gemm_nt(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float beta, float* c,
                    int ldc) {
  const float one = 1.0f;
  sgemm_("T", "N", &n, &m, &k, &one, b, &ldb, a, &lda, &beta, c, &ldc);
}

// Row-major C[m, n] = A[m, k] . B[k, n] (+ beta C).
inline void gemm_nn(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float beta, float* c,
                    int ldc) {
  const float one = 1.0f;
  sgemm_("N", "N", &n, &m, &k, &one, b, &ldb, a, &lda, &beta, c, &ldc);
}

// exp(x) for x <= 0, |relative error| < 2e-7; 0 below -87 (masked keys). Plain
// arithmetic so the row loop vectorises (no libm call).
inline float exp_nonpositive(float x) {
  const float t = std::max(x, -87.0f) * 1.44269504088896341f;  // x / ln 2
  const float n = std::nearbyint(t);
  const float f = (t - n) * 0.693147180559945309f;  // |f| <= ln2 / 2
  float p = 1.0f / 5040.0f;
  p = p * f + 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return x < -87.0f ? 0.0f : p * scale;
}

struct Rows {
  const float* base;
  const int64_t* index;  // sorted slot -> row of base
  const int64_t* valid;  // sorted slot -> output row, -1 for slots >= N (read as zeros)
  int64_t D;
  int64_t T;
  // rows [s0, s1) of head bh's sorted order into dst (slots outside [0, N): zeros, as
  // in the torch path's sorted buffers)
  void gather(int64_t bh, int64_t s0, int64_t s1, float* dst) const {
    for (int64_t s = s0; s < s1; ++s, dst += D) {
      if (s < 0 || s >= T || valid[bh * T + s] < 0) {
        std::memset(dst, 0, sizeof(float) * D);
      } else {
        std::memcpy(dst, base + index[bh * T + s] * D, sizeof(float) * D);
      }
    }
  }
};

// Contract checks (the Python side builds every input): all contiguous, the
// first `floats` of them float32.
void check(const char* what, std::initializer_list<const at::Tensor*> ts, size_t floats) {
  size_t i = 0;
  for (const at::Tensor* t : ts) {
    TORCH_CHECK(t->is_contiguous(), what, ": inputs must be contiguous");
    TORCH_CHECK(i++ >= floats || t->scalar_type() == at::kFloat, what, ": float32 only");
  }
}

// Softmax numerators exp(x - mx) of one row in place (mask applied earlier); returns their sum.
inline float exp_row(float* row, int width, float mx) {
  float sum = 0.0f;
  for (int j = 0; j < width; ++j) {
    const float e = exp_nonpositive(row[j] - mx);
    row[j] = e;
    sum += e;
  }
  return sum;
}

// Attention dropout. Whether probability (row, key) of head bh survives is a stateless
// hash of (seed, bh, row, key) (splitmix64's finaliser), so the backward redraws the
// forward's mask exactly, whatever the thread split. Key ids: global column j -> j,
// window column j -> kWindowKey + j (the columns of a long row, as both passes lay them
// out), and for the dense rows kDenseKey + the key's token position (its identity,
// whichever order the keys are read in, and whatever the memory layout of k).
constexpr uint64_t kWindowKey = 1ull << 20;
constexpr uint64_t kDenseKey = 1ull << 40;

struct Dropout {
  float p = 0.0f;
  uint64_t seed = 0;
  uint32_t threshold = 0;  // keep when the hash's top 24 bits >= p 2^24
  float scale = 1.0f;      // 1 / (1 - p) for kept probabilities
  Dropout(double p_, int64_t seed_) : p(static_cast<float>(p_)), seed(static_cast<uint64_t>(seed_)) {
    TORCH_CHECK(p_ >= 0.0 && p_ < 1.0, "mate kernels: attention dropout must be in [0, 1), got ", p_);
    threshold = static_cast<uint32_t>(p_ * 16777216.0);
    // 1 / P(keep) for the drawn threshold exactly, so E[factor] = 1
    scale = p_ > 0 ? static_cast<float>(16777216.0 / (16777216.0 - threshold)) : 1.0f;
  }
  bool on() const { return p > 0.0f; }
  // the factor of probability (row, key): 0 (dropped) or 1 / (1 - p)
  float factor(uint64_t bh, uint64_t row, uint64_t key) const {
    uint64_t z = seed + bh * 0x9E3779B97F4A7C15ull + row * 0xD1B54A32D192ED03ull + key * 0x8CB92BA72F3D8DD7ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<uint32_t>(z >> 40) >= threshold ? scale : 0.0f;
  }
  // x[j] *= factor(bh, row, key0 + j) for j < n
  void apply(float* x, int n, uint64_t bh, uint64_t row, uint64_t key0) const {
    for (int j = 0; j < n; ++j) x[j] *= factor(bh, row, key0 + j);
  }
  // one long row laid out [g globals ; 3R window]
  void apply_long(float* x, int g, int w3, uint64_t bh, uint64_t row) const {
    apply(x, g, bh, row, 0);
    apply(x + g, w3, bh, row, kWindowKey);
  }
};

constexpr int64_t kWindowCap = 32;  // buckets of k/v rows a thread keeps (>= kChunk + 2)
// Buckets done together: their rows share one GEMM against the global keys (and one for
// the global context), c R rows instead of R, while each bucket's window keeps its own
// R x 3R GEMMs. Chunks are aligned (bucket n is in chunk n / kChunk) in the forward and
// the backward alike, so both see the same key set per row.
constexpr int64_t kChunk = 8;
static_assert(kWindowCap >= kChunk + 2, "a chunk's windows must fit the sliding buffer");

// Softmax numerators of a chunk of c buckets (c R rows, sorted slots from n0 R) over
// [g globals ; 3R window] into S (row stride g + 3R): scores of the pre-scaled queries
// qs against kg and each bucket's window (bucket j's starts at k_window + j R D), MATE's
// mask (a: the first row's allowed flags, AW per row, window flags from G), then
// exp(x - row max); inv[i] = 1 / row sum. g is the most global keys any bucket of the
// chunk reads; keys beyond a bucket's own count are masked for its rows (exp = 0, so
// nothing changes). The first fr_b global keys (the query set) are allowed for every
// row. Shared by the forward and the backward (which recomputes).
inline void chunk_numerators(int64_t R, int64_t c, int g, int w3, int d, int64_t G, int64_t AW, int fr_b,
                             const float* qs, const float* kg, const float* k_window, const bool* a, float* S,
                             float* inv) {
  const int width = g + w3, r = static_cast<int>(R);
  gemm_nt(static_cast<int>(c * R), g, d, qs, d, kg, d, 0.0f, S, width);
  for (int64_t j = 0; j < c; ++j) {
    gemm_nt(r, w3, d, qs + j * R * d, d, k_window + j * R * d, d, 0.0f, S + j * R * width + g, width);
  }
  for (int64_t i = 0; i < c * R; ++i, a += AW) {
    float* row = S + i * width;
    // mask + row max; the mask as arithmetic (x + (1 - allowed) * kMasked, which is
    // kMasked for a masked key) so the loops vectorise instead of branching
    float mx = kMasked;
    for (int j = 0; j < fr_b; ++j) mx = std::max(mx, row[j]);
    for (int j = fr_b; j < g; ++j) {
      const float x = row[j] + static_cast<float>(1 - static_cast<int>(a[j])) * kMasked;
      row[j] = x;
      mx = std::max(mx, x);
    }
    float* win = row + g;
    const bool* aw = a + G;
    for (int j = 0; j < w3; ++j) {
      const float x = win[j] + static_cast<float>(1 - static_cast<int>(aw[j])) * kMasked;
      win[j] = x;
      mx = std::max(mx, x);
    }
    inv[i] = 1.0f / exp_row(row, width, mx);
  }
}

// Global keys a chunk reads: the most over its buckets [n0, n1) of head bh.
inline int chunk_keys(const int32_t* keys, int64_t bh, int64_t nb, int64_t n0, int64_t n1) {
  int g = 1;
  for (int64_t n = n0; n < n1; ++n) g = std::max<int>(g, keys[bh * nb + n]);
  return g;
}

// The long-row arguments both bucketed kernels take (see the header), checked once:
// their shapes, and the q, k, v rows through the sort order.
struct LongArgs {
  int64_t BH, T, D, R, nb, H, B, V, AW, G;
  const int64_t *sp, *vp;
  const bool* al;
  const int32_t *kk, *fr, *hv;
  Rows Q, K, Vr;
  LongArgs(const char* what, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& src,
           const at::Tensor& dst, const at::Tensor& allowed, const at::Tensor& keys, const at::Tensor& free,
           const at::Tensor& head_view, int64_t radius)
      : BH(src.size(0)), T(src.size(1)), D(q.size(1)), R(radius), nb(T / R), H(head_view.size(0)),
        B(allowed.size(0)), V(allowed.size(1)), AW(allowed.size(3)), G(AW - 3 * R),
        sp(src.data_ptr<int64_t>()), vp(dst.data_ptr<int64_t>()), al(allowed.data_ptr<bool>()),
        kk(keys.data_ptr<int32_t>()), fr(free.data_ptr<int32_t>()), hv(head_view.data_ptr<int32_t>()),
        Q{q.data_ptr<float>(), sp, vp, D, T}, K{k.data_ptr<float>(), sp, vp, D, T}, Vr{v.data_ptr<float>(), sp, vp, D, T} {
    TORCH_CHECK(nb * R == T && BH == B * H && allowed.size(2) == T && keys.numel() == BH * nb, what,
                ": inconsistent shapes");
    TORCH_CHECK(G < static_cast<int64_t>(kWindowKey), what, ": too many global keys");
  }
};

void bucketed_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& src,
                      const at::Tensor& dst, const at::Tensor& allowed, const at::Tensor& keys, const at::Tensor& free,
                      const at::Tensor& head_view, at::Tensor out, int64_t radius, double scale, double dropout,
                      int64_t seed) {
  const Dropout drop(dropout, seed);
  check("mate bucketed_forward", {&q, &k, &v, &out, &src, &dst, &allowed, &keys, &free, &head_view}, 4);
  const LongArgs a("mate bucketed_forward", q, k, v, src, dst, allowed, keys, free, head_view, radius);
  const int64_t BH = a.BH, T = a.T, D = a.D, R = a.R, nb = a.nb, H = a.H, V = a.V, AW = a.AW, G = a.G;
  const int64_t nc = (nb + kChunk - 1) / kChunk, *dp = a.vp;
  const bool* al = a.al;
  const int32_t *kk = a.kk, *fr = a.fr, *hv = a.hv;
  const Rows &Q = a.Q, &K = a.K, &Vr = a.Vr;
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const int d = static_cast<int>(D), w3 = static_cast<int>(3 * R), r = static_cast<int>(R);

  at::parallel_for(0, BH * nc, 1, [&](int64_t begin, int64_t end) {
    const int64_t rows = kChunk * R;
    std::vector<float> qbuf(rows * D), obuf(rows * D), sbuf(rows * (G + 3 * R)), inv(rows);
    // k/v rows of consecutive buckets [base, base + loaded) of head win_bh, so that the
    // windows of a chunk are contiguous; slides by appending a bucket at a time and
    // moving the tail to the front when the next chunk would not fit
    std::vector<float> kg(G * D), vg(G * D), kw(kWindowCap * R * D), vw(kWindowCap * R * D);
    int64_t head_ready = -1, win_bh = -1, base = 0, loaded = 0;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t bh = t / nc, n0 = (t % nc) * kChunk, n1 = std::min(n0 + kChunk, nb), c = n1 - n0;
      const int64_t b = bh / H, view = hv[bh % H];
      const int g = chunk_keys(kk, bh, nb, n0, n1), width = g + w3, fr_b = std::min<int>(fr[b], g);
      if (bh != head_ready) {
        K.gather(bh, 0, G, kg.data());
        Vr.gather(bh, 0, G, vg.data());
        head_ready = bh;
      }
      const int64_t lo = n0 - 1, hi = n1 + 1;  // window buckets [lo, hi)
      if (bh != win_bh || lo < base || lo > base + loaded) {
        win_bh = bh, base = lo, loaded = 0;
      } else if (hi - base > kWindowCap) {
        const int64_t keep = base + loaded - lo;
        std::memmove(kw.data(), kw.data() + (lo - base) * R * D, sizeof(float) * keep * R * D);
        std::memmove(vw.data(), vw.data() + (lo - base) * R * D, sizeof(float) * keep * R * D);
        base = lo, loaded = keep;
      }
      for (; base + loaded < hi; ++loaded) {
        const int64_t bucket = base + loaded;
        K.gather(bh, bucket * R, (bucket + 1) * R, kw.data() + loaded * R * D);
        Vr.gather(bh, bucket * R, (bucket + 1) * R, vw.data() + loaded * R * D);
      }
      const float* k_window = kw.data() + (lo - base) * R * D;
      const float* v_window = vw.data() + (lo - base) * R * D;
      Q.gather(bh, n0 * R, n1 * R, qbuf.data());
      for (int64_t e = 0; e < c * R * D; ++e) qbuf[e] *= sc;
      float* S = sbuf.data();
      chunk_numerators(R, c, g, w3, d, G, AW, fr_b, qbuf.data(), kg.data(), k_window,
                       al + ((b * V + view) * T + n0 * R) * AW, S, inv.data());
      if (drop.on()) {  // after the row sums: dropout acts on the normalised probabilities
        for (int64_t i = 0; i < c * R; ++i) drop.apply_long(S + i * width, g, w3, bh, n0 * R + i);
      }
      float* o = obuf.data();
      gemm_nn(static_cast<int>(c * R), d, g, S, width, vg.data(), d, 0.0f, o, d);
      for (int64_t j = 0; j < c; ++j) {
        gemm_nn(r, d, w3, S + j * R * width + g, width, v_window + j * R * D, d, 1.0f, o + j * R * D, d);
      }
      for (int64_t i = 0; i < c * R; ++i) {
        const int64_t slot = n0 * R + i, row_out = dp[bh * T + slot];
        if (slot < fr[b] || row_out < 0) continue;  // dense rows are dense_forward's; padding slots
        float* target = op + row_out * D;
        const float s = inv[i];
        for (int64_t e = 0; e < D; ++e) target[e] = o[i * D + e] * s;
      }
    }
  });
}

// Dense rows: sorted slots [0, free[b]) of each head attend the real keys, slots
// [0, real[b]). Key blocks of kBlock with an online softmax; heads in parallel.
constexpr int64_t kBlock = 512;

void dense_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& src,
                   const at::Tensor& dst, const at::Tensor& free, const at::Tensor& real, const at::Tensor& token_rows,
                   int64_t heads, at::Tensor out, double scale, double dropout, int64_t seed) {
  const Dropout drop(dropout, seed);
  check("mate dense_forward", {&q, &k, &v, &out, &src, &dst, &free, &real, &token_rows}, 4);
  const int64_t BH = src.size(0), T = src.size(1), D = q.size(1);
  TORCH_CHECK(BH % heads == 0 && free.numel() == BH / heads && token_rows.numel() == 3 * BH,
              "mate dense_forward: inconsistent shapes");
  const int64_t* tr = token_rows.data_ptr<int64_t>();
  const float *kp = k.data_ptr<float>(), *vpt = v.data_ptr<float>();
  const int64_t *sp = src.data_ptr<int64_t>(), *vp = dst.data_ptr<int64_t>();
  const Rows Q{q.data_ptr<float>(), sp, vp, D, T};
  const Rows K{k.data_ptr<float>(), sp, vp, D, T};
  const Rows Vr{v.data_ptr<float>(), sp, vp, D, T};
  const int64_t* dp = dst.data_ptr<int64_t>();
  const int32_t* fr = free.data_ptr<int32_t>();
  const int32_t* rl = real.data_ptr<int32_t>();
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const int d = static_cast<int>(D);

  at::parallel_for(0, BH, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qbuf, obuf, sbuf, mx, sum, kb(kBlock * D), vb(kBlock * D);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / heads;
      const int m = fr[b];
      const int64_t n = std::max<int64_t>(rl[b], 1);
      if (m <= 0) continue;
      qbuf.resize(m * D);
      obuf.assign(m * D, 0.0f);
      sbuf.resize(m * kBlock);
      mx.assign(m, kMasked);
      sum.assign(m, 0.0f);
      Q.gather(bh, 0, m, qbuf.data());
      for (auto& x : qbuf) x *= sc;
      // the softmax over all real keys does not depend on their order: where they are the
      // example's first tokens (no padding inside), read them in token order straight
      // from k, v (rows base + t * stride), else gather sorted rows
      const int64_t base = tr[3 * bh], stride = tr[3 * bh + 1];
      const bool in_order = tr[3 * bh + 2] != 0;
      for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
        const int kn = static_cast<int>(std::min(kBlock, n - j0));
        const float *kblock = kb.data(), *vblock = vb.data();
        int ld = d;
        if (in_order) {
          kblock = kp + (base + j0 * stride) * D;
          vblock = vpt + (base + j0 * stride) * D;
          ld = static_cast<int>(stride * D);
        } else {
          K.gather(bh, j0, j0 + kn, kb.data());
          Vr.gather(bh, j0, j0 + kn, vb.data());
        }
        float* S = sbuf.data();
        gemm_nt(m, kn, d, qbuf.data(), d, kblock, ld, 0.0f, S, kn);
        for (int i = 0; i < m; ++i) {
          float* row = S + static_cast<int64_t>(i) * kn;
          float bmax = kMasked;
          for (int j = 0; j < kn; ++j) bmax = std::max(bmax, row[j]);
          const float new_max = std::max(mx[i], bmax);
          const float corr = exp_nonpositive(mx[i] - new_max);
          sum[i] = sum[i] * corr + exp_row(row, kn, new_max);
          mx[i] = new_max;
          if (drop.on()) {
            for (int j = 0; j < kn; ++j) {
              const int64_t token = in_order ? j0 + j : (sp[bh * T + j0 + j] - base) / stride;
              row[j] *= drop.factor(bh, i, kDenseKey + token);
            }
          }
          float* orow = obuf.data() + static_cast<int64_t>(i) * D;
          for (int64_t e = 0; e < D; ++e) orow[e] *= corr;
        }
        gemm_nn(m, d, kn, S, kn, vblock, ld, 1.0f, obuf.data(), d);
      }
      for (int i = 0; i < m; ++i) {
        const int64_t row_out = dp[bh * T + i];
        if (row_out < 0) continue;
        const float s = 1.0f / sum[i];
        float* target = op + row_out * D;
        for (int64_t e = 0; e < D; ++e) target[e] = obuf[static_cast<int64_t>(i) * D + e] * s;
      }
    }
  });
}


// Row-major C[m, n] = A[k, m]^T . B[k, n] (+ beta C).
inline void gemm_tn(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float beta, float* c,
                    int ldc) {
  const float one = 1.0f;
  sgemm_("N", "T", &n, &m, &k, &one, b, &ldb, a, &lda, &beta, c, &ldc);
}

// dS = P * (dP - delta_i) in place over dP, row by row (rows of width w, stride ld).
inline void softmax_grad_rows(int64_t rows, int w, int ld, const float* P, float* dP, const float* delta) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* p = P + i * ld;
    float* dp = dP + i * ld;
    const float di = delta[i];
    for (int j = 0; j < w; ++j) dp[j] = p[j] * (dp[j] - di);
  }
}

// Backward of both forwards, fused (flash-attention style: the probabilities are
// recomputed, never stored). One task per head: the head's q (pre-scaled), k, v and dO
// rows are gathered into sorted order once; each chunk of long rows recomputes its
// c R x (g + 3R) probabilities exactly as bucketed_forward does, then
//   dP = dO [Vg ; Vw]^T,  dV += (P M)^T dO,  dS = P * (dP M - rowsum(dO * O)),
//   dQ = scale dS [Kg ; Kw],  dK += scale dS^T Q
// (M: the forward's dropout factors, redrawn; O: the forward's output, dropout included)
// with dK, dV accumulated in sorted order (a key is read by up to three buckets'
// windows and, if global, by every bucket) and written to their rows once at the end.
// The dense rows [0, free[b]) do the same over the real keys [0, real[b]); the long
// part skips them (their gradient comes from the dense part only, as in the forward).
// Heads own disjoint rows, so tasks never write the same memory.
// Extra inputs: grad_out [rows, D] and delta [rows] = rowsum(grad_out * out), in the
// output row layout (dst);
// dq, dk, dv [rows, D] in the input row layout (src), every row written.
void bucketed_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& grad_out,
                       const at::Tensor& delta, const at::Tensor& src, const at::Tensor& dst,
                       const at::Tensor& allowed, const at::Tensor& keys, const at::Tensor& free,
                       const at::Tensor& head_view, const at::Tensor& real, const at::Tensor& token_rows,
                       at::Tensor dq, at::Tensor dk, at::Tensor dv,
                       int64_t radius, double scale, double dropout, int64_t seed) {
  const Dropout drop(dropout, seed);
  check("mate bucketed_backward",
        {&q, &k, &v, &grad_out, &delta, &dq, &dk, &dv, &src, &dst, &allowed, &keys, &free, &head_view, &real,
         &token_rows}, 8);
  const LongArgs a("mate bucketed_backward", q, k, v, src, dst, allowed, keys, free, head_view, radius);
  const int64_t BH = a.BH, T = a.T, D = a.D, R = a.R, nb = a.nb, H = a.H, V = a.V, AW = a.AW, G = a.G;
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&k, &v, &grad_out, &dq, &dk, &dv}) {
    TORCH_CHECK(t->sizes() == q.sizes(), "mate bucketed_backward: q, k, v, grad_out and gradients must have one shape");
  }
  TORCH_CHECK(delta.numel() == q.size(0) && token_rows.numel() == 3 * BH, "mate bucketed_backward: inconsistent shapes");
  const int64_t* tr = token_rows.data_ptr<int64_t>();
  const int64_t *sp = a.sp, *vp = a.vp;
  const Rows &Q = a.Q, &K = a.K, &Vr = a.Vr;
  const Rows dO{grad_out.data_ptr<float>(), vp, vp, D, T};
  const float* dl = delta.data_ptr<float>();
  const bool* al = a.al;
  const int32_t *kk = a.kk, *fr = a.fr, *hv = a.hv;
  const int32_t* rl = real.data_ptr<int32_t>();
  float *dqp = dq.data_ptr<float>(), *dkp = dk.data_ptr<float>(), *dvp = dv.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const int d = static_cast<int>(D), w3 = static_cast<int>(3 * R), r = static_cast<int>(R);

  at::parallel_for(0, BH, 1, [&](int64_t begin, int64_t end) {
    // sorted rows of one head; k, v and their gradients with one bucket of zeros on each
    // side, so that every window (slots [(n-1)R, (n+2)R)) is a plain pointer
    const int64_t padded = (T + 2 * R) * D;
    std::vector<float> qs(T * D), go(T * D), dlt(T);
    std::vector<float> kp(padded), vpad(padded), dkp_s(padded), dvp_s(padded);
    const int64_t chunk_rows = kChunk * R;
    std::vector<float> P(chunk_rows * (G + 3 * R)), dP(chunk_rows * (G + 3 * R)), inv(chunk_rows);
    std::vector<float> dob(chunk_rows * D), dqb(chunk_rows * D);
    std::vector<float> Pd, dPd;
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, view = hv[bh % H];
      const int fr_all = fr[b];
      Q.gather(bh, 0, T, qs.data());
      for (auto& x : qs) x *= sc;
      K.gather(bh, -R, T + R, kp.data());
      Vr.gather(bh, -R, T + R, vpad.data());
      dO.gather(bh, 0, T, go.data());
      for (int64_t s = 0; s < T; ++s) dlt[s] = vp[bh * T + s] < 0 ? 0.0f : dl[vp[bh * T + s]];
      std::fill(dkp_s.begin(), dkp_s.end(), 0.0f);
      std::fill(dvp_s.begin(), dvp_s.end(), 0.0f);
      const float* kg = kp.data() + R * D;  // slot 0
      const float* vg = vpad.data() + R * D;
      float* dkg = dkp_s.data() + R * D;
      float* dvg = dvp_s.data() + R * D;

      for (int64_t n0 = 0; n0 < nb; n0 += kChunk) {  // the forward's chunks
        const int64_t n1 = std::min(n0 + kChunk, nb), c = n1 - n0, s0 = n0 * R, rows = c * R;
        if (n1 * R <= fr_all || vp[bh * T + s0] < 0) continue;  // all dense rows, or all padding slots
        const int g = chunk_keys(kk, bh, nb, n0, n1), width = g + w3, fr_b = std::min<int>(fr_all, g);
        const int m = static_cast<int>(rows);
        float* Pc = P.data();
        chunk_numerators(R, c, g, w3, d, G, AW, fr_b, qs.data() + s0 * D, kg, kp.data() + s0 * D,
                         al + ((b * V + view) * T + s0) * AW, Pc, inv.data());
        // normalise; rows the long part does not answer (dense rows) get dO = 0
        for (int64_t i = 0; i < rows; ++i) {
          float* row = Pc + i * width;
          for (int j = 0; j < width; ++j) row[j] *= inv[i];
          const bool mine = s0 + i >= fr_all;
          std::memcpy(dob.data() + i * D, go.data() + (s0 + i) * D, sizeof(float) * D);
          if (!mine) std::memset(dob.data() + i * D, 0, sizeof(float) * D);
          inv[i] = mine ? dlt[s0 + i] : 0.0f;  // reused as the rows' delta
        }
        float* dPc = dP.data();
        // dP = dO [Vg ; Vw]^T: the global part for the whole chunk at once, windows per bucket
        gemm_nt(m, g, d, dob.data(), d, vg, d, 0.0f, dPc, width);
        for (int64_t j = 0; j < c; ++j) {
          const int64_t sj = s0 + j * R;  // bucket n0 + j: its window rows start at slot sj - R
          gemm_nt(r, w3, d, dob.data() + j * R * D, d, vpad.data() + sj * D, d, 0.0f, dPc + j * R * width + g, width);
        }
        // dS = P * (dP M - delta) in place over dP, and P becomes P M (M: the dropout
        // factors, the forward's mask; none without dropout)
        if (drop.on()) {
          for (int64_t i = 0; i < rows; ++i) {
            float *p = Pc + i * width, *dp = dPc + i * width;
            for (int j = 0; j < width; ++j) {
              const float f = drop.factor(bh, s0 + i, j < g ? j : kWindowKey + (j - g));
              dp[j] = p[j] * (dp[j] * f - inv[i]);
              p[j] *= f;
            }
          }
        } else {
          softmax_grad_rows(rows, width, width, Pc, dPc, inv.data());
        }
        // dV += (P M)^T dO
        gemm_tn(g, d, m, Pc, width, dob.data(), d, 1.0f, dvg, d);
        for (int64_t j = 0; j < c; ++j) {
          const int64_t sj = s0 + j * R;
          gemm_tn(w3, d, r, Pc + j * R * width + g, width, dob.data() + j * R * D, d, 1.0f, dvp_s.data() + sj * D, d);
        }
        // dQ = dS [Kg ; Kw] and dK += dS^T Q (q pre-scaled)
        gemm_nn(m, d, g, dPc, width, kg, d, 0.0f, dqb.data(), d);
        gemm_tn(g, d, m, dPc, width, qs.data() + s0 * D, d, 1.0f, dkg, d);
        for (int64_t j = 0; j < c; ++j) {
          const int64_t sj = s0 + j * R;
          const float* dsj = dPc + j * R * width + g;
          gemm_nn(r, d, w3, dsj, width, kp.data() + sj * D, d, 1.0f, dqb.data() + j * R * D, d);
          gemm_tn(w3, d, r, dsj, width, qs.data() + sj * D, d, 1.0f, dkp_s.data() + sj * D, d);
        }
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t slot = s0 + i;
          if (slot < fr_all || vp[bh * T + slot] < 0) continue;
          float* target = dqp + sp[bh * T + slot] * D;
          for (int64_t e = 0; e < D; ++e) target[e] = dqb[i * D + e] * sc;
        }
      }

      if (fr_all > 0) {  // dense rows over the real keys
        const int m = fr_all, nk = static_cast<int>(std::max<int64_t>(rl[b], 1));
        Pd.resize(static_cast<size_t>(m) * nk);
        dPd.resize(static_cast<size_t>(m) * nk);
        gemm_nt(m, nk, d, qs.data(), d, kg, d, 0.0f, Pd.data(), nk);
        for (int i = 0; i < m; ++i) {
          float* row = Pd.data() + static_cast<int64_t>(i) * nk;
          float mx = kMasked;
          for (int j = 0; j < nk; ++j) mx = std::max(mx, row[j]);
          const float s = 1.0f / exp_row(row, nk, mx);
          for (int j = 0; j < nk; ++j) row[j] *= s;
        }
        gemm_nt(m, nk, d, go.data(), d, vg, d, 0.0f, dPd.data(), nk);
        if (drop.on()) {  // as in the long part; keys by their token position
          const int64_t base = tr[3 * bh], stride = tr[3 * bh + 1];
          for (int i = 0; i < m; ++i) {
            float *p = Pd.data() + static_cast<int64_t>(i) * nk, *dp = dPd.data() + static_cast<int64_t>(i) * nk;
            for (int j = 0; j < nk; ++j) {
              const float f = drop.factor(bh, i, kDenseKey + (sp[bh * T + j] - base) / stride);
              dp[j] = p[j] * (dp[j] * f - dlt[i]);
              p[j] *= f;
            }
          }
        } else {
          softmax_grad_rows(m, nk, nk, Pd.data(), dPd.data(), dlt.data());
        }
        gemm_tn(nk, d, m, Pd.data(), nk, go.data(), d, 1.0f, dvg, d);
        if (dqb.size() < static_cast<size_t>(m) * D) dqb.resize(static_cast<size_t>(m) * D);
        gemm_nn(m, d, nk, dPd.data(), nk, kg, d, 0.0f, dqb.data(), d);
        gemm_tn(nk, d, m, dPd.data(), nk, qs.data(), d, 1.0f, dkg, d);
        for (int i = 0; i < m; ++i) {
          if (vp[bh * T + i] < 0) continue;
          float* target = dqp + sp[bh * T + i] * D;
          for (int64_t e = 0; e < D; ++e) target[e] = dqb[i * D + e] * sc;
        }
      }

      for (int64_t s = 0; s < T; ++s) {  // every row of this head: one slot < N
        if (vp[bh * T + s] < 0) continue;
        const int64_t row = sp[bh * T + s];
        std::memcpy(dkp + row * D, dkg + s * D, sizeof(float) * D);
        std::memcpy(dvp + row * D, dvg + s * D, sizeof(float) * D);
      }
    }
  });
}

}  // namespace

// Registered for the CPU key (not as a catch-all), so torch dispatch modes such as
// FlopCounterMode see the call.
TORCH_LIBRARY(mate_cpu, m) {
  m.def(
      "bucketed_forward(Tensor q, Tensor k, Tensor v, Tensor src, Tensor dst, Tensor allowed, Tensor keys, "
      "Tensor free, Tensor head_view, Tensor(a!) out, int radius, float scale, float dropout, int seed) -> ()");
  m.def(
      "dense_forward(Tensor q, Tensor k, Tensor v, Tensor src, Tensor dst, Tensor free, Tensor real, "
      "Tensor token_rows, int heads, Tensor(a!) out, float scale, float dropout, int seed) -> ()");
  m.def(
      "bucketed_backward(Tensor q, Tensor k, Tensor v, Tensor grad_out, Tensor delta, Tensor src, Tensor dst, "
      "Tensor allowed, Tensor keys, Tensor free, Tensor head_view, Tensor real, Tensor token_rows, Tensor(a!) dq, Tensor(b!) dk, "
      "Tensor(c!) dv, int radius, float scale, float dropout, int seed) -> ()");
}

TORCH_LIBRARY_IMPL(mate_cpu, CPU, m) {
  m.impl("bucketed_forward", &bucketed_forward);
  m.impl("dense_forward", &dense_forward);
  m.impl("bucketed_backward", &bucketed_backward);
}
