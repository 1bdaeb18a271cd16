#pragma once
// Internal to matmul.cpp: the tile kernels. One tile computes R weight rows ×
// C tokens. Every output element is one fixed sequence of operations that
// does not depend on R, C or where the tile sits, which is what makes the
// matmul batch-invariant. Include only from translation units compiled with
// the engine's ISA flags (simd lane count must agree).

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "engine/simd.hpp"
#include "model/half.hpp"
#include "model/llama_weights.hpp"
#include "model/tensor_type.hpp"

namespace exa::engine::kernels {

using model::block_q4_0;
using model::block_q8_0;
using simd::lanes;
using simd::vfloat;

// ---------------------------------------------------------------- float weights

// Loads `lanes` weights starting at element k of a row, as floats.
struct f32_row {
  static vfloat load(const std::byte* row, std::size_t k) noexcept {
    return simd::load(reinterpret_cast<const float*>(row) + k);
  }
  static float at(const std::byte* row, std::size_t k) noexcept {
    float v;
    std::memcpy(&v, row + k * 4, 4);
    return v;
  }
};
struct f16_row {
  static vfloat load(const std::byte* row, std::size_t k) noexcept {
    return simd::load_f16(reinterpret_cast<const std::uint16_t*>(row) + k);
  }
  static float at(const std::byte* row, std::size_t k) noexcept {
    std::uint16_t h;
    std::memcpy(&h, row + k * 2, 2);
    return model::f16_to_float(h);
  }
};
struct bf16_row {
  static vfloat load(const std::byte* row, std::size_t k) noexcept {
    return simd::load_bf16(reinterpret_cast<const std::uint16_t*>(row) + k);
  }
  static float at(const std::byte* row, std::size_t k) noexcept {
    std::uint16_t h;
    std::memcpy(&h, row + k * 2, 2);
    return model::bf16_to_float(h);
  }
};

// One tile: R weight rows × C tokens. Each output is one accumulator chain
// over k in steps of `lanes`, then hsum, then the scalar tail: identical for
// every (R, C), which is the batch-invariance guarantee.
template <class Row, int R, int C>
void float_tile(const model::weight_view& w, std::size_t r0, const float* x,
                std::size_t x_stride, std::size_t t0, float* y, std::size_t y_stride) {
  const std::size_t k_full = w.cols / lanes * lanes;
  const std::byte* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = w.row(r0 + r);
  const float* xs[C];
  for (int c = 0; c < C; ++c) xs[c] = x + (t0 + c) * x_stride;

  vfloat acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = simd::zero();
  for (std::size_t k = 0; k < k_full; k += lanes) {
    vfloat wv[R];
    // Keep every loaded vector in a register: left to itself GCC folds the
    // loads into the FMAs, re-reading each one R or C times, and the loop
    // becomes load-bound at a third of the FMA units' rate.
    for (int r = 0; r < R; ++r) {
      wv[r] = Row::load(rows[r], k);
      asm("" : "+v"(wv[r]));
    }
    for (int c = 0; c < C; ++c) {
      vfloat xv = simd::load(xs[c] + k);
      asm("" : "+v"(xv));
      for (int r = 0; r < R; ++r) acc[r][c] = simd::fma(wv[r], xv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float s = simd::hsum(acc[r][c]);
      for (std::size_t k = k_full; k < w.cols; ++k) s = simd::fma1(Row::at(rows[r], k), xs[c][k], s);
      y[(t0 + c) * y_stride + r0 + r] = s;
    }
}

// ------------------------------------------------------------ quantized weights
//
// Q8_0 and Q4_0 weights meet activations quantized to Q8_0 (as llama.cpp
// does). Per block the integer dot product is exact; the float work per block
// is fixed per build. Two implementations, chosen at compile time:
//  - AVX-512 VNNI: two blocks per 512-bit step. Activations are stored as
//    unsigned bytes (q + 128) with their scales pre-expanded, so one
//    vpdpbusd (seeded with -128·Σw) gives the exact sums; then
//    acc += (float(sum) · d_w) · d_x.
//  - otherwise (AVX2, or scalar): one block per step, acc += float(sum) · (d_w · d_x).

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__F16C__)
#define EXA_QUANT_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define EXA_QUANT_AVX2 1
#endif

/// Activations quantized for one matmul, in the layout the build's quantized
/// kernel reads.
struct quant_acts {
#if defined(EXA_QUANT_AVX512)
  const std::uint8_t* xu = nullptr;  // per token: q + 128, padded to a multiple of 64 bytes
  std::size_t xu_stride = 0;         // bytes per token
  const float* xd = nullptr;         // per token and 64-element step: [d0 x8, d1 x8]
  std::size_t xd_stride = 0;         // floats per token
#else
  const block_q8_0* xq = nullptr;
  std::size_t xq_stride = 0;  // blocks per token
#endif
};

#if defined(EXA_QUANT_AVX512)

inline float f16_scalar(std::uint16_t h) noexcept { return _cvtsh_ss(h); }

// Weight side of one 64-element step for one row: the int8 values, -128·Σw
// per 4-byte lane group (vpdpbusd's seed), and the two scales expanded.
struct wstep {
  __m512i q;
  __m512i neg_corr;
  __m512 d;
};

inline __m512 expand_scales(float d0, float d1) noexcept {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(d0)),
                                             _mm256_castps_pd(_mm256_set1_ps(d1)), 1));
}

