// MATE bucketed attention, long rows, forward: one fused CPU pass per bucket.
//
// The Python path (mate_bucketed.py) computes the same function chunk by chunk with
// torch ops: scores to [globals ; window] in one buffer, mask bias, softmax, two
// context GEMMs. Each of those is a full pass over a multi-MB chunk. Here every
// bucket of R sorted rows is done start to finish while its R x (g + 3R) scores sit
// in L1/L2: gather and scale its queries, two GEMMs (BLAS sgemm, ldc = g + 3R, so
// the window scores land next to the global ones with no copy), mask + exp + row
// sums in one loop, two GEMMs for the context written straight into the sorted
// output, one row rescale. Buckets are independent: at::parallel_for over them.
//
// Inputs (all contiguous, float32 on CPU; built and cached by BucketPlan):
//   q        [rows, D]            unsorted queries, flat (any row layout)
//   q_index  [BH, T] int64        sorted slot -> row of q (slots >= N: any valid row)
//   kv       [2, R + BH*T + R, D] sorted keys / values, bucket-aligned, zero margins
//   allowed  [B, V, T, G + 3R] bool  MATE's pattern per sorted row: [globals ; window]
//   keys     [BH * nb] int32      global keys bucket f reads (keys beyond: masked for all its rows)
//   free     [B] int32            leading global keys every row may attend (the query set)
//   head_view[H] int32            view (row/column) of each head
//   out      [BH, T, D]           context in sorted order (written; slots >= N are garbage)
// Softmax of a fully masked row is uniform over its keys (padding rows only).

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
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

void bucketed_forward(const at::Tensor& q, const at::Tensor& q_index, const at::Tensor& kv, const at::Tensor& allowed,
                      const at::Tensor& keys, const at::Tensor& free, const at::Tensor& head_view, at::Tensor out,
                      int64_t radius, double scale) {
  TORCH_CHECK(q.is_contiguous() && q_index.is_contiguous() && kv.is_contiguous() && allowed.is_contiguous() &&
                  keys.is_contiguous() && free.is_contiguous() && head_view.is_contiguous() && out.is_contiguous(),
              "mate bucketed_forward: inputs must be contiguous");
  TORCH_CHECK(q.scalar_type() == at::kFloat && kv.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat,
              "mate bucketed_forward: float32 only");
  const int64_t BH = out.size(0), T = out.size(1), D = out.size(2);
  const int64_t R = radius, nb = T / R, H = head_view.size(0);
  const int64_t B = allowed.size(0), V = allowed.size(1), AW = allowed.size(3), G = AW - 3 * R;
  TORCH_CHECK(nb * R == T && BH == B * H && kv.size(1) == R + BH * T + R && allowed.size(2) == T,
              "mate bucketed_forward: inconsistent shapes");

  const float* qp = q.data_ptr<float>();
  const int64_t* qi = q_index.data_ptr<int64_t>();
  const float* kp = kv.data_ptr<float>();
  const float* vp = kp + kv.size(1) * D;
  const bool* al = allowed.data_ptr<bool>();
  const int32_t* kk = keys.data_ptr<int32_t>();
  const int32_t* fr = free.data_ptr<int32_t>();
  const int32_t* hv = head_view.data_ptr<int32_t>();
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const int r = static_cast<int>(R), d = static_cast<int>(D), w3 = static_cast<int>(3 * R);

  at::parallel_for(0, BH * nb, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qbuf(R * D), sbuf(R * (G + 3 * R)), inv(R);
    for (int64_t f = begin; f < end; ++f) {
      const int64_t bh = f / nb, n = f % nb, b = bh / H, v = hv[bh % H];
      const int g = kk[f], width = g + w3, fr_b = std::min<int>(fr[b], g);
      float* S = sbuf.data();
      // queries of the bucket, scaled
      for (int64_t i = 0; i < R; ++i) {
        const float* src = qp + qi[bh * T + n * R + i] * D;
        float* dst = qbuf.data() + i * D;
        for (int64_t e = 0; e < D; ++e) dst[e] = src[e] * sc;
      }
      const float* k_global = kp + (R + bh * T) * D;  // sorted rows [0, g) of this head
      const float* v_global = vp + (R + bh * T) * D;
      const float* k_window = kp + f * R * D;  // rows [f R, f R + 3R): previous, own, next bucket
      const float* v_window = vp + f * R * D;
      gemm_nt(r, g, d, qbuf.data(), d, k_global, d, 0.0f, S, width);
      gemm_nt(r, w3, d, qbuf.data(), d, k_window, d, 0.0f, S + g, width);
      for (int64_t i = 0; i < R; ++i) {
        float* row = S + i * width;
        const bool* a = al + ((b * V + v) * T + n * R + i) * AW;
        // mask + row max; the mask as arithmetic (x + (1 - allowed) * kMasked, which is
        // kMasked for a masked key) so the loops vectorise instead of branching
        float mx = kMasked;
        for (int j = 0; j < fr_b; ++j) mx = std::max(mx, row[j]);  // the query set: never masked
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
        float sum = 0.0f;
        for (int j = 0; j < width; ++j) {
          const float e = exp_nonpositive(row[j] - mx);
          row[j] = e;
          sum += e;
        }
        inv[i] = 1.0f / sum;
      }
      float* o = op + (bh * T + n * R) * D;
      gemm_nn(r, d, g, S, width, v_global, d, 0.0f, o, d);
      gemm_nn(r, d, w3, S + g, width, v_window, d, 1.0f, o, d);
      for (int64_t i = 0; i < R; ++i) {
        const float s = inv[i];
        float* orow = o + i * D;
        for (int64_t e = 0; e < D; ++e) orow[e] *= s;
      }
    }
  });
}

}  // namespace

// Registered for the CPU key (not as a catch-all), so torch dispatch modes such as
// FlopCounterMode see the call.
TORCH_LIBRARY(mate_cpu, m) {
  m.def(
      "bucketed_forward(Tensor q, Tensor q_index, Tensor kv, Tensor allowed, Tensor keys, Tensor free, "
      "Tensor head_view, Tensor(a!) out, int radius, float scale) -> ()");
}

TORCH_LIBRARY_IMPL(mate_cpu, CPU, m) { m.impl("bucketed_forward", &bucketed_forward); }
