#include "engine/kquant_dot.hpp"

#include <algorithm>
#include <cstring>

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
// product the mins contribute (integers, 8 terms; the SIMD path computes the
// same sum from its unpacked mins).
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

// A Q4_K/Q5_K super-block unpacked once and multiplied with several tokens:
// sub-block j's 32 values (unsigned, 0..31) and its integer scale and min.
struct unpacked_scale_min {
  __m256i q[8];
  __m256i m_pairs;  // int16: m_j at lanes 2j and 2j + 1, to meet bsums[2j], bsums[2j + 1]
  std::int16_t sc[8];
  float d, dmin;

  template <class Block>
  explicit unpacked_scale_min(const Block& w) noexcept {
    const __m256i nib = _mm256_set1_epi8(0x0f);
    for (int c = 0; c < 4; ++c) {
      const __m256i packed = load32(w.qs + 32 * c);
      q[2 * c] = _mm256_and_si256(packed, nib);
      q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nib);
    }
    if constexpr (requires { w.qh; }) {
      // Bit 2c (2c + 1) of each qh byte is the fifth bit of sub-block 2c (2c + 1).
      const __m256i one = _mm256_set1_epi8(1);
      const __m256i bits = load32(w.qh);
      for (int j = 0; j < 8; ++j) {
        const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(bits, j), one);
        q[j] = _mm256_or_si256(q[j], _mm256_slli_epi16(hb, 4));
      }
    }
    // scale_min_k4 on 32-bit words: bytes 0-3 hold sc0-3 (low 6 bits) and
    // the top bits of sc4-7; bytes 4-7 likewise for the mins; bytes 8-11 the
    // low nibbles of sc4-7 (low) and m4-7 (high).
    std::uint32_t word[3];
    std::memcpy(word, w.scales, sizeof word);
    const std::uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, low2 = 0x03030303;
    const std::uint32_t sc_words[2] = {word[0] & low6, (word[2] & low4) | (((word[0] >> 6) & low2) << 4)};
    const std::uint32_t m_words[2] = {word[1] & low6, ((word[2] >> 4) & low4) | (((word[1] >> 6) & low2) << 4)};
    std::uint8_t scale8[8], min8[8];
    std::memcpy(scale8, sc_words, 8);
    std::memcpy(min8, m_words, 8);
    std::int16_t m_rep[16];
    for (int j = 0; j < 8; ++j) {
      sc[j] = scale8[j];
      m_rep[2 * j] = m_rep[2 * j + 1] = min8[j];
    }
    m_pairs = load32(m_rep);
    d = model::f16_to_float(w.d);
    dmin = model::f16_to_float(w.dmin);
  }

  float step(float s, const block_q8_K& x) const noexcept {
    __m256i acc = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j)
      acc = _mm256_add_epi32(acc, scaled_dot(q[j], load32(x.qs + 32 * j), _mm256_set1_epi16(sc[j])));
    // |bsum| <= 16·127 and m <= 63: the pair products fit int32 exactly.
    const std::int32_t sum_m = hsum_i32(_mm256_madd_epi16(load32(x.bsums), m_pairs));
    return scale_min_step(s, {hsum_i32(acc), sum_m}, d, dmin, x.d);
  }
};

// A Q6_K super-block unpacked once: 32-element quarter i (of 8) as unsigned
// 6-bit values; the offset 32 is removed exactly through the bsums.
struct unpacked_q6_K {
  __m256i q[8];
  const std::int8_t* scales;
  float d;

