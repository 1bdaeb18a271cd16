#pragma once
// Portable SIMD building blocks for the engine kernels, on GCC vector
// extensions. Lane count follows the ISA the engine is compiled for (16 floats
// with AVX-512, else 8). Every reduction here has one fixed order, so a value
// computed by any kernel variant (any tile shape, any thread) is bitwise the
// same: that is what makes the engine's logits batch-invariant.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "model/half.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// GCC 12's AVX-512 intrinsics pass _mm512_undefined_*() as the unused merge
// operand, and -W(maybe-)uninitialized then fires inside them wherever they
// are inlined (a known GCC false positive). Silenced only for such builds and
// only in the engine's kernel translation units, which include this header.
#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace exa::engine::simd {

#if defined(__AVX512F__)
inline constexpr std::size_t lanes = 16;
#else
inline constexpr std::size_t lanes = 8;
#endif

using vfloat = float __attribute__((vector_size(lanes * sizeof(float))));

inline vfloat zero() noexcept { return vfloat{}; }

inline vfloat splat(float v) noexcept { return vfloat{} + v; }

inline vfloat load(const float* p) noexcept {
  vfloat v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store(float* p, vfloat v) noexcept { std::memcpy(p, &v, sizeof v); }

/// a * b + c with one rounding where the ISA has FMA; mul then add otherwise.
/// Either way the same for every caller in one binary.
inline vfloat fma(vfloat a, vfloat b, vfloat c) noexcept {
#if defined(__AVX512F__)
  return reinterpret_cast<vfloat>(_mm512_fmadd_ps(reinterpret_cast<__m512>(a),
                                                  reinterpret_cast<__m512>(b),
                                                  reinterpret_cast<__m512>(c)));
#elif defined(__FMA__)
  return reinterpret_cast<vfloat>(_mm256_fmadd_ps(reinterpret_cast<__m256>(a),
                                                  reinterpret_cast<__m256>(b),
                                                  reinterpret_cast<__m256>(c)));
#else
  return a * b + c;
#endif
}

/// Scalar counterpart of fma() for tails, with the same rounding behaviour.
inline float fma1(float a, float b, float c) noexcept {
#if defined(__FMA__) || defined(__AVX512F__)
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

/// Sum of all lanes by halving: lanes [0, n/2) + [n/2, n), repeatedly. The
/// shuffle versions perform exactly these additions, in registers.
inline float hsum(vfloat v) noexcept {
#if defined(__AVX512F__)
  const __m512 z = reinterpret_cast<__m512>(v);
  const __m256 lo8 = _mm512_castps512_ps256(z);
  const __m256 hi8 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(z), 1));
  const __m256 s8 = _mm256_add_ps(lo8, hi8);
#elif defined(__AVX__)
  const __m256 s8 = reinterpret_cast<__m256>(v);
#endif
#if defined(__AVX__)
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
#else
  float t[lanes];
  std::memcpy(t, &v, sizeof t);
  for (std::size_t width = lanes / 2; width > 0; width /= 2)
    for (std::size_t i = 0; i < width; ++i) t[i] = t[i] + t[i + width];
  return t[0];
#endif
}

/// Converts `lanes` fp16 values to floats (exact).
inline vfloat load_f16(const std::uint16_t* p) noexcept {
#if defined(__AVX512F__)
  return reinterpret_cast<vfloat>(
      _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
#elif defined(__F16C__)
  return reinterpret_cast<vfloat>(
      _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#else
  vfloat v;
  for (std::size_t i = 0; i < lanes; ++i) v[i] = model::f16_to_float(p[i]);
  return v;
#endif
}

/// Converts `lanes` bf16 values to floats (exact).
inline vfloat load_bf16(const std::uint16_t* p) noexcept {
  using vu32 = std::uint32_t __attribute__((vector_size(lanes * 4)));
  vu32 u;
  for (std::size_t i = 0; i < lanes; ++i) u[i] = static_cast<std::uint32_t>(p[i]) << 16;
  return reinterpret_cast<vfloat>(u);
}

/// Dot product of two float arrays in the engine's fixed order: lane-wise FMA
/// over full vectors, hsum, then the tail in index order.
inline float dot(const float* a, const float* b, std::size_t n) noexcept {
  vfloat acc = zero();
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) acc = fma(load(a + i), load(b + i), acc);
  float s = hsum(acc);
  for (; i < n; ++i) s = fma1(a[i], b[i], s);
  return s;
}

}  // namespace exa::engine::simd
