#include "model/kquants.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "common/assert.hpp"
#include "model/half.hpp"
#include "model/quantize.hpp"

namespace exa::model {

namespace {

// ggml treats a group whose largest magnitude is below this as all zeros.
constexpr float group_max_eps = 1e-15f;

// Round half to even, as ggml's nearest_int (a magic-number add) does for the
// magnitudes it is used on (|v| < 2^22).
int nearest_int(float v) noexcept { return static_cast<int>(std::nearbyintf(v)); }

// Fits x ≈ scale·L + min (min <= 0, L in [0, nmax]) minimising the weighted
// squared error: start from the min/max grid, then try nstep + 1 grids of
// slightly different resolution, each refined by weighted least squares, and
// keep the best. This is ggml's make_qkx2_quants with use_mad = false.
// Returns the scale; *neg_min receives −min.
float fit_scale_min(int n, int nmax, const float* x, const float* w, std::uint8_t* L, float* neg_min,
                    float rmin, float rdelta, int nstep) noexcept {
  float min = x[0];
  float max = x[0];
  float sum_w = w[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(L, L + n, 0);
    *neg_min = -min;
    return 0.0f;
  }
  float iscale = static_cast<float>(nmax) / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<std::uint8_t>(std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax));
    const float diff = scale * L[i] + min - x[i];
    best_error += w[i] * diff * diff;
  }
  std::uint8_t aux[32];
  EXA_ASSERT(n <= 32);
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
      aux[i] = static_cast<std::uint8_t>(l);
      sum_l += w[i] * static_cast<float>(l);
      sum_l2 += w[i] * static_cast<float>(l * l);
      sum_xl += w[i] * static_cast<float>(l) * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (!(D > 0)) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
    if (this_min > 0) {
      this_min = 0;
      this_scale = sum_xl / sum_l2;
    }
    float error = 0;
    for (int i = 0; i < n; ++i) {
      const float diff = this_scale * aux[i] + this_min - x[i];
      error += w[i] * diff * diff;
    }
    if (error < best_error) {
      std::copy(aux, aux + n, L);
      best_error = error;
      scale = this_scale;
      min = this_min;
    }
  }
  *neg_min = -min;
  return scale;
}

// Symmetric fit x ≈ scale·(L − nmax), L in [0, 2·nmax), weighting each element
// by x² and trying 19 grid resolutions around nmax / max: ggml's
// make_qx_quants with rmse_type = 1 and no importance weights.
float fit_scale_symmetric(int n, int nmax, const float* x, std::int8_t* L) noexcept {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax < group_max_eps) {
    std::fill(L, L + n, 0);
    return 0.0f;
  }
  const auto quantize = [&](float iscale, int i) { return std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1); };
  float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = quantize(iscale, i);
    L[i] = static_cast<std::int8_t>(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * static_cast<float>(l);
    suml2 += w * static_cast<float>(l * l);
  }
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = quantize(iscale, i);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * static_cast<float>(l);
      suml2 += w * static_cast<float>(l * l);
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = static_cast<std::int8_t>(nmax + quantize(iscale, i));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Stores sub-block j's 6-bit scale and min into the packed 12-byte layout
// that scale_min_k4 reads. `scales` must start zeroed.
void pack_scale_min_k4(int j, std::uint8_t ls, std::uint8_t lm, std::uint8_t* scales) noexcept {
  if (j < 4) {
    scales[j] = ls;
    scales[j + 4] = lm;
  } else {
    scales[j + 4] = static_cast<std::uint8_t>((ls & 0x0f) | ((lm & 0x0f) << 4));
    scales[j - 4] |= static_cast<std::uint8_t>((ls >> 4) << 6);
    scales[j] |= static_cast<std::uint8_t>((lm >> 4) << 6);
  }
}

