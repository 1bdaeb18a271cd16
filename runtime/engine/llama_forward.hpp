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
//
// Tensor parallelism (Megatron style): a member of a group of G runs the same
// pass over its shard of the weights (tp_weights.hpp) -- n_heads / G query
// heads and n_kv_heads / G KV heads (its KV pages hold only those), ff / G MLP
// rows -- and all-reduces the partial outputs of the row-parallel O and down
// projections, two collectives per layer. The sum is in rank order, so a
// member's logits are still batch-invariant and bitwise the same from run to
// run (not bitwise those of one device: each projection's dot products are
// summed in G pieces). The hidden state is the same on every member after each
// all-reduce, so rank 0 alone computes logits.

#include <cstdint>
#include <functional>
#include <vector>

#include "common/error.hpp"
#include "engine/aligned_vector.hpp"
#include "engine/block_pool.hpp"
#include "engine/kv_cache.hpp"
#include "engine/kv_pages.hpp"
#include "engine/matmul.hpp"
#include "engine/ops.hpp"
#include "engine/weight_store.hpp"
#include "model/llama_config.hpp"
#include "model/llama_weights.hpp"
#include "model/tokenizer.hpp"

namespace exa::engine {

class communicator;
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

/// A forward pass stopped part way (execute_yielding): the batch's hidden
/// state after its first `next_stage` half-layers (a layer is two stages,
/// attention then MLP, and the hidden state is all that passes between
/// them). The K/V of the layers whose attention ran is in the cache
/// already; the rest is written when the pass goes on.
struct forward_suspension {
  std::uint32_t next_stage = 0;  // 0: nothing suspended
  aligned_vector<float> hidden;  // [tokens][dim]
};

/// Runs a batch through the model: one llama_forward, or a tensor-parallel
/// group of them (tp_group.hpp).
class forward_executor {
 public:
  virtual ~forward_executor() = default;
  /// Fills `logits` with vocab_size floats per token whose `logits` flag is
  /// set, in batch order. Errors: unavailable when a tensor-parallel group's
  /// collective failed (the group is aborted; nothing more will run).
  virtual expected<void> execute(const forward_batch& batch, std::vector<float>& logits) = 0;
  /// Whether execute_yielding can stop part way (otherwise it runs whole).
  virtual bool can_yield() const noexcept { return false; }
  /// Memory of its own its weights occupy (weight_store.hpp); none by default.
  virtual resident_memory weights_memory() const noexcept { return {}; }
  /// execute(), stopping part way when asked: before each stage (a layer's
  /// attention or its MLP) after the first one it runs, `should_yield()` is
  /// asked, and when it says yes the pass keeps the batch's hidden state in
  /// `state` and returns true (no logits). Called again with that state and the same batch, it goes on
  /// from there (another batch may run in between, on other sequences' KV);
  /// what it computes is bitwise what one uninterrupted pass computes.
  /// Executors that cannot stop run the whole batch and return false.
  virtual expected<bool> execute_yielding(const forward_batch& batch, std::vector<float>& logits,
                                          forward_suspension& state, const std::function<bool()>& should_yield) {
    (void)should_yield;
    if (state.next_stage != 0) return make_error(errc::internal, "this forward pass cannot resume a suspended batch");
    if (auto ok = execute(batch, logits); !ok) return std::unexpected(ok.error());
    return false;
  }
};

class llama_forward final : public forward_executor {
 public:
  /// The whole model on one device.
  llama_forward(const model::llama_config& config, const model::llama_weights& weights,
                kv_cache& cache, thread_pool& pool, resident_options resident = {});
  /// Member `comm.rank()` of a tensor-parallel group of comm.size(): `weights`
  /// is its shard (tp_weights.hpp), `pages` its own KV blocks, n_kv_heads /
  /// comm.size() heads wide. Only rank 0 returns logits; the others return
  /// none. `comm` must outlive this forward.
  llama_forward(const model::llama_config& config, const model::llama_weights& weights, kv_pages pages,
                thread_pool& pool, communicator& comm, resident_options resident = {});

  /// execute() on one device, where nothing can fail.
  void run(const forward_batch& batch, std::vector<float>& logits);
  expected<void> execute(const forward_batch& batch, std::vector<float>& logits) override;
  /// On one device only: a tensor-parallel member's layers are collectives
  /// its group runs together.
  bool can_yield() const noexcept override { return comm_ == nullptr; }
  resident_memory weights_memory() const noexcept override { return resident_.memory(); }
  expected<bool> execute_yielding(const forward_batch& batch, std::vector<float>& logits,
                                  forward_suspension& state, const std::function<bool()>& should_yield) override;

