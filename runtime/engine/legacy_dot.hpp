#pragma once
// Dot products of the 32-element fallback formats K-quant files contain
// (Q5_0, Q5_1, and Q4_1) with quantized activations, as llama.cpp multiplies
// them: Q5_0 with Q8_0 activations, Q4_1/Q5_1 with Q8_1 (Q8_0 plus s = d·Σq).
// Per block the integer sum is exact; then one fixed float step per block:
//
//   s = fma(float(isum), d_w·d_x, s)     then, for Q4_1/Q5_1,   s = fma(m_w, s_x, s)
//
// in block order. Every path computes the same integers and runs this same
// float code, so results are bitwise identical across paths, batches, tiles
// and threads.

#include <cstddef>

#include "engine/kquant_dot.hpp"
#include "model/legacy_quants.hpp"
#include "model/tensor_type.hpp"

namespace exa::engine::legacy {

using kquant::path;

/// True for the types these kernels multiply.
constexpr bool handles(model::tensor_type t) noexcept {
  return t == model::tensor_type::q4_1 || t == model::tensor_type::q5_0 || t == model::tensor_type::q5_1;
}

/// True for the types that take Q8_1 activations (the others here take Q8_0).
constexpr bool needs_q8_1(model::tensor_type t) noexcept {
  return t == model::tensor_type::q4_1 || t == model::tensor_type::q5_1;
}

/// y[t · y_stride] = Σ_k W[k]·x_t[k] for t < n_tokens: one weight row of `nb`
/// blocks against each token's `nb` activation blocks (block_q8_0 for Q5_0,
/// block_q8_1 for Q4_1/Q5_1) starting at x + t · x_stride blocks.
void dot_row_tokens(model::tensor_type type, const std::byte* row, const void* x, std::size_t x_stride,
                    std::size_t n_tokens, std::size_t nb, path p, float* y, std::size_t y_stride) noexcept;

}  // namespace exa::engine::legacy