inline wstep finish_wstep(__m512i q, float d0, float d1) noexcept {
  const __m512i corr = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(char(0x80)), q);
  return {q, _mm512_sub_epi32(_mm512_setzero_si512(), corr), expand_scales(d0, d1)};
}

struct q8_0_row {
  using block = block_q8_0;
  // Blocks b and b + 1 (b + 1 may be past the row: zeros, contributing 0).
  static wstep load(const block* row, std::size_t b, bool has_second) noexcept {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[b].qs));
    const __m256i hi = has_second ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[b + 1].qs))
                                  : _mm256_setzero_si256();
    return finish_wstep(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), f16_scalar(row[b].d),
                        has_second ? f16_scalar(row[b + 1].d) : 0.0f);
  }
};

struct q4_0_row {
  using block = block_q4_0;
  static wstep load(const block* row, std::size_t b, bool has_second) noexcept {
    const __m128i p0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row[b].qs));
    const __m128i p1 = has_second ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(row[b + 1].qs))
                                  : _mm_set1_epi8(char(0x88));  // nibbles of 8: zero after -8
    const __m256i packed = _mm256_inserti128_si256(_mm256_castsi128_si256(p0), p1, 1);
    const __m256i mask = _mm256_set1_epi8(0x0f);
    const __m256i lo = _mm256_and_si256(packed, mask);                         // [lo0 | lo1]
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), mask);   // [hi0 | hi1]
    // Element order per block is 16 low nibbles then 16 high nibbles.
    __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);  // [lo0 lo1 hi0 hi1]
    q = _mm512_shuffle_i64x2(q, q, _MM_SHUFFLE(3, 1, 2, 0));            // [lo0 hi0 lo1 hi1]
    q = _mm512_sub_epi8(q, _mm512_set1_epi8(8));
    return finish_wstep(q, f16_scalar(row[b].d), has_second ? f16_scalar(row[b + 1].d) : 0.0f);
  }
};

inline float hsum16(__m512 v) noexcept { return simd::hsum(reinterpret_cast<vfloat>(v)); }