  const model::llama_config& config() const noexcept { return config_; }

 private:
  llama_forward(const model::llama_config& config, const model::llama_weights& weights, kv_pages pages,
                thread_pool& pool, communicator* comm, resident_options resident);
  // The pass behind execute() and execute_yielding(); `state` and
  // `should_yield` null when it may not stop.
  expected<bool> run_layers(const forward_batch& batch, std::vector<float>& logits, forward_suspension* state,
                            const std::function<bool()>* should_yield);
  expected<void> attention_layer(const forward_batch& batch, std::uint32_t layer);
  expected<void> mlp_layer(std::uint32_t layer, std::size_t n_tok);
  // Sums `n` floats over the group in place; nothing on one device.
  expected<void> all_reduce(float* data, std::size_t n);
  struct attend_scratch {
    std::vector<float> q, scores, out;  // the run's queries, rounded; their scores; their sums
  };
  /// A run of the batch's tokens [first, first + count): one sequence at
  /// consecutive positions (a prompt's chunk, a speculative step).
  struct attend_run {
    std::uint32_t first = 0, count = 0;
  };
  // The query heads that share KV head `kv_head`, of every token of the run:
  // each K and V row is loaded and converted once for all of them. Per head
  // the same operations as one head of one token at a time.
  void attend(const forward_batch& batch, std::uint32_t layer, attend_run run, std::size_t kv_head,
              attend_scratch& s);

  model::llama_config config_;
  const model::llama_weights& weights_;
  // The matmul weights: weights_'s, pointing at copies of this forward's
  // own (weight_store.hpp: q8_0 packed for the kernels, the other types
  // copied unless the options keep them in the file's mapping).
  weight_store resident_;
  std::vector<model::llama_layer_weights> layers_;
  model::weight_view output_;
  kv_pages cache_;
  thread_pool& pool_;
  communicator* comm_ = nullptr;  // null on one device
  // This member's share (the whole model on one device): query and KV heads,
  // their widths, MLP rows.
  std::size_t n_heads_ = 0, n_kv_heads_ = 0, q_dim_ = 0, kv_dim_ = 0, ff_ = 0;
  // K stored transposed inside each block (kv_pages.hpp): where the variant
  // active at construction prefers it (kernel_table::k_transposed), a block's
  // positions fill whole sets of 16 and a head is at most 256 wide.
  bool k_transposed_ = false;
  const kernel_table* kernels_ = nullptr;  // the active ISA's, taken at each run()
  std::vector<std::vector<float>> attn_norm_, ffn_norm_;  // per layer, dequantized
  std::vector<float> output_norm_;
  // Per layer, dequantized; empty where the file has no such bias.
  std::vector<std::vector<float>> bq_, bk_, bv_, bo_;
  std::vector<float> rope_factors_;  // empty without rope_freqs
  rope_params rope_;                 // points into rope_factors_

  // Activations, [tokens][width], reused across runs.
  aligned_vector<float> x_, xn_, q_, k_, v_, att_, proj_, gate_, up_;
  aligned_vector<float> rope_cs_;  // per token: rope_dim / 2 cosines, then as many sines
  activations xn_acts_;     // xn_ converted once for several weights
  activations other_acts_;  // for a weight whose type needs another conversion
  std::vector<attend_run> attend_runs_;  // the batch's, set by run_layers for all its layers
  // y = xn · Wᵀ, reusing xn_acts_ when it already serves w.
  void project(const model::weight_view& w, std::size_t n_tok, float* y, std::size_t y_stride);
  // Several projections of xn_ (Q, K, V; gate, up).
  void project_all(std::span<const matmul_target> targets, std::size_t n_tok);
  // fn(t) for every token of the batch, across the pool.
  template <class Fn>
  void for_tokens(std::size_t n_tok, Fn&& fn);
  // xn_ = rms_norm(x_, w) for the batch's n_tok tokens, 8 side by side
  // (ops.hpp's rms_norm_rows), the runs spread over the pool.
  void norm_tokens(const float* w, std::size_t n_tok);
};

}  // namespace exa::engine