  explicit unpacked_q6_K(const block_q6_K& w) noexcept : scales(w.scales), d(model::f16_to_float(w.d)) {
    const __m256i nib = _mm256_set1_epi8(0x0f);
    const __m256i two_bits = _mm256_set1_epi8(3);
    const auto high = [&](__m256i qh, int shift) {
      return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, shift), two_bits), 4);
    };
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = load32(w.ql + 64 * h);
      const __m256i ql1 = load32(w.ql + 64 * h + 32);
      const __m256i qh = load32(w.qh + 32 * h);
      q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(ql0, nib), high(qh, 0));
      q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, nib), high(qh, 2));
      q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), nib), high(qh, 4));
      q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), nib), high(qh, 6));
    }
  }

  float step(float s, const block_q8_K& x) const noexcept {
    __m256i acc = _mm256_setzero_si256();
    for (int i = 0; i < 8; ++i) {
      // Quarter i holds 16-element groups 2i and 2i + 1.
      const __m256i sc = _mm256_set_m128i(_mm_set1_epi16(scales[2 * i + 1]), _mm_set1_epi16(scales[2 * i]));
      acc = _mm256_add_epi32(acc, scaled_dot(q[i], load32(x.qs + 32 * i), sc));
    }
    std::int32_t offset = 0;
    for (int g = 0; g < 16; ++g) offset += scales[g] * x.bsums[g];
    return scale_step(s, hsum_i32(acc) - 32 * offset, d, x.d);
  }
};

// Each super-block unpacked once per group of up to 8 tokens; each token's
// accumulator still takes the super-blocks in order, so the result per
// (row, token) is the same whatever the group.
template <class Unpacked, class Block>
void dot_tokens_avx2(const std::byte* row, const block_q8_K* x, std::size_t x_stride, std::size_t n_tokens,
                     std::size_t nb, float* y, std::size_t y_stride) noexcept {
  constexpr std::size_t group = 8;
  const auto* w = reinterpret_cast<const Block*>(row);
  for (std::size_t t0 = 0; t0 < n_tokens; t0 += group) {
    const std::size_t n = std::min(group, n_tokens - t0);
    float s[group] = {};
    for (std::size_t b = 0; b < nb; ++b) {
      const Unpacked u(w[b]);
      for (std::size_t c = 0; c < n; ++c) s[c] = u.step(s[c], x[(t0 + c) * x_stride + b]);
    }
    for (std::size_t c = 0; c < n; ++c) y[(t0 + c) * y_stride] = s[c];
  }
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

void dot_row_tokens(model::tensor_type type, const std::byte* row, const block_q8_K* x, std::size_t x_stride,
                    std::size_t n_tokens, std::size_t nb, path p, float* y, std::size_t y_stride) noexcept {
  EXA_ASSERT_MSG(available(p), "kquant path not compiled in");
  EXA_ASSERT_MSG(is_k_quant(type), "dot_row_tokens: not a K-quant type");
#if defined(__AVX2__)
  if (p == path::avx2) {
    switch (type) {
      case model::tensor_type::q4_K:
        return dot_tokens_avx2<unpacked_scale_min, block_q4_K>(row, x, x_stride, n_tokens, nb, y, y_stride);
      case model::tensor_type::q5_K:
        return dot_tokens_avx2<unpacked_scale_min, block_q5_K>(row, x, x_stride, n_tokens, nb, y, y_stride);
      default:
        return dot_tokens_avx2<unpacked_q6_K, block_q6_K>(row, x, x_stride, n_tokens, nb, y, y_stride);
    }
  }
#endif
  for (std::size_t t = 0; t < n_tokens; ++t) {
    const block_q8_K* xt = x + t * x_stride;
    float& out = y[t * y_stride];
    switch (type) {
      case model::tensor_type::q4_K: out = dot_scale_min<block_q4_K>(row, xt, nb, sums_scale_min_scalar); break;
      case model::tensor_type::q5_K: out = dot_scale_min<block_q5_K>(row, xt, nb, sums_scale_min_scalar); break;
      default: out = dot_q6_K(row, xt, nb, sum_q6_K_scalar); break;
    }
  }
}

float dot_row(model::tensor_type type, const std::byte* row, const block_q8_K* x, std::size_t nb, path p) noexcept {
  float y = 0.0f;
  dot_row_tokens(type, row, x, nb, 1, nb, p, &y, 1);
  return y;
}

}  // namespace exa::engine::kquant
