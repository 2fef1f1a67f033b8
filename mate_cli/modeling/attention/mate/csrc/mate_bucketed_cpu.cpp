// MATE bucketed attention on CPU: fused kernels for the forward of the long (bucketed)
// rows and of the dense rows (the global part), and one for the backward of both.
//
// The torch path (bucketed.py) sorts k and v into a bucket-aligned buffer, then
// computes the long rows chunk by chunk with torch ops: scores to [globals ; window],
// mask bias, softmax, two context GEMMs (each a full pass over a multi-MB chunk), and
// unsorts the result. Here nothing is sorted in memory: each thread walks its chunks of
// kChunk buckets in order, gathering the rows it needs straight from q, k, v through
// the per-head sort order (a sliding window of k/v buckets: every row is read once),
// and does a chunk start to finish while its scores sit in L1/L2: one product against
// the global keys for all the chunk's rows and one per bucket against its 3R-key window
// (keys held as columns, written into one score row per query: Layout), mask + exp +
// row sums in one vector pass, the context products likewise, then each output row is
// scaled and streamed to its token's row. Chunks are independent: at::parallel_for.
// Dense rows (the global part attends to every real key, under MATE's pattern): per head,
// key blocks with an online softmax (flash-attention style), heads in parallel.
// The products are this file's register-blocked `mm` (no BLAS: on these 42-row shapes
// MKL ran at half its large-GEMM rate, and calls cost more than the work), the
// elementwise passes GCC vector extensions with the target's lanes (`-march=native`).
//
// Common inputs (contiguous, float32 on CPU; built and cached by BucketPlan):
//   q, k, v   [rows, D]           unsorted, flat (one row layout for all three)
//   src       [BH, T] int64       sorted slot -> row of q/k/v (slots >= N: any valid row)
//   dst       [BH, T] int64       sorted slot -> row of out (-1: slot >= N, not written)
//   free      [B] int32           query-set tokens among the globals (never masked as keys)
//   dense     [B] int32           the global part's real tokens, min(real, G): dense rows, slots [0, dense)
//   out       [rows, D]           the result, in the output row layout (written, never read)
// Long rows only:
//   allowed   [B, V, T, G + 3R] bool  MATE's pattern per sorted row: [globals ; window]
//   keys      [BH * nb] int32     global keys bucket f reads (keys beyond: masked for all its rows)
//   head_view [H] int32           view (row/column) of each head
// Dense rows only:
//   real      [B] int32           real tokens (the sorted prefix the dense rows attend)
//   groups    [B, V, T] int32     each sorted slot's group (0: query set, row/column id + 1)
//   token_groups [B, V, N] int32  the same in token order (keys read in token order)
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

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

constexpr float kMasked = -1e30f;
constexpr float kPadding = 2 * kMasked;  // padded score columns: exp = 0 even in a fully masked row

// Register-blocked matrix products for the kernels' small shapes (42- and 336-row
// blocks, <= 3R + G keys, head dims 32-64). MKL reaches about half its large-GEMM rate
// on these (packing and call overhead per 42-row problem); this one keeps a kMR x
// kNV-vector block of C in registers, streams B a row at a time and broadcasts A,
// which runs near the core's FMA peak from L1/L2 (~180 GFLOP/s a core here, as MKL's
// large GEMMs). GCC vector extensions: the lanes are the target's (-march=native), so
// the same source builds for AVX-512, AVX2 or SSE/NEON, with blocks sized for that
// register file (the tests build the narrower ones too). Sums run over the reduction
// index in order.
#if defined(__AVX512F__)
constexpr int kLanes = 16;
#elif defined(__AVX__)
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;
#endif
typedef float Vec __attribute__((vector_size(sizeof(float) * kLanes)));
constexpr int kMR = kLanes == 16 ? 6 : 3;  // rows of a register block
constexpr int kNV = 4;                      // vectors per row of a register block

inline int64_t round_up(int64_t x) { return (x + kLanes - 1) / kLanes * kLanes; }
inline Vec vload(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void vstore(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }

// C[MR, NV kLanes] (+)= A[MR, k] B[k, NV kLanes]; A's element (i, t) at a[i rs + t cs]
template <int MR, int NV>
inline void mm_block(int k, const float* a, int64_t rs, int64_t cs, const float* b, int64_t ldb, float* c,
                     int64_t ldc, bool accumulate) {
  Vec acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[i][v] = accumulate ? vload(c + i * ldc + v * kLanes) : Vec{};
  }
  for (int t = 0; t < k; ++t, a += cs, b += ldb) {
    Vec bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = vload(b + v * kLanes);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const float x = a[i * rs];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[i][v] += x * bv[v];
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) vstore(c + i * ldc + v * kLanes, acc[i][v]);
  }
}

// the same for columns [0, n) with n < kLanes (head dims that are not a multiple of it)
inline void mm_narrow(int rows, int n, int k, const float* a, int64_t rs, int64_t cs, const float* b, int64_t ldb,
                      float* c, int64_t ldc, bool accumulate) {
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < n; ++j) {
      float x = accumulate ? c[i * ldc + j] : 0.0f;
      for (int t = 0; t < k; ++t) x += a[i * rs + t * cs] * b[t * ldb + j];
      c[i * ldc + j] = x;
    }
  }
}

template <int MR>
inline void mm_rows(int n, int k, const float* a, int64_t rs, int64_t cs, const float* b, int64_t ldb, float* c,
                    int64_t ldc, bool accumulate) {
  int j = 0;
  for (; j + kNV * kLanes <= n; j += kNV * kLanes) mm_block<MR, kNV>(k, a, rs, cs, b + j, ldb, c + j, ldc, accumulate);
  switch ((n - j) / kLanes) {
    case 3: mm_block<MR, 3>(k, a, rs, cs, b + j, ldb, c + j, ldc, accumulate); break;
    case 2: mm_block<MR, 2>(k, a, rs, cs, b + j, ldb, c + j, ldc, accumulate); break;
    case 1: mm_block<MR, 1>(k, a, rs, cs, b + j, ldb, c + j, ldc, accumulate); break;
    default: break;
  }
  j += (n - j) / kLanes * kLanes;
  if (j < n) mm_narrow(MR, n - j, k, a, rs, cs, b + j, ldb, c + j, ldc, accumulate);
}

