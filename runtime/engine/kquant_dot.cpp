#include "engine/kquant_dot.hpp"

#include "common/assert.hpp"
#include "engine/simd.hpp"
#include "model/half.hpp"

namespace exa::engine::kquant {

namespace {

using model::block_q4_K;
using model::block_q5_K;
using model::block_q6_K;
using model::block_q8_K;

// Integer results of one super-block: sum_q = Σ_sub scale·Σ q·x, and for
// Q4_K/Q5_K sum_m = Σ_sub min·Σ x (from bsums). Both exact in int32: at most
// 63·31·127·256 ≈ 6.4e7 for Q5_K and 127·63·127·256 ≈ 2.6e8 for Q6_K.
struct block_sums {
  std::int32_t sum_q = 0;
  std::int32_t sum_m = 0;
};

// The float step, shared by every path so that all of them round alike.
inline float scale_min_step(float s, block_sums b, float d_w, float dmin_w, float d_x) noexcept {
  s = simd::fma1(static_cast<float>(b.sum_q), d_w * d_x, s);
  return simd::fma1(static_cast<float>(-b.sum_m), dmin_w * d_x, s);
}

inline float scale_step(float s, std::int32_t sum_q, float d_w, float d_x) noexcept {
  return simd::fma1(static_cast<float>(sum_q), d_w * d_x, s);
}

// Σ_sub m_sub · (bsum of its 32 elements): the part of Q4_K/Q5_K's dot
// product the mins contribute, shared by all paths (integers, 8 terms).
std::int32_t mins_sum(const std::uint8_t* scales, const block_q8_K& x) noexcept {
  std::int32_t sum = 0;
  for (int j = 0; j < 8; ++j) {
    std::uint8_t sc, m;
    model::scale_min_k4(j, scales, sc, m);
    sum += m * (x.bsums[2 * j] + x.bsums[2 * j + 1]);
  }
  return sum;
}

// ------------------------------------------------------------------ scalar

// Q4_K and Q5_K differ only in the fifth bit; `qh` is null for Q4_K.
block_sums sums_scale_min_scalar(const std::uint8_t* scales, const std::uint8_t* qs, const std::uint8_t* qh,
                                 const block_q8_K& x) noexcept {
  block_sums out;
  for (int c = 0; c < 4; ++c) {
    std::int32_t lo = 0, hi = 0;
    for (int l = 0; l < 32; ++l) {
      int q_lo = qs[32 * c + l] & 0x0f;
      int q_hi = qs[32 * c + l] >> 4;
      if (qh != nullptr) {
        q_lo |= ((qh[l] >> (2 * c)) & 1) << 4;
        q_hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
      }
      lo += q_lo * x.qs[64 * c + l];
      hi += q_hi * x.qs[64 * c + 32 + l];
    }
    std::uint8_t sc, m;
    model::scale_min_k4(2 * c, scales, sc, m);
    out.sum_q += sc * lo;
    model::scale_min_k4(2 * c + 1, scales, sc, m);
    out.sum_q += sc * hi;
  }
  out.sum_m = mins_sum(scales, x);
  return out;
}

std::int32_t sum_q6_K_scalar(const block_q6_K& w, const block_q8_K& x) noexcept {
  std::int32_t group[16] = {};
  for (int h = 0; h < 2; ++h) {
    const std::uint8_t* ql = w.ql + 64 * h;
    const std::uint8_t* qh = w.qh + 32 * h;
    const std::int8_t* xs = x.qs + 128 * h;
    std::int32_t* g = group + 8 * h;
    for (int l = 0; l < 32; ++l) {
      const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      g[l / 16] += q1 * xs[l];
      g[2 + l / 16] += q2 * xs[l + 32];
      g[4 + l / 16] += q3 * xs[l + 64];
      g[6 + l / 16] += q4 * xs[l + 96];
    }
  }
  std::int32_t sum = 0;
  for (int i = 0; i < 16; ++i) sum += w.scales[i] * group[i];
  return sum;
}

// -------------------------------------------------------------------- AVX2

#if defined(__AVX2__)
inline std::int32_t hsum_i32(__m256i v) noexcept {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
  return _mm_cvtsi128_si32(s);
}

inline __m256i load32(const void* p) noexcept { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// maddubs (u8 × s8, adjacent pairs; no saturation: |q| ≤ 63, |x| ≤ 128) then
// madd with the 16-bit scales `sc` (pairs again) gives 8 exact int32 lanes.
inline __m256i scaled_dot(__m256i q_u8, __m256i x_s8, __m256i sc) noexcept {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(q_u8, x_s8), sc);
}

block_sums sums_scale_min_avx2(const std::uint8_t* scales, const std::uint8_t* qs, const std::uint8_t* qh,
                               const block_q8_K& x) noexcept {
  const __m256i nib = _mm256_set1_epi8(0x0f);
  const __m256i one = _mm256_set1_epi8(1);
  const __m256i bits = qh != nullptr ? load32(qh) : _mm256_setzero_si256();
  __m256i acc = _mm256_setzero_si256();
  for (int c = 0; c < 4; ++c) {
    const __m256i q = load32(qs + 32 * c);
    __m256i lo = _mm256_and_si256(q, nib);
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), nib);
    if (qh != nullptr) {
      // Bit 2c (2c + 1) of each qh byte is the fifth bit of the low (high) half.
      lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bits, 2 * c), one), 4));
      hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bits, 2 * c + 1), one), 4));
    }
    std::uint8_t sc_lo, sc_hi, m;
    model::scale_min_k4(2 * c, scales, sc_lo, m);
    model::scale_min_k4(2 * c + 1, scales, sc_hi, m);
    acc = _mm256_add_epi32(acc, scaled_dot(lo, load32(x.qs + 64 * c), _mm256_set1_epi16(sc_lo)));
    acc = _mm256_add_epi32(acc, scaled_dot(hi, load32(x.qs + 64 * c + 32), _mm256_set1_epi16(sc_hi)));
  }
  return {hsum_i32(acc), mins_sum(scales, x)};
}