// The shared part of Q4_K and Q5_K: per sub-block of 32 a (scale, min) fit,
// both quantized to 6 bits against the block's largest, then every element
// re-quantized against the rounded scales. Fills d, dmin, scales and L (the
// per-element levels in [0, nmax]).
void quantize_superblock_scale_min(const float* x, int nmax, float rmin, int nstep, std::uint16_t& d,
                                   std::uint16_t& dmin, std::uint8_t* scales, std::uint8_t* L) noexcept {
  float sub_scales[qk_k / 32];
  float sub_mins[qk_k / 32];
  float weights[32];
  float max_scale = 0;  // scales are positive: the min is subtracted first
  float max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    sub_scales[j] = fit_scale_min(32, nmax, xs, weights, L + 32 * j, &sub_mins[j], rmin, 0.1f, nstep);
    max_scale = std::max(max_scale, sub_scales[j]);
    max_min = std::max(max_min, sub_mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  std::memset(scales, 0, k_scale_size);
  for (int j = 0; j < 8; ++j) {
    const auto ls = static_cast<std::uint8_t>(std::min(63, nearest_int(inv_scale * sub_scales[j])));
    const auto lm = static_cast<std::uint8_t>(std::min(63, nearest_int(inv_min * sub_mins[j])));
    pack_scale_min_k4(j, ls, lm, scales);
  }
  d = float_to_f16(max_scale / 63.0f);
  dmin = float_to_f16(max_min / 63.0f);
  for (int j = 0; j < 8; ++j) {
    std::uint8_t sc, m;
    scale_min_k4(j, scales, sc, m);
    const float dl = f16_to_float(d) * sc;
    if (dl == 0) continue;
    const float ml = f16_to_float(dmin) * m;
    for (int i = 0; i < 32; ++i) {
      L[32 * j + i] = static_cast<std::uint8_t>(std::clamp(nearest_int((x[32 * j + i] + ml) / dl), 0, nmax));
    }
  }
}

}  // namespace

void quantize_row_q4_K(const float* x, block_q4_K* y, std::size_t n) noexcept {
  EXA_ASSERT(n % qk_k == 0);
  for (std::size_t b = 0; b < n / qk_k; ++b, x += qk_k) {
    std::uint8_t L[qk_k];
    quantize_superblock_scale_min(x, 15, -1.0f, 20, y[b].d, y[b].dmin, y[b].scales, L);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l)
        y[b].qs[32 * c + l] = static_cast<std::uint8_t>(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
  }
}

void quantize_row_q5_K(const float* x, block_q5_K* y, std::size_t n) noexcept {
  EXA_ASSERT(n % qk_k == 0);
  for (std::size_t b = 0; b < n / qk_k; ++b, x += qk_k) {
    std::uint8_t L[qk_k];
    quantize_superblock_scale_min(x, 31, -0.5f, 15, y[b].d, y[b].dmin, y[b].scales, L);
    std::memset(y[b].qh, 0, sizeof y[b].qh);
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        const int lo = L[64 * c + l];
        const int hi = L[64 * c + 32 + l];
        y[b].qs[32 * c + l] = static_cast<std::uint8_t>((lo & 0x0f) | ((hi & 0x0f) << 4));
        y[b].qh[l] |= static_cast<std::uint8_t>(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
      }
    }
  }
}

void quantize_row_q6_K(const float* x, block_q6_K* y, std::size_t n) noexcept {
  EXA_ASSERT(n % qk_k == 0);
  for (std::size_t b = 0; b < n / qk_k; ++b, x += qk_k) {
    std::int8_t L[qk_k];
    float scales[qk_k / 16];
    float max_scale = 0;
    float max_abs_scale = 0;
    for (int g = 0; g < 16; ++g) {
      scales[g] = fit_scale_symmetric(16, 32, x + 16 * g, L + 16 * g);
      if (std::fabs(scales[g]) > max_abs_scale) {
        max_abs_scale = std::fabs(scales[g]);
        max_scale = scales[g];
      }
    }
    block_q6_K& out = y[b];
    if (max_abs_scale < group_max_eps) {
      std::memset(&out, 0, sizeof out);
      continue;
    }
    // The sub-block scale of largest magnitude maps to −128, so the signed
    // 8-bit scales use their whole range.
    const float iscale = -128.0f / max_scale;
    out.d = float_to_f16(1 / iscale);
    for (int g = 0; g < 16; ++g) out.scales[g] = static_cast<std::int8_t>(std::min(127, nearest_int(iscale * scales[g])));
    for (int g = 0; g < 16; ++g) {
      const float d = f16_to_float(out.d) * out.scales[g];
      if (d == 0) continue;
      for (int i = 0; i < 16; ++i) {
        L[16 * g + i] = static_cast<std::int8_t>(std::clamp(nearest_int(x[16 * g + i] / d), -32, 31) + 32);
      }
    }
    for (int h = 0; h < 2; ++h) {
      const std::int8_t* Lh = L + 128 * h;
      std::uint8_t* ql = out.ql + 64 * h;
      std::uint8_t* qh = out.qh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<std::uint8_t>((Lh[l] & 0x0f) | ((Lh[l + 64] & 0x0f) << 4));
        ql[l + 32] = static_cast<std::uint8_t>((Lh[l + 32] & 0x0f) | ((Lh[l + 96] & 0x0f) << 4));
        qh[l] = static_cast<std::uint8_t>((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) |
                                          ((Lh[l + 96] >> 4) << 6));
      }
    }
  }
}