// Row-major C[m, n] (+)= A[m, k] B[k, n]; A's element (i, t) at a[i rs + t cs], so
// A = X is (rs, cs) = (ldx, 1) and A = X^T is (1, ldx).
inline void mm(int m, int n, int k, const float* a, int64_t rs, int64_t cs, const float* b, int64_t ldb, float* c,
               int64_t ldc, bool accumulate) {
  int i = 0;
  for (; i + kMR <= m; i += kMR) mm_rows<kMR>(n, k, a + i * rs, rs, cs, b, ldb, c + i * ldc, ldc, accumulate);
  const float* ai = a + i * rs;
  float* ci = c + i * ldc;
  switch (m - i) {
    case 5: mm_rows<5>(n, k, ai, rs, cs, b, ldb, ci, ldc, accumulate); break;
    case 4: mm_rows<4>(n, k, ai, rs, cs, b, ldb, ci, ldc, accumulate); break;
    case 3: mm_rows<3>(n, k, ai, rs, cs, b, ldb, ci, ldc, accumulate); break;
    case 2: mm_rows<2>(n, k, ai, rs, cs, b, ldb, ci, ldc, accumulate); break;
    case 1: mm_rows<1>(n, k, ai, rs, cs, b, ldb, ci, ldc, accumulate); break;
    default: break;
  }
}


typedef int32_t IVec __attribute__((vector_size(sizeof(int32_t) * kLanes)));
typedef uint8_t BVec __attribute__((vector_size(kLanes)));

// exp(x) for x <= 0, kLanes at a time: 2^n exp(f) with t = x / ln 2, n = round(t),
// f = (t - n) ln 2 and a degree-7 Taylor polynomial of exp on |f| <= ln2 / 2 (|relative
// error| < 2e-7); exactly 0 below -87 (the masked scores; no denormals downstream).
// Plain arithmetic, no libm call.
inline Vec exp_taylor(Vec f) {
  Vec p = Vec{} + 1.0f / 5040.0f;
  p = p * f + 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  return p * f + 1.0f;
}

