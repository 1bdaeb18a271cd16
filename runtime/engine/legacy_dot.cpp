#include "engine/legacy_dot.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "common/assert.hpp"
#include "engine/simd.hpp"
#include "model/half.hpp"
#include "model/tensor_type.hpp"

namespace exa::engine::legacy {

namespace {

using model::block_q4_1;
using model::block_q5_0;
using model::block_q5_1;
using model::block_q8_0;
using model::block_q8_1;

// The float step, shared by every path.
inline float offset_step(float s, std::int32_t isum, float d_w, float d_x) noexcept {
  return simd::fma1(static_cast<float>(isum), d_w * d_x, s);
}
inline float min_step(float s, std::int32_t isum, float d_w, float d_x, float m_w, float s_x) noexcept {
  return simd::fma1(m_w, s_x, offset_step(s, isum, d_w, d_x));
}

// Level (0..15 or 0..31) of element j of a weight block.
template <class Block>
int level(const Block& b, int j) noexcept {
  int nib = j < 16 ? (b.qs[j] & 0x0f) : (b.qs[j - 16] >> 4);
  if constexpr (requires { b.qh; }) nib |= model::q5_high_bit(b.qh, j);
  return nib;
}

// One weight block with one activation block: the float step after the
// exact integer sum. Q5_0 is symmetric (level − 16); Q4_1/Q5_1 carry a min.
template <class Block, class Act>
float step_scalar(float s, const Block& w, const Act& x) noexcept {
  std::int32_t isum = 0;
  constexpr int offset = std::is_same_v<Block, block_q5_0> ? 16 : 0;
  for (int j = 0; j < 32; ++j) isum += (level(w, j) - offset) * x.qs[j];
  const float d_w = model::f16_to_float(w.d), d_x = model::f16_to_float(x.d);
  if constexpr (requires { w.m; }) {
    return min_step(s, isum, d_w, d_x, model::f16_to_float(w.m), model::f16_to_float(x.s));
  } else {
    return offset_step(s, isum, d_w, d_x);
  }
}

#if defined(__AVX2__)
inline std::int32_t hsum_i32(__m256i v) noexcept {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
  return _mm_cvtsi128_si32(s);
}

// 0xff in byte j where bit j of `bits` is set: each byte takes the bits byte
// it belongs to, ORs in every bit but its own, and compares with all-ones.
inline __m256i bytes_from_bits(std::uint32_t bits) noexcept {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
  return _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi64x(-1));
}

// A weight block unpacked once for several tokens: 32 levels (elements in
// order), signed for Q5_0, and its scales.
template <class Block>
struct unpacked {
  __m256i q;  // levels; Q5_0: level − 16
  float d, m = 0.0f;

  explicit unpacked(const Block& w) noexcept : d(model::f16_to_float(w.d)) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.qs));
    const __m128i nib = _mm_set1_epi8(0x0f);
    q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), nib), _mm_and_si128(packed, nib));
    if constexpr (requires { w.qh; }) {
      std::uint32_t bits;
      std::memcpy(&bits, w.qh, 4);
      q = _mm256_or_si256(q, _mm256_and_si256(bytes_from_bits(bits), _mm256_set1_epi8(0x10)));
    }
    if constexpr (std::is_same_v<Block, block_q5_0>) q = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
    if constexpr (requires { w.m; }) m = model::f16_to_float(w.m);
  }

  template <class Act>
  float step(float s, const Act& x) const noexcept {
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs));
    __m256i pairs;
    if constexpr (std::is_same_v<Block, block_q5_0>) {
      // maddubs multiplies unsigned by signed bytes: move w's sign onto x.
      pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(xv, q));
    } else {
      pairs = _mm256_maddubs_epi16(q, xv);
    }
    const std::int32_t isum = hsum_i32(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
    const float d_x = model::f16_to_float(x.d);
    if constexpr (requires { x.s; }) return min_step(s, isum, d, d_x, m, model::f16_to_float(x.s));
    else return offset_step(s, isum, d, d_x);
  }
};

template <class Block, class Act>
void dot_tokens_avx2(const std::byte* row, const Act* x, std::size_t x_stride, std::size_t n_tokens,
                     std::size_t nb, float* y, std::size_t y_stride) noexcept {
  constexpr std::size_t group = 8;
  const auto* w = reinterpret_cast<const Block*>(row);
  for (std::size_t t0 = 0; t0 < n_tokens; t0 += group) {
    const std::size_t n = std::min(group, n_tokens - t0);
    float s[group] = {};
    for (std::size_t b = 0; b < nb; ++b) {
      const unpacked<Block> u(w[b]);
      for (std::size_t c = 0; c < n; ++c) s[c] = u.step(s[c], x[(t0 + c) * x_stride + b]);
    }
    for (std::size_t c = 0; c < n; ++c) y[(t0 + c) * y_stride] = s[c];
  }
}
#endif

template <class Block, class Act>
void dot_tokens(const std::byte* row, const void* xv, std::size_t x_stride, std::size_t n_tokens, std::size_t nb,
                path p, float* y, std::size_t y_stride) noexcept {
  const auto* x = static_cast<const Act*>(xv);
#if defined(__AVX2__)
  if (p == path::avx2) return dot_tokens_avx2<Block>(row, x, x_stride, n_tokens, nb, y, y_stride);
#endif
  (void)p;
  const auto* w = reinterpret_cast<const Block*>(row);
  for (std::size_t t = 0; t < n_tokens; ++t) {
    float s = 0.0f;
    for (std::size_t b = 0; b < nb; ++b) s = step_scalar(s, w[b], x[t * x_stride + b]);
    y[t * y_stride] = s;
  }
}

}  // namespace

void dot_row_tokens(model::tensor_type type, const std::byte* row, const void* x, std::size_t x_stride,
                    std::size_t n_tokens, std::size_t nb, path p, float* y, std::size_t y_stride) noexcept {
  EXA_ASSERT_MSG(kquant::available(p), "kernel path not compiled in");
  switch (type) {
    case model::tensor_type::q5_0: return dot_tokens<block_q5_0, block_q8_0>(row, x, x_stride, n_tokens, nb, p, y, y_stride);
    case model::tensor_type::q4_1: return dot_tokens<block_q4_1, block_q8_1>(row, x, x_stride, n_tokens, nb, p, y, y_stride);
    case model::tensor_type::q5_1: return dot_tokens<block_q5_1, block_q8_1>(row, x, x_stride, n_tokens, nb, p, y, y_stride);
    default: break;
  }
  EXA_ASSERT_MSG(false, "legacy::dot_row_tokens: not a Q4_1/Q5_0/Q5_1 type");
}

}  // namespace exa::engine::legacy
