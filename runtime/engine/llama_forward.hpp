#pragma once
// The Llama-family forward pass (llama and qwen2 files) over a batch of tokens
// from any number of sequences: embedding, per layer RMSNorm → Q/K/V (+ biases
// when the file has them) → RoPE (adjacent or half-split pairs, with linear
// scaling and per-pair frequency factors) → KV-cache write → causal GQA
// attention over the paged cache → output projection (+ bias) → residual,
// RMSNorm → SwiGLU MLP → residual; final RMSNorm and the output head for the
// tokens that need logits. Each weight matrix is multiplied once per step for the whole
// batch (matrix-matrix), and each token's arithmetic is independent of the
// batch around it (see matmul.hpp), so a sequence's logits are bitwise the
// same alone, in any batch, and whatever its prefill was split into.

#include <cstdint>
#include <vector>

#include "engine/block_pool.hpp"
#include "engine/kv_cache.hpp"
#include "engine/matmul.hpp"
#include "engine/ops.hpp"
#include "model/llama_config.hpp"
#include "model/llama_weights.hpp"
#include "model/tokenizer.hpp"

namespace exa::engine {

class thread_pool;
struct kernel_table;

struct forward_token {
  model::token_id token = 0;
  std::uint32_t pos = 0;        // position in its sequence
  std::uint32_t seq_index = 0;  // index into forward_batch::tables
  bool logits = false;          // compute next-token logits for this token
};

struct forward_batch {
  std::vector<forward_token> tokens;
  /// Block table of each sequence in the batch; it must cover every position
  /// the batch writes. Tokens of one sequence appear in position order.
  std::vector<const std::vector<block_id>*> tables;
};

class llama_forward {
 public:
  llama_forward(const model::llama_config& config, const model::llama_weights& weights,
                kv_cache& cache, thread_pool& pool);

  /// Runs the batch and fills `logits` with vocab_size floats per token whose
  /// `logits` flag is set, in batch order.
  void run(const forward_batch& batch, std::vector<float>& logits);

  const model::llama_config& config() const noexcept { return config_; }

 private:
  void attention_layer(const forward_batch& batch, std::uint32_t layer);
  void attend(const forward_batch& batch, std::uint32_t layer, std::size_t t, std::size_t head,
              std::vector<float>& scores);

  model::llama_config config_;
  const model::llama_weights& weights_;
  kv_cache& cache_;
  thread_pool& pool_;
  const kernel_table* kernels_ = nullptr;  // the active ISA's, taken at each run()
  std::vector<std::vector<float>> attn_norm_, ffn_norm_;  // per layer, dequantized
  std::vector<float> output_norm_;
  // Per layer, dequantized; empty where the file has no such bias.
  std::vector<std::vector<float>> bq_, bk_, bv_, bo_;
  std::vector<float> rope_factors_;  // empty without rope_freqs
  rope_params rope_;                 // points into rope_factors_

  // Activations, [tokens][width], reused across runs.
  std::vector<float> x_, xn_, q_, k_, v_, att_, proj_, gate_, up_;
  activations xn_acts_;     // xn_ converted once for several weights
  activations other_acts_;  // for a weight whose type needs another conversion
  // y = xn · Wᵀ, reusing xn_acts_ when it already serves w.
  void project(const model::weight_view& w, std::size_t n_tok, float* y, std::size_t y_stride);
  // fn(t) for every token of the batch, across the pool.
  template <class Fn>
  void for_tokens(std::size_t n_tok, Fn&& fn);
};

}  // namespace exa::engine