inline Vec exp_nonpositive(Vec x) {
  constexpr float kLog2e = 1.44269504088896341f, kLn2 = 0.693147180559945309f;
#if defined(__AVX512F__)
  // rounding by vrndscaleps, 2^n by vscalefps, the cut-off by a zeroing mask
  const __m512 xs = reinterpret_cast<__m512>(x);
  const __m512 t = _mm512_mul_ps(xs, _mm512_set1_ps(kLog2e));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const Vec p = exp_taylor(reinterpret_cast<Vec>(_mm512_sub_ps(t, n)) * kLn2);
  const __mmask16 keep = _mm512_cmp_ps_mask(xs, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
  return reinterpret_cast<Vec>(_mm512_maskz_scalef_ps(keep, reinterpret_cast<__m512>(p), n));
#else
  const Vec lo = Vec{} - 87.0f;
  const Vec t = (x > lo ? x : lo) * kLog2e;
  const IVec n = __builtin_convertvector(t - 0.5f, IVec);  // t <= 0: truncating t - 1/2 rounds t
  const Vec p = exp_taylor((t - __builtin_convertvector(n, Vec)) * kLn2);
  return x < lo ? Vec{} : p * reinterpret_cast<Vec>((n + 127) << 23);
#endif
}

// The lane-wise partial sums of dot(x, y) over [0, D) (hsum them for the dot product).
inline Vec dot_lanes(const float* x, const float* y, int64_t D) {
  Vec acc{};
  int64_t e = 0;
  for (; e + kLanes <= D; e += kLanes) acc += vload(x + e) * vload(y + e);
  for (; e < D; ++e) acc[0] += x[e] * y[e];
  return acc;
}

inline float hsum(Vec v) {
  float s = 0.0f;
  for (int j = 0; j < kLanes; ++j) s += v[j];
  return s;
}
inline float hmax(Vec v) {
  float m = v[0];
  for (int j = 1; j < kLanes; ++j) m = std::max(m, v[j]);
  return m;
}


// Transpose a kLanes x kLanes block in registers: log2(kLanes) butterfly stages; stage
// H pairs rows i and i + H and swaps their H-lane sub-blocks (lane j of row i becomes
// its own j or the partner's j - H; of row i + H, its own j + H or the partner's j).
template <int H>
inline void transpose_stage(Vec* r) {
  IVec lo, hi;
#pragma GCC unroll 16
  for (int j = 0; j < kLanes; ++j) {
    lo[j] = (j & H) ? kLanes + j - H : j;
    hi[j] = (j & H) ? kLanes + j : j + H;
  }
#pragma GCC unroll 16
  for (int i = 0; i < kLanes; ++i) {
    if (i & H) continue;
    const Vec a = r[i], b = r[i + H];
    r[i] = __builtin_shuffle(a, b, lo);
    r[i + H] = __builtin_shuffle(a, b, hi);
  }
}

inline void transpose_block(Vec* r) {
  transpose_stage<1>(r);
  transpose_stage<2>(r);
  if constexpr (kLanes > 4) transpose_stage<4>(r);
  if constexpr (kLanes > 8) transpose_stage<8>(r);
}

// dst[0, D) = src[0, D) * mul
inline void copy_scaled(float* dst, const float* src, int64_t D, float mul) {
  int64_t e = 0;
  for (; e + kLanes <= D; e += kLanes) vstore(dst + e, vload(src + e) * mul);
  for (; e < D; ++e) dst[e] = src[e] * mul;
}

// kLanes rows (src[i]; nullptr: zeros) of D features as kLanes columns of dst: row i's
// feature e at dst[e ld + i]. Scalar copies where D is not a multiple of kLanes.
inline void transpose_tile(const float* const* src, int64_t D, float* dst, int64_t ld) {
  if (D % kLanes != 0) {
    for (int i = 0; i < kLanes; ++i) {
      for (int64_t e = 0; e < D; ++e) dst[e * ld + i] = src[i] ? src[i][e] : 0.0f;
    }
    return;
  }
  for (int64_t e0 = 0; e0 < D; e0 += kLanes) {
    Vec tile[kLanes];
#pragma GCC unroll 16
    for (int i = 0; i < kLanes; ++i) tile[i] = src[i] ? vload(src[i] + e0) : Vec{};
    transpose_block(tile);
#pragma GCC unroll 16
    for (int e = 0; e < kLanes; ++e) vstore(dst + (e0 + e) * ld, tile[e]);
  }
}

// Rows [0, n) of a row-major [n, D] buffer as columns of dst ([D, ld]), whole tiles as
// in Rows::gather_t.
inline void transpose_rows(const float* rows, int64_t n, int64_t D, float* dst, int64_t ld) {
  const float* src[kLanes];
  for (int64_t s = 0; s < n; s += kLanes, dst += kLanes) {
    for (int i = 0; i < kLanes; ++i) src[i] = s + i < n ? rows + (s + i) * D : nullptr;
    transpose_tile(src, D, dst, ld);
  }
}

// dst[0, D) = src[0, D) * mul for a row written once and read much later (the kernels'
// outputs): streamed past the caches where the target has AVX-512 (no read-for-ownership
// of a line about to be overwritten whole). Callers end with store_fence().
inline void store_row(float* dst, const float* src, int64_t D, float mul) {
#if defined(__AVX512F__)
  if (D % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 64 == 0) {
    for (int64_t e = 0; e < D; e += 16) _mm512_stream_ps(dst + e, reinterpret_cast<__m512>(vload(src + e) * mul));
    return;
  }
#endif
  for (int64_t e = 0; e < D; ++e) dst[e] = src[e] * mul;
}
inline void store_fence() {
#if defined(__AVX512F__)
  _mm_sfence();
#endif
}

constexpr int64_t kAhead = 8;  // rows a gather prefetches ahead (they are scattered: no HW prefetch)

struct Rows {
  const float* base;
  const int64_t* index;  // sorted slot -> row of base
  const int64_t* valid;  // sorted slot -> output row, -1 for slots >= N (read as zeros)
  int64_t D;
  int64_t T;
  // slot s of head bh's sorted order, or nullptr where it reads as zeros (slots outside
  // [0, N), as in the torch path's sorted buffers)
  const float* row(int64_t bh, int64_t s) const {
    return s < 0 || s >= T || valid[bh * T + s] < 0 ? nullptr : base + index[bh * T + s] * D;
  }
  void prefetch(int64_t bh, int64_t s) const {
    if (const float* p = row(bh, s)) {
      for (int64_t e = 0; e < D; e += 64 / sizeof(float)) __builtin_prefetch(p + e);
    }
  }
  // rows [s0, s1) of head bh's sorted order into dst, times mul
  void gather(int64_t bh, int64_t s0, int64_t s1, float* dst, float mul = 1.0f) const {
    for (int64_t s = s0; s < s1; ++s, dst += D) {
      prefetch(bh, s + kAhead);
      const float* src = row(bh, s);
      if (src == nullptr) {
        std::memset(dst, 0, sizeof(float) * D);
      } else {
        copy_scaled(dst, src, D, mul);
      }
    }
  }
  // the same rows as columns: slot s's element e at dst[e ld + s - s0] (keys laid out
  // for the score products, which stream them a feature at a time). Writes whole
  // tiles: columns [s1 - s0, round_up(s1 - s0)) get zeros, so dst must have room for them.
  void gather_t(int64_t bh, int64_t s0, int64_t s1, float* dst, int64_t ld) const {
    const float* src[kLanes];
    for (int64_t s = s0; s < s1; s += kLanes, dst += kLanes) {
      for (int i = 0; i < kLanes; ++i) {
        prefetch(bh, s + i + kAhead);
        src[i] = s + i < s1 ? row(bh, s + i) : nullptr;
      }
      transpose_tile(src, D, dst, ld);
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


// The columns of a chunk's score rows: [g globals, padded to gp ; 3R window, padded to
// wp], both pads multiples of kLanes (the products write whole vectors; padded columns
// are set to kPadding, so their probabilities are exactly 0).
struct Layout {
  int g, gp, w3, wp;
  Layout(int g_, int64_t R) : g(g_), gp(static_cast<int>(round_up(g_))), w3(static_cast<int>(3 * R)),
                              wp(static_cast<int>(round_up(3 * R))) {}
  int width() const { return gp + wp; }
};

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
  // one long row laid out as a chunk's score rows
  void apply_long(float* x, const Layout& L, uint64_t bh, uint64_t row) const {
    apply(x, L.g, bh, row, 0);
    apply(x + L.gp, L.w3, bh, row, kWindowKey);
  }
};

constexpr int64_t kWindowCap = 32;  // buckets of k/v rows a thread keeps (>= kChunk + 2)
// Buckets done together: their rows share one GEMM against the global keys (and one for
// the global context), c R rows instead of R, while each bucket's window keeps its own
// R x 3R GEMMs. Chunks are aligned (bucket n is in chunk n / kChunk) in the forward and
// the backward alike, so both see the same key set per row.
constexpr int64_t kChunk = 8;
static_assert(kWindowCap >= kChunk + 2, "a chunk's windows must fit the sliding buffer");

// Allowed flags a[j0, j0 + kLanes) as 0/1 lanes; those at or past n are 0 and not read.
inline IVec flags(const bool* a, int j0, int n) {
  BVec f{};
  if (j0 + kLanes <= n) {
    std::memcpy(&f, a + j0, kLanes);
  } else {
    for (int j = j0; j < n; ++j) f[j - j0] = a[j];
  }
#if defined(__AVX512F__)  // GCC widens byte vectors lane by lane otherwise
  return reinterpret_cast<IVec>(_mm512_cvtepu8_epi32(reinterpret_cast<__m128i>(f)));
#elif defined(__AVX2__)
  return reinterpret_cast<IVec>(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(&f))));
#else
  return __builtin_convertvector(f, IVec);
#endif
}

// One long row of scores in place: MATE's mask (a: the row's flags, [G globals ; 3R
// window]; the first fr_b globals, the query set, always allowed), padding columns,
// then exp(x - row max); returns the row sum. kLanes columns at a time.
inline float long_row_numerators(float* row, const bool* a, const Layout& L, int64_t G, int fr_b) {
  IVec iota;
  for (int j = 0; j < kLanes; ++j) iota[j] = j;
  const Vec masked = Vec{} + kMasked, padding = Vec{} + kPadding;
  Vec mx = masked;
  for (int j0 = 0; j0 < L.gp; j0 += kLanes) {
    const IVec col = iota + j0;
    Vec x = vload(row + j0);
    x = col >= L.g ? padding : ((col < fr_b) | (flags(a, j0, L.g) != 0) ? x : masked);
    vstore(row + j0, x);
    mx = mx > x ? mx : x;
  }
  float* win = row + L.gp;
  for (int j0 = 0; j0 < L.wp; j0 += kLanes) {
    const IVec col = iota + j0;
    Vec x = vload(win + j0);
    x = col >= L.w3 ? padding : (flags(a + G, j0, L.w3) != 0 ? x : masked);
    vstore(win + j0, x);
    mx = mx > x ? mx : x;
  }
  const Vec m = Vec{} + hmax(mx);
  Vec sum{};
  for (int j0 = 0; j0 < L.width(); j0 += kLanes) {
    const Vec e = exp_nonpositive(vload(row + j0) - m);
    vstore(row + j0, e);
    sum += e;
  }
  return hsum(sum);
}

// Softmax numerators of a chunk of c buckets (c R rows, sorted slots from n0 R) into S
// (rows of L.width()): scores of the pre-scaled queries qs [c R, d] against the global
// keys kgT and each bucket's window (keys as columns: [d, ldg] and [d, ldw], bucket j's
// window from column j R of kwT), MATE's mask (a: the first row's allowed flags, AW per
// row, window flags from G), then exp(x - row max); inv[i] = 1 / row sum. g is the most
// global keys any bucket of the chunk reads; keys beyond a bucket's own count are
// masked for its rows (exp = 0, so nothing changes). The first fr_b global keys (the
// query set) are allowed for every row. Shared by the forward and the backward (which
// recomputes).
inline void chunk_numerators(int64_t R, int64_t c, const Layout& L, int d, int64_t G, int64_t AW, int fr_b,
                             const float* qs, const float* kgT, int64_t ldg, const float* kwT, int64_t ldw,
                             const bool* a, float* S, float* inv) {
  const int width = L.width(), gp = L.gp;
  mm(static_cast<int>(c * R), gp, d, qs, d, 1, kgT, ldg, S, width, false);
  for (int64_t j = 0; j < c; ++j) {
    mm(static_cast<int>(R), L.wp, d, qs + j * R * d, d, 1, kwT + j * R, ldw, S + j * R * width + gp, width, false);
  }
  for (int64_t i = 0; i < c * R; ++i, a += AW) inv[i] = 1.0f / long_row_numerators(S + i * width, a, L, G, fr_b);
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
                      const at::Tensor& dense, const at::Tensor& head_view, at::Tensor out, int64_t radius,
                      double scale, double dropout, int64_t seed) {
  const Dropout drop(dropout, seed);
  check("mate bucketed_forward", {&q, &k, &v, &out, &src, &dst, &allowed, &keys, &free, &dense, &head_view}, 4);
  const int32_t* dn = dense.data_ptr<int32_t>();
  const LongArgs a("mate bucketed_forward", q, k, v, src, dst, allowed, keys, free, head_view, radius);
  const int64_t BH = a.BH, T = a.T, D = a.D, R = a.R, nb = a.nb, H = a.H, V = a.V, AW = a.AW, G = a.G;
  const int64_t nc = (nb + kChunk - 1) / kChunk, *dp = a.vp;
  const bool* al = a.al;
  const int32_t *kk = a.kk, *fr = a.fr, *hv = a.hv;
  const Rows &Q = a.Q, &K = a.K, &Vr = a.Vr;
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const int d = static_cast<int>(D), r = static_cast<int>(R);

  at::parallel_for(0, BH * nc, 1, [&](int64_t begin, int64_t end) {
    const int64_t rows = kChunk * R, Gp = round_up(G), wmax = Layout(static_cast<int>(G), R).width();
    std::vector<float> qbuf(rows * D), obuf(rows * D), sbuf(rows * wmax), inv(rows);
    // the head's global keys as columns (kgT [D, Gp], zero beyond G) and values as rows;
    // k (as columns) and v rows of consecutive buckets [base, base + loaded) of head
    // win_bh, so that the windows of a chunk are contiguous; slides by appending a
    // bucket at a time and moving the tail to the front when the next chunk would not
    // fit. kwT has kLanes spare columns: a window's padded columns read past its keys.
    const int64_t ldw = kWindowCap * R + kLanes;
    std::vector<float> kgT(D * Gp), vg(G * D), kwT(D * ldw), vw(kWindowCap * R * D);
    int64_t head_ready = -1, win_bh = -1, base = 0, loaded = 0;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t bh = t / nc, n0 = (t % nc) * kChunk, n1 = std::min(n0 + kChunk, nb), c = n1 - n0;
      const int64_t b = bh / H, view = hv[bh % H];
      const Layout L(chunk_keys(kk, bh, nb, n0, n1), R);
      const int g = L.g, width = L.width(), fr_b = std::min<int>(fr[b], g);
      if (bh != head_ready) {
        K.gather_t(bh, 0, G, kgT.data(), Gp);
        Vr.gather(bh, 0, G, vg.data());
        head_ready = bh;
      }
      const int64_t lo = n0 - 1, hi = n1 + 1;  // window buckets [lo, hi)
      if (bh != win_bh || lo < base || lo > base + loaded) {
        win_bh = bh, base = lo, loaded = 0;
      } else if (hi - base > kWindowCap) {
        const int64_t keep = base + loaded - lo, from = (lo - base) * R;
        for (int64_t e = 0; e < D; ++e) std::memmove(&kwT[e * ldw], &kwT[e * ldw + from], sizeof(float) * keep * R);
        std::memmove(vw.data(), vw.data() + from * D, sizeof(float) * keep * R * D);
        base = lo, loaded = keep;
      }
      for (; base + loaded < hi; ++loaded) {
        const int64_t bucket = base + loaded;
        K.gather_t(bh, bucket * R, (bucket + 1) * R, kwT.data() + loaded * R, ldw);
        Vr.gather(bh, bucket * R, (bucket + 1) * R, vw.data() + loaded * R * D);
      }
      const float* kw_window = kwT.data() + (lo - base) * R;
      const float* v_window = vw.data() + (lo - base) * R * D;
      Q.gather(bh, n0 * R, n1 * R, qbuf.data(), sc);
      float* S = sbuf.data();
      chunk_numerators(R, c, L, d, G, AW, fr_b, qbuf.data(), kgT.data(), Gp, kw_window, ldw,
                       al + ((b * V + view) * T + n0 * R) * AW, S, inv.data());
      if (drop.on()) {  // after the row sums: dropout acts on the normalised probabilities
        for (int64_t i = 0; i < c * R; ++i) drop.apply_long(S + i * width, L, bh, n0 * R + i);
      }
      float* o = obuf.data();
      mm(static_cast<int>(c * R), d, g, S, width, 1, vg.data(), D, o, D, false);
      for (int64_t j = 0; j < c; ++j) {
        mm(r, d, L.w3, S + j * R * width + L.gp, width, 1, v_window + j * R * D, D, o + j * R * D, D, true);
      }
      for (int64_t i = 0; i < c * R; ++i) {
        const int64_t slot = n0 * R + i, row_out = dp[bh * T + slot];
        if (slot < dn[b] || row_out < 0) continue;  // dense rows are dense_forward's; padding slots
        store_row(op + row_out * D, o + i * D, D, inv[i]);
      }
    }
    store_fence();
  });
}

