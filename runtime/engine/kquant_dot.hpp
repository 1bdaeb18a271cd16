#pragma once
// Dot products of K-quant weight rows (Q4_K, Q5_K, Q6_K) with activations
// quantized to Q8_K, the way llama.cpp multiplies them: per 256-element
// super-block, exact integer sums per sub-block weighted by the integer
// sub-block scales (and, for Q4_K/Q5_K, the integer mins times the
// activations' 16-element sums), then a fixed float step per super-block:
//
//   s = fma(float(Σ sc·isum), d_w·d_x, s)         (every type)
//   s = fma(float(−Σ m·bsum), dmin_w·d_x, s)      (Q4_K, Q5_K)
//
// with super-blocks taken in order. Every path (scalar, AVX2) computes the
// same integers exactly and then runs this same float code, so results are
// bitwise identical across paths, and a row's result never depends on the
// batch, tile or thread it is computed in.

#include <cstddef>
#include <cstdint>

#include "model/kquants.hpp"
#include "engine/isa.hpp"
#include "model/tensor_type.hpp"

namespace exa::engine::kquant {

/// The implementations: the scalar and AVX2 kernel variants (isa.hpp); the
/// AVX-512 variant runs the AVX2 code for these types.
enum class path { scalar, avx2 };

/// True for tensor types these kernels multiply.
constexpr bool is_k_quant(model::tensor_type t) noexcept {
  return t == model::tensor_type::q4_K || t == model::tensor_type::q5_K || t == model::tensor_type::q6_K;
}

/// True when this CPU can run `p` (scalar always).
bool available(path p) noexcept;

/// The path of the engine's active ISA (isa.hpp).
path best_path() noexcept;

/// The kernel variant that implements `p`.
isa isa_of(path p) noexcept;

/// y[t · y_stride] = Σ_k W[k]·x_t[k] for t < n_tokens, where token t's `nb`
/// Q8_K blocks start at x + t · x_stride: one weight row against several
/// tokens, unpacking each super-block once. Bitwise the same as dot_row per
/// token.
void dot_row_tokens(model::tensor_type type, const std::byte* row, const model::block_q8_K* x,
                    std::size_t x_stride, std::size_t n_tokens, std::size_t nb, path p, float* y,
                    std::size_t y_stride) noexcept;

/// Σ_k W[k]·x[k] for one weight row of `nb` super-blocks of `type` (at `row`,
/// 2-byte aligned) and one token's `nb` Q8_K blocks.
float dot_row(model::tensor_type type, const std::byte* row, const model::block_q8_K* x, std::size_t nb,
              path p) noexcept;

}  // namespace exa::engine::kquant
