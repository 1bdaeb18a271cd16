#include "engine/ops.hpp"

#include <algorithm>
#include <cmath>

#include "common/assert.hpp"
#include "engine/det_math.hpp"

namespace exa::engine {

void rms_norm(const float* x, const float* w, std::size_t n, float eps, float* out) noexcept {
  double sum = 0.0;
  for (std::size_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (std::size_t i = 0; i < n; ++i) out[i] = (x[i] * scale) * w[i];
}

namespace {

// M rows' sums side by side, M a compile-time count so that the sums can
// stay in registers. Scalar on purpose: GCC's SLP vectorizer packed the 8
// chains into SSE2 pairs with shuffles around every step, slower than 8
// scalar chains (perf, a q8_0 batch-32 step: 3.0 % against 2.5 %; one row at
// a time 3.6 %).
template <std::size_t M>
[[gnu::optimize("no-tree-slp-vectorize")]] void rms_norm_side(const float* x, std::size_t x_stride, const float* w,
                                                              std::size_t n, float eps, float* out,
                                                              std::size_t out_stride) noexcept {
  double sum[M] = {};
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t r = 0; r < M; ++r) {
      const float v = x[r * x_stride + i];
      sum[r] += static_cast<double>(v * v);
    }
  for (std::size_t r = 0; r < M; ++r) {
    const float mean = static_cast<float>(sum[r] / static_cast<double>(n));
    const float scale = 1.0f / std::sqrt(mean + eps);
    const float* xr = x + r * x_stride;
    float* o = out + r * out_stride;
    for (std::size_t i = 0; i < n; ++i) o[i] = (xr[i] * scale) * w[i];
  }
}

template <std::size_t M>
void rms_norm_rest(std::size_t m, const float* x, std::size_t x_stride, const float* w, std::size_t n, float eps,
                   float* out, std::size_t out_stride) noexcept {
  if constexpr (M > 0) {
    if (m == M) return rms_norm_side<M>(x, x_stride, w, n, eps, out, out_stride);
    rms_norm_rest<M - 1>(m, x, x_stride, w, n, eps, out, out_stride);
  }
}

}  // namespace

void rms_norm_rows(const float* x, std::size_t x_stride, const float* w, std::size_t n, float eps, float* out,
                   std::size_t out_stride, std::size_t rows) noexcept {
  constexpr std::size_t side = 8;
  std::size_t r = 0;
  for (; r + side <= rows; r += side)
    rms_norm_side<side>(x + r * x_stride, x_stride, w, n, eps, out + r * out_stride, out_stride);
  rms_norm_rest<side - 1>(rows - r, x + r * x_stride, x_stride, w, n, eps, out + r * out_stride, out_stride);
}

void rope_table(std::uint32_t pos, const rope_params& p, float* cos_t, float* sin_t) noexcept {
  // Our own pow, sin, cos and exp (det_math.hpp): libm's differ by CPU.
  const auto theta_scale = static_cast<float>(
      det::pow(static_cast<double>(p.freq_base), static_cast<double>(-2.0f / static_cast<float>(p.rope_dim))));
  const std::size_t pairs = p.rope_dim / 2;
  float theta = static_cast<float>(pos);
  for (std::size_t i = 0; i < pairs; ++i) {
    // ggml divides by the factor, then scales: with neither, the angle is
    // theta itself (x / 1 and 1 * x are exact).
    const float factor = p.freq_factors != nullptr ? p.freq_factors[i] : 1.0f;
    const float angle = p.freq_scale * (theta / factor);
    double s, c;
    det::sincos(static_cast<double>(angle), s, c);
    cos_t[i] = static_cast<float>(c);
    sin_t[i] = static_cast<float>(s);
    theta *= theta_scale;
  }
}

void rope_rotate(float* x, std::size_t n_heads, std::size_t head_dim, const float* cos_t, const float* sin_t,
                 const rope_params& p) noexcept {
  EXA_ASSERT(p.rope_dim <= head_dim);
  const std::size_t pairs = p.rope_dim / 2;
  // Element strides of a pair's two members, and between successive pairs.
  const std::size_t partner = p.halves ? pairs : 1;
  const std::size_t step = p.halves ? 1 : 2;
  for (std::size_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    for (std::size_t i = 0; i < pairs; ++i) {
      float* a = v + i * step;
      const float x0 = a[0], x1 = a[partner];
      a[0] = x0 * cos_t[i] - x1 * sin_t[i];
      a[partner] = x0 * sin_t[i] + x1 * cos_t[i];
    }
  }
}

void rope(float* x, std::size_t n_heads, std::size_t head_dim, std::uint32_t pos,
          const rope_params& p) noexcept {
  // The angles are the same for every head: compute them once.
  float cos_t[512], sin_t[512];
  EXA_ASSERT_MSG(p.rope_dim / 2 <= 512, "rope_dim above 1024 (config validation bounds it)");
  rope_table(pos, p, cos_t, sin_t);
  rope_rotate(x, n_heads, head_dim, cos_t, sin_t, p);
}

void silu_mul(float* g, const float* u, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) g[i] = g[i] / (1.0f + det::expf(-g[i])) * u[i];
}

void softmax(float* x, std::size_t n) noexcept {
  float mx = -INFINITY;
  for (std::size_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  for (std::size_t i = 0; i < n; ++i) x[i] = det::expf(x[i] - mx);
  // The sum's order (ops.hpp): 8 lanes, the tree, the rest.
  double lane[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (std::size_t l = 0; l < 8; ++l) lane[l] += x[i + l];
  for (std::size_t l = 0; l < 4; ++l) lane[l] += lane[l + 4];
  for (std::size_t l = 0; l < 2; ++l) lane[l] += lane[l + 2];
  double sum = lane[0] + lane[1];
  for (; i < n; ++i) sum += x[i];
  const float inv = static_cast<float>(1.0 / sum);
  for (std::size_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace exa::engine