// Scores of dense rows [0, m) (columns of S, stride mp) against kn keys (rows of S): a
// table row (group > 0) keeps only the query set (group 0) and its own row/column.
inline void mask_dense_block(float* S, int mp, int kn, int m, const int32_t* row_group, const int32_t* key_group) {
  int first = 0;  // the query set leads the dense rows and sees every key
  while (first < m && row_group[first] == 0) ++first;
  if (first == m) return;
  for (int j = 0; j < kn; ++j) {
    const int32_t gj = key_group[j];
    if (gj == 0) continue;
    float* row = S + static_cast<int64_t>(j) * mp;
    for (int i = first; i < m; ++i) row[i] = row_group[i] == gj ? row[i] : kMasked;
  }
}

// Dense rows: sorted slots [0, dense[b]) of each head attend the real keys, slots
// [0, real[b]), under MATE's pattern. Key blocks of kBlock with an online softmax;
// heads in parallel.
constexpr int64_t kBlock = 512;

void dense_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& src,
                   const at::Tensor& dst, const at::Tensor& dense, const at::Tensor& real, const at::Tensor& token_rows,
                   const at::Tensor& head_view, const at::Tensor& groups, const at::Tensor& token_groups,
                   at::Tensor out, double scale, double dropout, int64_t seed) {
  const Dropout drop(dropout, seed);
  check("mate dense_forward", {&q, &k, &v, &out, &src, &dst, &dense, &real, &token_rows, &head_view, &groups,
                                &token_groups}, 4);
  const int64_t BH = src.size(0), T = src.size(1), D = q.size(1), heads = head_view.size(0);
  const int64_t V = groups.size(1), N = token_groups.size(2);
  TORCH_CHECK(BH % heads == 0 && dense.numel() == BH / heads && token_rows.numel() == 3 * BH &&
                  groups.size(0) == BH / heads && groups.size(2) == T && token_groups.size(1) == V,
              "mate dense_forward: inconsistent shapes");
  const int32_t *hv = head_view.data_ptr<int32_t>(), *gs = groups.data_ptr<int32_t>(),
                *gt = token_groups.data_ptr<int32_t>();
  const int64_t* tr = token_rows.data_ptr<int64_t>();
  const float *kp = k.data_ptr<float>(), *vpt = v.data_ptr<float>();
  const int64_t *sp = src.data_ptr<int64_t>(), *vp = dst.data_ptr<int64_t>();
  const Rows Q{q.data_ptr<float>(), sp, vp, D, T};
  const Rows K{k.data_ptr<float>(), sp, vp, D, T};
  const Rows Vr{v.data_ptr<float>(), sp, vp, D, T};
  const int64_t* dp = dst.data_ptr<int64_t>();
  const int32_t* dn = dense.data_ptr<int32_t>();
  const int32_t* rl = real.data_ptr<int32_t>();
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const int d = static_cast<int>(D);

  at::parallel_for(0, BH, 1, [&](int64_t begin, int64_t end) {
    // scores transposed (keys x queries), so that the products broadcast k and v rows
    // as they lie in memory and only the few dense rows are transposed (qT [D, mp]);
    // the softmax runs down the columns, kLanes queries at a time
    std::vector<float> qbuf, qT, obuf, St, mx, sum, corr, kb(kBlock * D), vb(kBlock * D);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / heads, view = hv[bh % heads];
      const int m = dn[b];
      const int64_t n = std::max<int64_t>(rl[b], 1);
      if (m <= 0) continue;
      const int32_t* row_group = gs + (b * V + view) * T;  // the dense rows: slots [0, m)
      const int mp = static_cast<int>(round_up(m)), nv = mp / kLanes;
      qbuf.resize(m * D);
      qT.assign(D * mp, 0.0f);
      obuf.assign(m * D, 0.0f);
      St.resize(kBlock * mp);
      mx.assign(mp, kMasked);
      sum.assign(mp, 0.0f);
      corr.resize(mp);
      Q.gather(bh, 0, m, qbuf.data(), sc);
      for (int i = 0; i < m; ++i) {
        for (int64_t e = 0; e < D; ++e) qT[e * mp + i] = qbuf[i * D + e];
      }
      // the softmax over all real keys does not depend on their order: where they are the
      // example's first tokens (no padding inside), read them in token order straight
      // from k, v (rows base + t * stride), else gather sorted rows
      const int64_t base = tr[3 * bh], stride = tr[3 * bh + 1];
      const bool in_order = tr[3 * bh + 2] != 0;
      for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
        const int kn = static_cast<int>(std::min(kBlock, n - j0));
        const float *kblock = kb.data(), *vblock = vb.data();
        int64_t ld = D;
        if (in_order) {
          kblock = kp + (base + j0 * stride) * D;
          vblock = vpt + (base + j0 * stride) * D;
          ld = stride * D;
        } else {
          K.gather(bh, j0, j0 + kn, kb.data());
          Vr.gather(bh, j0, j0 + kn, vb.data());
        }
        if (in_order && j0 + kBlock < n) {  // the next block's rows (strided: no HW prefetch)
          const int64_t next = std::min(kBlock, n - j0 - kBlock);
          for (int64_t j = 0; j < next; ++j) {
            for (int64_t e = 0; e < D; e += 16) {
              __builtin_prefetch(kblock + (kBlock + j) * ld + e);
              __builtin_prefetch(vblock + (kBlock + j) * ld + e);
            }
          }
        }
        float* S = St.data();
        mm(kn, mp, d, kblock, ld, 1, qT.data(), mp, S, mp, false);
        // MATE's pattern for the table tokens among the dense rows (query rows see every key)
        const int32_t* key_group = in_order ? gt + (b * V + view) * N + j0 : row_group + j0;
        mask_dense_block(S, mp, kn, m, row_group, key_group);
        for (int v0 = 0; v0 < nv; ++v0) {  // online softmax, kLanes query columns at a time
          const int c0 = v0 * kLanes;
          Vec bmax = Vec{} + kMasked;
          for (int j = 0; j < kn; ++j) {
            const Vec x = vload(S + j * mp + c0);
            bmax = bmax > x ? bmax : x;
          }
          const Vec old = vload(&mx[c0]), top = old > bmax ? old : bmax;
          const Vec cr = exp_nonpositive(old - top);
          Vec total{};
          for (int j = 0; j < kn; ++j) {
            const Vec e = exp_nonpositive(vload(S + j * mp + c0) - top);
            vstore(S + j * mp + c0, e);
            total += e;
          }
          vstore(&sum[c0], vload(&sum[c0]) * cr + total);
          vstore(&mx[c0], top);
          vstore(&corr[c0], cr);
        }
        if (drop.on()) {
          for (int j = 0; j < kn; ++j) {
            const int64_t token = in_order ? j0 + j : (sp[bh * T + j0 + j] - base) / stride;
            for (int i = 0; i < m; ++i) S[j * mp + i] *= drop.factor(bh, i, kDenseKey + token);
          }
        }
        for (int i = 0; i < m; ++i) {
          float* orow = obuf.data() + static_cast<int64_t>(i) * D;
          for (int64_t e = 0; e < D; ++e) orow[e] *= corr[i];
        }
        mm(m, d, kn, S, 1, mp, vblock, ld, obuf.data(), D, true);
      }
      for (int i = 0; i < m; ++i) {
        const int64_t row_out = dp[bh * T + i];
        if (row_out < 0) continue;
        store_row(op + row_out * D, obuf.data() + static_cast<int64_t>(i) * D, D, 1.0f / sum[i]);
      }
    }
    store_fence();
  });
}


