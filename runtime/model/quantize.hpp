#pragma once
// Row conversions between float and the tensor types ExaServe runs. The
// quantizers reproduce ggml's reference ones bit for bit (quantize_row_*_ref),
// so files we write quantize exactly as llama.cpp would quantize the same floats.

#include <cstddef>
#include <span>

#include "model/tensor_type.hpp"

namespace exa::model {

/// Q8_0: per block of 32, d = max|x| / 127, q = round(x / d). `n` must be a
/// multiple of 32; `y` receives n / 32 blocks.
void quantize_row_q8_0(const float* x, block_q8_0* y, std::size_t n) noexcept;

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