template <class Row, int R, int C>
void quant_tile(const model::weight_view& w, std::size_t r0, const quant_acts& a, std::size_t t0,
                float* y, std::size_t y_stride) {
  using block = typename Row::block;
  const std::size_t nb = w.cols / 32;
  const block* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = reinterpret_cast<const block*>(w.row(r0 + r));
  const std::uint8_t* xu[C];
  const float* xd[C];
  for (int c = 0; c < C; ++c) {
    xu[c] = a.xu + (t0 + c) * a.xu_stride;
    xd[c] = a.xd + (t0 + c) * a.xd_stride;
  }
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (std::size_t b = 0, s = 0; b < nb; b += 2, ++s) {
    wstep ws[R];
    for (int r = 0; r < R; ++r) ws[r] = Row::load(rows[r], b, b + 1 < nb);
    for (int c = 0; c < C; ++c) {
      const __m512i xv = _mm512_loadu_si512(xu[c] + s * 64);
      const __m512 xs = _mm512_loadu_ps(xd[c] + s * 16);
      for (int r = 0; r < R; ++r) {
        const __m512i sum = _mm512_dpbusd_epi32(ws[r].neg_corr, xv, ws[r].q);
        const __m512 scaled = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), ws[r].d);
        acc[r][c] = _mm512_fmadd_ps(scaled, xs, acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[(t0 + c) * y_stride + r0 + r] = hsum16(acc[r][c]);
}

#else  // AVX2 or scalar: one block per step.

#if defined(EXA_QUANT_AVX2)
// Sum of the 32 products of two int8 blocks, as 8 int32 partial lanes.
inline __m256i dot_i8x32(__m256i w, __m256i x) noexcept {
  // maddubs multiplies unsigned by signed bytes: move w's sign onto x.
  const __m256i aw = _mm256_sign_epi8(w, w);
  const __m256i sx = _mm256_sign_epi8(x, w);
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), aw, sx);
#else
  const __m256i pairs = _mm256_maddubs_epi16(aw, sx);
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
#endif
}

inline float hsum8(__m256 v) noexcept {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
#endif

struct q8_0_row {
  using block = block_q8_0;
#if defined(EXA_QUANT_AVX2)
  static __m256i load(const block& b) noexcept {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
  }
#endif
  static int value(const block& b, int i) noexcept { return b.qs[i]; }
};

struct q4_0_row {
  using block = block_q4_0;
#if defined(EXA_QUANT_AVX2)
  static __m256i load(const block& b) noexcept {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
    const __m128i mask = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(packed, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
    return _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8));
  }
#endif
  static int value(const block& b, int i) noexcept {
    const int nib = i < 16 ? (b.qs[i] & 0x0f) : (b.qs[i - 16] >> 4);
    return nib - 8;
  }
};

template <class Row, int R, int C>
void quant_tile(const model::weight_view& w, std::size_t r0, const quant_acts& a, std::size_t t0,
                float* y, std::size_t y_stride) {
  using block = typename Row::block;
  const std::size_t nb = w.cols / 32;
  const block* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = reinterpret_cast<const block*>(w.row(r0 + r));
  const block_q8_0* xs[C];
  for (int c = 0; c < C; ++c) xs[c] = a.xq + (t0 + c) * a.xq_stride;
#if defined(EXA_QUANT_AVX2)
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (std::size_t b = 0; b < nb; ++b) {
    __m256i wv[R];
    float wd[R];
    for (int r = 0; r < R; ++r) {
      wv[r] = Row::load(rows[r][b]);
      wd[r] = model::f16_to_float(rows[r][b].d);
    }
    for (int c = 0; c < C; ++c) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[c][b].qs));
      const float xd = model::f16_to_float(xs[c][b].d);
      for (int r = 0; r < R; ++r) {
        const __m256 prod = _mm256_cvtepi32_ps(dot_i8x32(wv[r], xv));
        acc[r][c] = _mm256_fmadd_ps(prod, _mm256_set1_ps(wd[r] * xd), acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[(t0 + c) * y_stride + r0 + r] = hsum8(acc[r][c]);
#else
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float s = 0.0f;
      for (std::size_t b = 0; b < nb; ++b) {
        int isum = 0;
        for (int i = 0; i < 32; ++i) isum += Row::value(rows[r][b], i) * xs[c][b].qs[i];
        s = simd::fma1(static_cast<float>(isum),
                       model::f16_to_float(rows[r][b].d) * model::f16_to_float(xs[c][b].d), s);
      }
      y[(t0 + c) * y_stride + r0 + r] = s;
    }
#endif
}

#endif  // quantized kernel choice

}  // namespace exa::engine::kernels