// dS = P * (dP - delta_i) in place over dP, row by row (rows of w columns, a multiple
// of kLanes, stride ld).
inline void softmax_grad_rows(int64_t rows, int w, int ld, const float* P, float* dP, const float* delta) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* p = P + i * ld;
    float* dp = dP + i * ld;
    const float di = delta[i];
    for (int j = 0; j < w; j += kLanes) vstore(dp + j, vload(p + j) * (vload(dp + j) - di));
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
// The dense rows [0, dense[b]) do the same over the real keys [0, real[b]); the long
// part skips them (their gradient comes from the dense part only, as in the forward).
// Heads own disjoint rows, so tasks never write the same memory.
// Extra inputs: grad_out [rows, D] in its own row layout (grad_src [BH, T]: sorted slot
// -> its row, as src is for q), and out [rows, D], the forward's result in the output
// row layout (dst), read only for rowsum(dO * O) of each row;
// dq, dk, dv [rows, D] in the input row layout (src), every row written.
void bucketed_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& grad_out,
                       const at::Tensor& grad_src, const at::Tensor& out, const at::Tensor& src, const at::Tensor& dst,
                       const at::Tensor& allowed, const at::Tensor& keys, const at::Tensor& free,
                       const at::Tensor& dense, const at::Tensor& head_view, const at::Tensor& real,
                       const at::Tensor& token_rows, const at::Tensor& groups, at::Tensor dq, at::Tensor dk, at::Tensor dv,
                       int64_t radius, double scale, double dropout, int64_t seed) {
  const Dropout drop(dropout, seed);
  check("mate bucketed_backward",
        {&q, &k, &v, &grad_out, &out, &dq, &dk, &dv, &grad_src, &src, &dst, &allowed, &keys, &free, &dense,
         &head_view, &real, &token_rows, &groups}, 8);
  const LongArgs a("mate bucketed_backward", q, k, v, src, dst, allowed, keys, free, head_view, radius);
  const int64_t BH = a.BH, T = a.T, D = a.D, R = a.R, nb = a.nb, H = a.H, V = a.V, AW = a.AW, G = a.G;
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&k, &v, &grad_out, &out, &dq, &dk, &dv}) {
    TORCH_CHECK(t->sizes() == q.sizes(), "mate bucketed_backward: q, k, v, grad_out, out and gradients must have one shape");
  }
  TORCH_CHECK(grad_src.sizes() == src.sizes() && token_rows.numel() == 3 * BH && groups.size(0) == BH / H &&
                  groups.size(1) == V && groups.size(2) == T,
              "mate bucketed_backward: inconsistent shapes");
  const int32_t *dn = dense.data_ptr<int32_t>(), *gs = groups.data_ptr<int32_t>();
  const int64_t* tr = token_rows.data_ptr<int64_t>();
  const int64_t *sp = a.sp, *vp = a.vp;
  const Rows &Q = a.Q, &K = a.K, &Vr = a.Vr;
  const Rows dO{grad_out.data_ptr<float>(), grad_src.data_ptr<int64_t>(), vp, D, T};
  const Rows O{out.data_ptr<float>(), vp, vp, D, T};
  const bool* al = a.al;
  const int32_t *kk = a.kk, *fr = a.fr, *hv = a.hv;
  const int32_t* rl = real.data_ptr<int32_t>();
  float *dqp = dq.data_ptr<float>(), *dkp = dk.data_ptr<float>(), *dvp = dv.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const int d = static_cast<int>(D), r = static_cast<int>(R);

  at::parallel_for(0, BH, 1, [&](int64_t begin, int64_t end) {
    // sorted rows of one head; k, v and their gradients with one bucket of zeros on each
    // side, so that every window (slots [(n-1)R, (n+2)R)) is a plain pointer; k and v
    // also as columns: the global keys once per head (kgT, vgT [D, Gp]) and a chunk's
    // windows per chunk (kwT, vwT [D, ldw], small enough to stay in L2; kLanes spare
    // columns for the padded score columns)
    const int64_t padded = (T + 2 * R) * D, Gp = round_up(G), ldw = (kChunk + 2) * R + kLanes;
    std::vector<float> qs(T * D), go(T * D), dlt(T), orow(D);
    std::vector<float> kp(padded), vpad(padded), dkp_s(padded), dvp_s(padded);
    std::vector<float> kgT(D * Gp), vgT(D * Gp), kwT(D * ldw), vwT(D * ldw);
    const int64_t chunk_rows = kChunk * R, wmax = Layout(static_cast<int>(G), R).width();
    std::vector<float> P(chunk_rows * wmax), dP(chunk_rows * wmax), inv(chunk_rows);
    std::vector<float> dob(chunk_rows * D), dqb(chunk_rows * D);
    std::vector<float> Pd, dPd, qT, goT, dlm;
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, view = hv[bh % H];
      const int fr_all = fr[b], dense_all = dn[b];
      Q.gather(bh, 0, T, qs.data(), sc);
      K.gather(bh, -R, T + R, kp.data());
      Vr.gather(bh, -R, T + R, vpad.data());
      transpose_rows(kp.data() + R * D, G, D, kgT.data(), Gp);
      transpose_rows(vpad.data() + R * D, G, D, vgT.data(), Gp);
      dO.gather(bh, 0, T, go.data());
      for (int64_t s = 0; s < T; ++s) {  // delta = rowsum(dO * O)
        O.gather(bh, s, s + 1, orow.data());
        dlt[s] = hsum(dot_lanes(go.data() + s * D, orow.data(), D));
      }
      std::fill(dkp_s.begin(), dkp_s.end(), 0.0f);
      std::fill(dvp_s.begin(), dvp_s.end(), 0.0f);
      const float* kg = kp.data() + R * D;  // slot 0
      const float* vg = vpad.data() + R * D;
      float* dkg = dkp_s.data() + R * D;
      float* dvg = dvp_s.data() + R * D;

      for (int64_t n0 = 0; n0 < nb; n0 += kChunk) {  // the forward's chunks
        const int64_t n1 = std::min(n0 + kChunk, nb), c = n1 - n0, s0 = n0 * R, rows = c * R;
        if (n1 * R <= dense_all || vp[bh * T + s0] < 0) continue;  // all dense rows, or all padding slots
        const Layout L(chunk_keys(kk, bh, nb, n0, n1), R);
        const int g = L.g, gp = L.gp, width = L.width(), fr_b = std::min<int>(fr_all, g);
        const int m = static_cast<int>(rows);
        float* Pc = P.data();
        // the chunk's windows: slots [s0 - R, s0 + (c + 1) R), rows s0 .. of kp and vpad;
        // bucket n0 + j's window from column j R
        transpose_rows(kp.data() + s0 * D, (c + 2) * R, D, kwT.data(), ldw);
        transpose_rows(vpad.data() + s0 * D, (c + 2) * R, D, vwT.data(), ldw);
        chunk_numerators(R, c, L, d, G, AW, fr_b, qs.data() + s0 * D, kgT.data(), Gp, kwT.data(), ldw,
                         al + ((b * V + view) * T + s0) * AW, Pc, inv.data());
        // Pc holds the numerators E (P = E / sum). Rather than normalising them, each
        // row's dO is scaled by its 1 / sum: with dO' = dO / sum, dP' = dO' V^T = dP / sum,
        // dS = P * (dP M - delta) = E * (dP' M - delta / sum) and dV += (P M)^T dO =
        // (E M)^T dO'. Rows the long part does not answer (dense rows) get dO = 0.
        for (int64_t i = 0; i < rows; ++i) {
          float* row = dob.data() + i * D;
          if (s0 + i >= dense_all) {
            copy_scaled(row, go.data() + (s0 + i) * D, D, inv[i]);
            inv[i] *= dlt[s0 + i];  // reused as the rows' delta / sum
          } else {
            std::memset(row, 0, sizeof(float) * D);
            inv[i] = 0.0f;
          }
        }
        float* dPc = dP.data();
        // dP' = dO' [Vg ; Vw]^T over the padded columns too (finite there, and E = 0): the
        // global part for the whole chunk at once, windows per bucket
        mm(m, gp, d, dob.data(), D, 1, vgT.data(), Gp, dPc, width, false);
        for (int64_t j = 0; j < c; ++j) {
          mm(r, L.wp, d, dob.data() + j * R * D, D, 1, vwT.data() + j * R, ldw, dPc + j * R * width + gp, width, false);
        }
        // dS = E * (dP' M - delta / sum) in place over dP, and E becomes E M (M: the
        // dropout factors, the forward's mask; none without dropout). Padded columns: E = 0, so dS = 0.
        if (drop.on()) {
          for (int64_t i = 0; i < rows; ++i) {
            float *p = Pc + i * width, *dp = dPc + i * width;
            for (int j = 0; j < width; ++j) {
              const float f = j < gp ? drop.factor(bh, s0 + i, j) : drop.factor(bh, s0 + i, kWindowKey + (j - gp));
              dp[j] = p[j] * (dp[j] * f - inv[i]);
              p[j] *= f;
            }
          }
        } else {
          softmax_grad_rows(rows, width, width, Pc, dPc, inv.data());
        }
        // dV += (E M)^T dO'
        mm(g, d, m, Pc, 1, width, dob.data(), D, dvg, D, true);
        for (int64_t j = 0; j < c; ++j) {
          const int64_t sj = s0 + j * R;
          mm(L.w3, d, r, Pc + j * R * width + gp, 1, width, dob.data() + j * R * D, D, dvp_s.data() + sj * D, D, true);
        }
        // dQ = dS [Kg ; Kw] and dK += dS^T Q (q pre-scaled)
        mm(m, d, g, dPc, width, 1, kg, D, dqb.data(), D, false);
        mm(g, d, m, dPc, 1, width, qs.data() + s0 * D, D, dkg, D, true);
        for (int64_t j = 0; j < c; ++j) {
          const int64_t sj = s0 + j * R;
          const float* dsj = dPc + j * R * width + gp;
          mm(r, d, L.w3, dsj, width, 1, kp.data() + sj * D, D, dqb.data() + j * R * D, D, true);
          mm(L.w3, d, r, dsj, 1, width, qs.data() + sj * D, D, dkp_s.data() + sj * D, D, true);
        }
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t slot = s0 + i;
          if (slot < dense_all || vp[bh * T + slot] < 0) continue;
          store_row(dqp + sp[bh * T + slot] * D, dqb.data() + i * D, D, sc);
        }
      }

      if (dense_all > 0) {  // dense rows over the real keys, transposed as in dense_forward: [keys, mp]
        const int m = dense_all, mp = static_cast<int>(round_up(m)), nk = static_cast<int>(std::max<int64_t>(rl[b], 1));
        Pd.resize(static_cast<size_t>(nk) * mp);
        dPd.resize(static_cast<size_t>(kBlock) * mp);
        qT.assign(D * mp, 0.0f);
        goT.assign(D * mp, 0.0f);
        dlm.assign(mp, 0.0f);
        for (int i = 0; i < m; ++i) {
          for (int64_t e = 0; e < D; ++e) {
            qT[e * mp + i] = qs[i * D + e];
            goT[e * mp + i] = go[i * D + e];
          }
          dlm[i] = dlt[i];
        }
        // the softmax's statistics over all keys first: scores and their column maxima,
        // then the numerators and their sums
        float* Pt = Pd.data();
        mm(nk, mp, d, kg, D, 1, qT.data(), mp, Pt, mp, false);
        const int32_t* slot_group = gs + (b * V + view) * T;  // keys in sorted order here
        mask_dense_block(Pt, mp, nk, m, slot_group, slot_group);
        std::vector<Vec> top(mp / kLanes, Vec{} + kMasked), total(mp / kLanes, Vec{});
        for (int j = 0; j < nk; ++j) {
          for (int v0 = 0; v0 < mp / kLanes; ++v0) {
            const Vec x = vload(Pt + static_cast<int64_t>(j) * mp + v0 * kLanes);
            top[v0] = top[v0] > x ? top[v0] : x;
          }
        }
        for (int j = 0; j < nk; ++j) {
          for (int v0 = 0; v0 < mp / kLanes; ++v0) {
            float* x = Pt + static_cast<int64_t>(j) * mp + v0 * kLanes;
            const Vec e = exp_nonpositive(vload(x) - top[v0]);
            vstore(x, e);
            total[v0] += e;
          }
        }
        for (auto& t : total) t = 1.0f / t;
        // then key block by key block (the block's P and dP stay in L2): P, dP = dO V^T,
        // dS = P (dP M - delta), dV += (P M)^T dO, dQ += dS K, dK += dS^T Q
        const int64_t base = tr[3 * bh], stride = tr[3 * bh + 1];
        if (dqb.size() < static_cast<size_t>(m) * D) dqb.resize(static_cast<size_t>(m) * D);
        for (int j0 = 0; j0 < nk; j0 += kBlock) {
          const int kn = static_cast<int>(std::min<int64_t>(kBlock, nk - j0));
          float *Pb = Pt + static_cast<int64_t>(j0) * mp, *dPb = dPd.data();
          mm(kn, mp, d, vg + static_cast<int64_t>(j0) * D, D, 1, goT.data(), mp, dPb, mp, false);
          for (int j = 0; j < kn; ++j) {
            float *p = Pb + static_cast<int64_t>(j) * mp, *dp = dPb + static_cast<int64_t>(j) * mp;
            for (int v0 = 0; v0 < mp / kLanes; ++v0) {
              const int c0 = v0 * kLanes;
              vstore(p + c0, vload(p + c0) * total[v0]);
            }
            if (drop.on()) {  // as in the long part; keys by their token position
              const uint64_t key = kDenseKey + (sp[bh * T + j0 + j] - base) / stride;
              for (int i = 0; i < m; ++i) {
                const float f = drop.factor(bh, i, key);
                dp[i] = p[i] * (dp[i] * f - dlm[i]);
                p[i] *= f;
              }
            } else {
              for (int c0 = 0; c0 < mp; c0 += kLanes) vstore(dp + c0, vload(p + c0) * (vload(dp + c0) - vload(&dlm[c0])));
            }
          }
          mm(kn, d, m, Pb, mp, 1, go.data(), D, dvg + static_cast<int64_t>(j0) * D, D, true);
          mm(m, d, kn, dPb, 1, mp, kg + static_cast<int64_t>(j0) * D, D, dqb.data(), D, j0 > 0);
          mm(kn, d, m, dPb, mp, 1, qs.data(), D, dkg + static_cast<int64_t>(j0) * D, D, true);
        }
        for (int i = 0; i < m; ++i) {
          if (vp[bh * T + i] < 0) continue;
          store_row(dqp + sp[bh * T + i] * D, dqb.data() + static_cast<int64_t>(i) * D, D, sc);
        }
      }
      for (int64_t s = 0; s < T; ++s) {  // every row of this head: one slot < N
        if (vp[bh * T + s] < 0) continue;
        const int64_t row = sp[bh * T + s];
        store_row(dkp + row * D, dkg + s * D, D, 1.0f);
        store_row(dvp + row * D, dvg + s * D, D, 1.0f);
      }
    }
    store_fence();
  });
}

}  // namespace