std::int32_t sum_q6_K_avx2(const block_q6_K& w, const block_q8_K& x) noexcept {
  const __m256i nib = _mm256_set1_epi8(0x0f);
  const __m256i two = _mm256_set1_epi8(3);
  __m256i acc = _mm256_setzero_si256();
  for (int h = 0; h < 2; ++h) {
    const __m256i ql0 = load32(w.ql + 64 * h);
    const __m256i ql1 = load32(w.ql + 64 * h + 32);
    const __m256i qh = load32(w.qh + 32 * h);
    // Unsigned 6-bit values q in [0, 63], 32 elements each: the four 32-element
    // quarters of this half, in element order.
    const __m256i q[4] = {
        _mm256_or_si256(_mm256_and_si256(ql0, nib), _mm256_slli_epi16(_mm256_and_si256(qh, two), 4)),
        _mm256_or_si256(_mm256_and_si256(ql1, nib),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), two), 4)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), nib),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), two), 4)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), nib),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), two), 4)),
    };
    for (int k = 0; k < 4; ++k) {
      const int g = 8 * h + 2 * k;  // the quarter's two 16-element groups
      const __m256i sc = _mm256_set_m128i(_mm_set1_epi16(w.scales[g + 1]), _mm_set1_epi16(w.scales[g]));
      acc = _mm256_add_epi32(acc, scaled_dot(q[k], load32(x.qs + 128 * h + 32 * k), sc));
    }
  }
  // The values were taken unsigned; remove the offset 32 per element exactly.
  std::int32_t offset = 0;
  for (int g = 0; g < 16; ++g) offset += w.scales[g] * x.bsums[g];
  return hsum_i32(acc) - 32 * offset;
}
#endif

template <class Block, class Sums>
float dot_scale_min(const std::byte* row, const block_q8_K* x, std::size_t nb, Sums sums) noexcept {
  const auto* w = reinterpret_cast<const Block*>(row);
  float s = 0.0f;
  for (std::size_t b = 0; b < nb; ++b) {
    const std::uint8_t* qh = nullptr;
    if constexpr (requires { w[b].qh; }) qh = w[b].qh;
    const block_sums bs = sums(w[b].scales, w[b].qs, qh, x[b]);
    s = scale_min_step(s, bs, model::f16_to_float(w[b].d), model::f16_to_float(w[b].dmin), x[b].d);
  }
  return s;
}

template <class Sums>
float dot_q6_K(const std::byte* row, const block_q8_K* x, std::size_t nb, Sums sums) noexcept {
  const auto* w = reinterpret_cast<const block_q6_K*>(row);
  float s = 0.0f;
  for (std::size_t b = 0; b < nb; ++b) s = scale_step(s, sums(w[b], x[b]), model::f16_to_float(w[b].d), x[b].d);
  return s;
}

}  // namespace

bool available(path p) noexcept {
#if defined(__AVX2__)
  return p == path::scalar || p == path::avx2;
#else
  return p == path::scalar;
#endif
}

path best_path() noexcept { return available(path::avx2) ? path::avx2 : path::scalar; }

float dot_row(model::tensor_type type, const std::byte* row, const block_q8_K* x, std::size_t nb, path p) noexcept {
  EXA_ASSERT_MSG(available(p), "kquant path not compiled in");
#if defined(__AVX2__)
  if (p == path::avx2) {
    switch (type) {
      case model::tensor_type::q4_K: return dot_scale_min<block_q4_K>(row, x, nb, sums_scale_min_avx2);
      case model::tensor_type::q5_K: return dot_scale_min<block_q5_K>(row, x, nb, sums_scale_min_avx2);
      case model::tensor_type::q6_K: return dot_q6_K(row, x, nb, sum_q6_K_avx2);
      default: break;
    }
    EXA_ASSERT_MSG(false, "dot_row: not a K-quant type");
  }
#endif
  switch (type) {
    case model::tensor_type::q4_K: return dot_scale_min<block_q4_K>(row, x, nb, sums_scale_min_scalar);
    case model::tensor_type::q5_K: return dot_scale_min<block_q5_K>(row, x, nb, sums_scale_min_scalar);
    case model::tensor_type::q6_K: return dot_q6_K(row, x, nb, sum_q6_K_scalar);
    default: break;
  }
  EXA_ASSERT_MSG(false, "dot_row: not a K-quant type");
  return 0.0f;
}

}  // namespace exa::engine::kquant