void quantize_row_q8_K(const float* x, block_q8_K* y, std::size_t n) noexcept {
  EXA_ASSERT(n % qk_k == 0);
  for (std::size_t b = 0; b < n / qk_k; ++b, x += qk_k) {
    if (abs_max_bits(x, qk_k) >= f32_inf_bits) {  // as q8_0: a NaN through every product
      std::memset(&y[b], 0, sizeof y[b]);
      y[b].d = std::bit_cast<float>(f32_default_nan_bits);  // as q8_nonfinite_scale
      continue;
    }
    float max = 0;
    float amax = 0;
    for (std::size_t j = 0; j < qk_k; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    if (amax == 0) {
      std::memset(&y[b], 0, sizeof y[b]);
      continue;
    }
    const float iscale = -127.0f / max;
    for (std::size_t j = 0; j < qk_k; ++j) y[b].qs[j] = static_cast<std::int8_t>(std::min(127, nearest_int(iscale * x[j])));
    for (std::size_t g = 0; g < qk_k / 16; ++g) {
      int sum = 0;
      for (std::size_t i = 0; i < 16; ++i) sum += y[b].qs[16 * g + i];
      y[b].bsums[g] = static_cast<std::int16_t>(sum);
    }
    y[b].d = 1 / iscale;
  }
}

void dequantize_row_q4_K(const block_q4_K* x, float* y, std::size_t n) noexcept {
  EXA_ASSERT(n % qk_k == 0);
  for (std::size_t b = 0; b < n / qk_k; ++b) {
    const float d = f16_to_float(x[b].d);
    const float dmin = f16_to_float(x[b].dmin);
    for (int c = 0; c < 4; ++c) {
      std::uint8_t sc, m;
      scale_min_k4(2 * c, x[b].scales, sc, m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(2 * c + 1, x[b].scales, sc, m);
      const float d2 = d * sc, m2 = dmin * m;
      const std::uint8_t* q = x[b].qs + 32 * c;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0f) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void dequantize_row_q5_K(const block_q5_K* x, float* y, std::size_t n) noexcept {
  EXA_ASSERT(n % qk_k == 0);
  for (std::size_t b = 0; b < n / qk_k; ++b) {
    const float d = f16_to_float(x[b].d);
    const float dmin = f16_to_float(x[b].dmin);
    for (int c = 0; c < 4; ++c) {
      std::uint8_t sc, m;
      scale_min_k4(2 * c, x[b].scales, sc, m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(2 * c + 1, x[b].scales, sc, m);
      const float d2 = d * sc, m2 = dmin * m;
      const std::uint8_t* q = x[b].qs + 32 * c;
      const std::uint8_t* qh = x[b].qh;
      for (int l = 0; l < 32; ++l) {
        const int v = (q[l] & 0x0f) | (((qh[l] >> (2 * c)) & 1) << 4);
        *y++ = d1 * static_cast<float>(v) - m1;
      }
      for (int l = 0; l < 32; ++l) {
        const int v = (q[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
        *y++ = d2 * static_cast<float>(v) - m2;
      }
    }
  }
}

void dequantize_row_q6_K(const block_q6_K* x, float* y, std::size_t n) noexcept {
  EXA_ASSERT(n % qk_k == 0);
  for (std::size_t b = 0; b < n / qk_k; ++b, y += qk_k) {
    const float d = f16_to_float(x[b].d);
    for (int h = 0; h < 2; ++h) {
      const std::uint8_t* ql = x[b].ql + 64 * h;
      const std::uint8_t* qh = x[b].qh + 32 * h;
      const std::int8_t* sc = x[b].scales + 8 * h;
      float* yh = y + 128 * h;
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        yh[l] = d * sc[is] * static_cast<float>(q1);
        yh[l + 32] = d * sc[is + 2] * static_cast<float>(q2);
        yh[l + 64] = d * sc[is + 4] * static_cast<float>(q3);
        yh[l + 96] = d * sc[is + 6] * static_cast<float>(q4);
      }
    }
  }
}

void dequantize_row_q8_K(const block_q8_K* x, float* y, std::size_t n) noexcept {
  EXA_ASSERT(n % qk_k == 0);
  for (std::size_t b = 0; b < n / qk_k; ++b)
    for (std::size_t j = 0; j < qk_k; ++j) *y++ = x[b].d * x[b].qs[j];
}

}  // namespace exa::model
