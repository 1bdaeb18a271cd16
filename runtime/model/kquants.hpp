#pragma once
// ggml's K-quant block formats (super-blocks of 256 elements): Q4_K, Q5_K and
// Q6_K, which Q4_K_M / Q5_K_M files mix, and Q8_K, the activation format the
// dot products use. Layouts follow ggml-common.h byte for byte; the
// quantizers follow ggml's reference algorithms (quantize_row_q*_K_ref), so
// files we write are what llama.cpp's quantizer would choose for the same
// floats, up to float rounding in the search.

#include <cstddef>
#include <cstdint>

namespace exa::model {

/// Elements per K-quant super-block (ggml's QK_K).
constexpr std::size_t qk_k = 256;
/// Bytes holding the eight 6-bit scales and eight 6-bit mins of Q4_K/Q5_K.
constexpr std::size_t k_scale_size = 12;

/// Q4_K: 8 sub-blocks of 32. Element value = d·sc_j·q − dmin·m_j with q in
/// [0, 15]; sc_j, m_j are 6-bit, packed in `scales` (see scale_min_k4).
/// Within each 64-element chunk c, qs[32c + l] holds element 64c + l in its
/// low nibble and element 64c + 32 + l in its high nibble.
struct block_q4_K {
  std::uint16_t d;     // fp16: scale of the sub-block scales
  std::uint16_t dmin;  // fp16: scale of the sub-block mins
  std::uint8_t scales[k_scale_size];
  std::uint8_t qs[qk_k / 2];
};
static_assert(sizeof(block_q4_K) == 144);

/// Q5_K: as Q4_K with a fifth bit per element: bit 2c of qh[l] is the high
/// bit of element 64c + l, bit 2c + 1 that of element 64c + 32 + l.
struct block_q5_K {
  std::uint16_t d;
  std::uint16_t dmin;
  std::uint8_t scales[k_scale_size];
  std::uint8_t qh[qk_k / 8];
  std::uint8_t qs[qk_k / 2];
};
static_assert(sizeof(block_q5_K) == 176);

/// Q6_K: 16 sub-blocks of 16 with signed 8-bit scales; value = d·sc_g·(q − 32)
/// with q in [0, 63] (low 4 bits in ql, high 2 in qh). Element e uses
/// scales[e / 16]; see dequantize_row_q6_K for the bit positions.
struct block_q6_K {
  std::uint8_t ql[qk_k / 2];
  std::uint8_t qh[qk_k / 4];
  std::int8_t scales[qk_k / 16];
  std::uint16_t d;  // fp16
};
static_assert(sizeof(block_q6_K) == 210);

/// Q8_K: activations for K-quant dot products. value = d·q; bsums[g] is the
/// sum of q over elements [16g, 16g + 16), which the dot products use to
/// apply mins and offsets without touching every element twice.
struct block_q8_K {
  float d;
  std::int8_t qs[qk_k];
  std::int16_t bsums[qk_k / 16];
};
static_assert(sizeof(block_q8_K) == 292);

/// Sub-block j's (0..7) 6-bit scale and min from a Q4_K/Q5_K `scales` array:
/// j < 4 keeps them in the low 6 bits of bytes j and j + 4; j >= 4 splits
/// them into a nibble of byte j + 4 and the top 2 bits of bytes j − 4 and j.
inline void scale_min_k4(int j, const std::uint8_t* q, std::uint8_t& sc, std::uint8_t& m) noexcept {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = static_cast<std::uint8_t>((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
    m = static_cast<std::uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

/// Quantizers: `n` must be a multiple of 256; `y` receives n / 256 blocks.
void quantize_row_q4_K(const float* x, block_q4_K* y, std::size_t n) noexcept;
void quantize_row_q5_K(const float* x, block_q5_K* y, std::size_t n) noexcept;
void quantize_row_q6_K(const float* x, block_q6_K* y, std::size_t n) noexcept;
/// Q8_K as ggml's reference: per block d = max/−127 of the signed value of
/// largest magnitude, q = min(127, round_half_even(x / d)).
void quantize_row_q8_K(const float* x, block_q8_K* y, std::size_t n) noexcept;

/// Inverses, with ggml's float expressions (d·sc computed first, then ·q − dmin·m).
void dequantize_row_q4_K(const block_q4_K* x, float* y, std::size_t n) noexcept;
void dequantize_row_q5_K(const block_q5_K* x, float* y, std::size_t n) noexcept;
void dequantize_row_q6_K(const block_q6_K* x, float* y, std::size_t n) noexcept;
void dequantize_row_q8_K(const block_q8_K* x, float* y, std::size_t n) noexcept;

}  // namespace exa::model
