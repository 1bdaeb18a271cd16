#pragma once
// ggml's 32-element formats beside Q8_0/Q4_0 that K-quant files fall back to
// for rows that are not whole 256-element super-blocks (llama.cpp writes
// q4_K rows of such tensors as Q5_0, q5_K rows as Q5_1), plus Q4_1, and Q8_1,
// the activation format Q4_1/Q5_1 multiply with. Layouts follow ggml-common.h;
// the quantizers are ggml's reference ones (quantize_row_*_ref).

#include <cstddef>
#include <cstdint>

namespace exa::model {

constexpr std::size_t legacy_block_elems = 32;

/// Q4_1: value = d·q + m, q in [0, 15]; element j in the low nibble of qs[j],
/// element j + 16 in the high nibble.
struct block_q4_1 {
  std::uint16_t d;  // fp16
  std::uint16_t m;  // fp16: the block's minimum
  std::uint8_t qs[16];
};
static_assert(sizeof(block_q4_1) == 20);

/// Q5_0: value = d·(q − 16), q in [0, 31]: nibbles as Q4_0, and bit j of the
/// little-endian 32-bit qh is the fifth bit of element j.
struct block_q5_0 {
  std::uint16_t d;
  std::uint8_t qh[4];
  std::uint8_t qs[16];
};
static_assert(sizeof(block_q5_0) == 22);

/// Q5_1: value = d·q + m with Q5_0's bit layout.
struct block_q5_1 {
  std::uint16_t d;
  std::uint16_t m;
  std::uint8_t qh[4];
  std::uint8_t qs[16];
};
static_assert(sizeof(block_q5_1) == 24);

/// Q8_1: Q8_0 (d = max|x| / 127, q = round(x / d)) plus s = d·Σq in fp16,
/// which carries Q4_1/Q5_1's min term through the dot product.
struct block_q8_1 {
  std::uint16_t d;
  std::uint16_t s;
  std::int8_t qs[32];
};
static_assert(sizeof(block_q8_1) == 36);

/// Quantizers and inverses; `n` must be a multiple of 32.
void quantize_row_q4_1(const float* x, block_q4_1* y, std::size_t n) noexcept;
void quantize_row_q5_0(const float* x, block_q5_0* y, std::size_t n) noexcept;
void quantize_row_q5_1(const float* x, block_q5_1* y, std::size_t n) noexcept;
void quantize_row_q8_1(const float* x, block_q8_1* y, std::size_t n) noexcept;
void dequantize_row_q4_1(const block_q4_1* x, float* y, std::size_t n) noexcept;
void dequantize_row_q5_0(const block_q5_0* x, float* y, std::size_t n) noexcept;
void dequantize_row_q5_1(const block_q5_1* x, float* y, std::size_t n) noexcept;

/// Element j's fifth bit (0 or 16) from a Q5 block's qh bytes.
inline int q5_high_bit(const std::uint8_t* qh, int j) noexcept {
  const std::uint32_t bits = qh[0] | (qh[1] << 8) | (qh[2] << 16) | (static_cast<std::uint32_t>(qh[3]) << 24);
  return static_cast<int>((bits >> j) & 1u) << 4;
}

}  // namespace exa::model
