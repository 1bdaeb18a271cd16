#pragma once
// Row conversions between float and the tensor types ExaServe runs. The
// quantizers reproduce ggml's reference ones bit for bit (quantize_row_*_ref),
// so files we write quantize exactly as llama.cpp would quantize the same floats.

#include <cstddef>
#include <cstdint>
#include <span>

#include "model/tensor_type.hpp"

namespace exa::model {

/// Q8_0: per block of 32, d = max|x| / 127, q = round(x / d). `n` must be a
/// multiple of 32; `y` receives n / 32 blocks. A block holding a NaN or an
/// infinity becomes d = q8_nonfinite_scale and q = 0 (ggml leaves it to
/// rounding a NaN into int8, which C++ does not define), so it stays a NaN
/// through every product, and every kernel variant (and the CUDA one,
/// gpu/ops/common.cuh) writes the same.
void quantize_row_q8_0(const float* x, block_q8_0* y, std::size_t n) noexcept;

/// The f16 scale of a q8 block whose input was not finite: a quiet NaN with
/// the sign set, in f32 0xffc00000, the NaN x86 makes for inf − inf or 0 · inf.
/// Every NaN a forward then holds has the same bits, so which operand an
/// operation takes a NaN from (an order the compiler may swap) cannot show.
inline constexpr std::uint16_t q8_nonfinite_scale = 0xfe00;
inline constexpr std::uint32_t f32_default_nan_bits = 0xffc00000u;

/// The largest |x| of n floats as its float bits (the sign cleared): for
/// non-negative floats the bits order as the values, and a NaN's bits lie
/// above infinity's, so the maximum is exact in any order and sees a NaN
/// wherever it is. A result >= 0x7f800000 means a NaN or an infinity.
std::uint32_t abs_max_bits(const float* x, std::size_t n) noexcept;
inline constexpr std::uint32_t f32_inf_bits = 0x7f800000u;

/// Q4_0: per block of 32, d = (the value of largest magnitude) / -8,
/// q = min(15, trunc(x / d + 8.5)). `n` must be a multiple of 32.
void quantize_row_q4_0(const float* x, block_q4_0* y, std::size_t n) noexcept;

/// Inverse of the above: y[i] = d * q. `n` must be a multiple of 32.
void dequantize_row_q8_0(const block_q8_0* x, float* y, std::size_t n) noexcept;
void dequantize_row_q4_0(const block_q4_0* x, float* y, std::size_t n) noexcept;

/// Converts `x` into `type`'s layout; `out` must hold row_bytes(type, x.size())
/// bytes and need not be aligned.
void convert_row(std::span<const float> x, tensor_type type, std::byte* out) noexcept;

/// Converts a row of `y.size()` elements stored as `type` (at `in`, any
/// alignment) back to float.
void dequantize_row(tensor_type type, const std::byte* in, std::span<float> y) noexcept;

}  // namespace exa::model
