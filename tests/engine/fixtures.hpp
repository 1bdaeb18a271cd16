#pragma once
// Shared test fixtures: generated models on disk and engines over a CPU pool.

#include <memory>
#include <string>
#include <vector>

#include "engine/cpu_engine.hpp"
#include "engine/isa.hpp"
#include "engine/kv_cache.hpp"
#include "engine/llama_forward.hpp"
#include "engine/thread_pool.hpp"
#include "gpu/cpu_memory_pool.hpp"
#include "model/llama_model.hpp"
#include "model/model_gen.hpp"

namespace exa::test {

/// Generates (once per process and spec) and loads a model.
std::shared_ptr<const model::llama_model> make_model(const model::model_spec& spec);

/// `spec`'s model written again with token `token`'s embedding made
/// infinite (an f32 or f16 element, or a block's f16 scale): the file an
/// overflowing conversion would leave. Its hidden state, and every later
/// position's through attention, is then NaN or infinite.
std::shared_ptr<const model::llama_model> make_poisoned_model(const model::model_spec& spec, std::int32_t token);

/// The tiny preset with a chosen weight type.
model::model_spec tiny_spec(model::tensor_type type = model::tensor_type::f32);

/// A CPU pool sized for `tokens` positions of `m` in blocks of 16.
std::unique_ptr<gpu::cpu_memory_pool> make_pool(const model::llama_model& m, std::uint32_t tokens,
                                                std::uint32_t block_tokens = 16);

/// Deterministic token ids in [3, vocab) for prompts.
std::vector<std::int32_t> test_prompt(std::size_t n, std::uint32_t vocab, std::uint64_t salt);

/// Runs the engine until idle; returns each request's generated tokens by id.
std::vector<std::vector<std::int32_t>> run_to_completion(engine::inference_engine& eng,
                                                         std::size_t n_requests,
                                                         std::uint64_t* preemptions = nullptr);

/// A generation request of `max_tokens` for `prompt` (greedy unless `sp` says otherwise).
engine::generation_request request(std::uint64_t id, std::vector<std::int32_t> prompt, std::uint32_t max_tokens,
                                   engine::sampling_params sp = {});

/// One forward batch of every token of each (id, prompt), all wanting
/// logits, their KV reserved in `cache` (forward-level tests).
engine::forward_batch prompt_batch(engine::kv_cache& cache,
                                   const std::vector<std::pair<engine::seq_id, const std::vector<std::int32_t>*>>& seqs);

/// Whether two float vectors are bitwise equal (sizes included).
bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b);

/// The engine ISA variants this CPU can run, scalar first.
std::vector<engine::isa> runnable_isas();

/// Makes `v` the process's engine ISA for a scope, then restores the one before.
class isa_scope {
 public:
  explicit isa_scope(engine::isa v);
  ~isa_scope();
  isa_scope(const isa_scope&) = delete;
  isa_scope& operator=(const isa_scope&) = delete;

 private:
  engine::isa previous_;
};

}  // namespace exa::test