// Registered for the CPU key (not as a catch-all), so torch dispatch modes such as
// FlopCounterMode see the call.
// Lanes of the vector code this build runs (16: AVX-512, 8: AVX2/AVX, 4: SSE/NEON).
int64_t vector_lanes() { return kLanes; }

TORCH_LIBRARY(mate_cpu, m) {
  m.def("vector_lanes() -> int", &vector_lanes);
  m.def(
      "bucketed_forward(Tensor q, Tensor k, Tensor v, Tensor src, Tensor dst, Tensor allowed, Tensor keys, "
      "Tensor free, Tensor dense, Tensor head_view, Tensor(a!) out, int radius, float scale, float dropout, "
      "int seed) -> ()");
  m.def(
      "dense_forward(Tensor q, Tensor k, Tensor v, Tensor src, Tensor dst, Tensor dense, Tensor real, "
      "Tensor token_rows, Tensor head_view, Tensor groups, Tensor token_groups, Tensor(a!) out, float scale, "
      "float dropout, int seed) -> ()");
  m.def(
      "bucketed_backward(Tensor q, Tensor k, Tensor v, Tensor grad_out, Tensor grad_src, Tensor out, Tensor src, "
      "Tensor dst, Tensor allowed, Tensor keys, Tensor free, Tensor dense, Tensor head_view, Tensor real, "
      "Tensor token_rows, Tensor groups, Tensor(a!) dq, Tensor(b!) dk, Tensor(c!) dv, int radius, float scale, "
      "float dropout, int seed) -> ()");
}

TORCH_LIBRARY_IMPL(mate_cpu, CPU, m) {
  m.impl("bucketed_forward", &bucketed_forward);
  m.impl("dense_forward", &dense_forward);
  m.impl("bucketed_backward", &bucketed_backward);
}
