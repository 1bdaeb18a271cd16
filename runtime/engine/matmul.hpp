#pragma once
// y = x · Wᵀ for a batch of tokens: W has `rows` rows of `cols` elements (a
// ggml {cols, rows} tensor), x has n_tokens rows of `cols` floats, y gets
// n_tokens rows of `rows` floats.
//
// Batch invariance: every output element y[t][r] is computed by the same
// sequence of operations whatever the batch size, tile shape or thread split.
// Activations are first converted the way llama.cpp converts them for the
// weight type (rounded to f16/bf16 precision for f16/bf16 weights, quantized
// to Q8_0 for Q8_0/Q4_0/Q5_0 weights, to Q8_1 for Q4_1/Q5_1, to Q8_K for
// K-quant weights) -- per token, so also batch-independent.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/aligned_vector.hpp"
#include "model/kquants.hpp"
#include "model/legacy_quants.hpp"
#include "model/llama_weights.hpp"
#include "model/tensor_type.hpp"

namespace exa::engine {

class thread_pool;
struct kernel_table;

/// How activations are converted for a weight type.
enum class act_format { f32, f16_rounded, bf16_rounded, q8_0, q8_1, q8_K };
act_format act_format_for(model::tensor_type t) noexcept;

/// Activations converted once for any number of weights of one format and
/// width (Q, K and V share one conversion; so do gate and up).
class activations {
 public:
  /// Converts n_tokens rows of k floats for weights of `type`, in parallel
  /// over tokens when `pool` is given. For f32 weights nothing is copied: x
  /// must stay alive and unchanged while these activations are used.
  void convert(model::tensor_type type, const float* x, std::size_t x_stride, std::size_t n_tokens,
               std::size_t k, thread_pool* pool);

  /// True when these activations serve a weight of `type` with `k` columns.
  bool serves(model::tensor_type type, std::size_t k) const noexcept {
    return act_format_for(type) == format_ && k == k_ && n_tokens_ > 0 &&
           (type != model::tensor_type::q4_0 || q4_layout_ || !q4_layout_needed());
  }
  std::size_t tokens() const noexcept { return n_tokens_; }

 private:
  friend struct activations_access;
  bool q4_layout_needed() const noexcept;  // the converting variant's q4_0 kernel reads xu/xd/xc
  act_format format_ = act_format::f32;
  bool q4_layout_ = false;                 // xu/xd/xc filled (q8_0 activations for q4_0 weights)
  const kernel_table* kernels_ = nullptr;  // the variant converted for, which must multiply
  std::size_t n_tokens_ = 0;
  std::size_t k_ = 0;
  const float* xf_ = nullptr;  // f32 and rounded formats
  std::size_t xf_stride_ = 0;
  aligned_vector<float> xf_store_;
  std::vector<model::block_q8_0> xq_;  // q8_0, generic kernel layout
  std::vector<std::uint8_t> xu_;       // q8_0 for q4_0 weights, AVX-512 kernel layout (q, padded)
  std::vector<float> xd_;              // q8_0 for q4_0 weights, AVX-512 kernel scales
  std::vector<std::int32_t> xc_;       // q8_0 for q4_0 weights, AVX-512 kernel: −128 · Σ per 4
  std::vector<float> xs_;              // q8_0: each block's scale as a float (xq_stride per token)
  std::vector<std::int32_t> xseed_;    // q8_0: each block's −128 · Σ q (xq_stride per token)
  std::vector<model::block_q8_K> xk_;  // q8_K: k / 256 blocks per token
  std::vector<model::block_q8_1> x1_;  // q8_1: k / 32 blocks per token
};

/// y[t * y_stride + r] = Σ_k W[r][k] · x_t[k], rows split across the pool.
void matmul(const model::weight_view& w, const activations& a, float* y, std::size_t y_stride,
            thread_pool& pool);

/// One matrix product of several on the same activations.
struct matmul_target {
  const model::weight_view* w = nullptr;
  float* y = nullptr;
  std::size_t y_stride = 0;
};

/// The products of several matrices (of one type and width, say a layer's
/// Q, K and V) on the same activations in one parallel_for: one hand-out of
/// rows and one wait instead of one per matrix, each matrix's rows split as
/// in matmul (the same results: a row's kernel never depends on the split).
void matmul_many(std::span<const matmul_target> targets, const activations& a, thread_pool& pool);

/// Same for weight rows [row_begin, row_end) only, on the calling thread (for
/// callers that split work themselves, and for tile/thread invariance tests).
void matmul_rows(const model::weight_view& w, const activations& a, float* y, std::size_t y_stride,
                 std::size_t row_begin, std::size_t row_end);

/// Convenience: convert x for w into `scratch`, then multiply.
void matmul(const model::weight_view& w, const float* x, std::size_t x_stride, std::size_t n_tokens,
            float* y, std::size_t y_stride, thread_pool& pool, activations& scratch);

/// Quantizes one row to Q8_0 exactly as model::quantize_row_q8_0 (ggml's
/// reference) does, with the active ISA's kernel. Exposed for tests.
void quantize_row_q8_0_fast(const float* x, model::block_q8_0* out, std::size_t n) noexcept;

/// Dequantizes row `r` of a weight into `out` (cols floats): embeddings and norms.
void dequantize_row(const model::weight_view& w, std::size_t r, float* out) noexcept;

}  // namespace exa::engine
