#pragma once
// What a replica drives: an inference engine that takes generation requests,
// runs continuous-batching steps and reports tokens as they are produced. The
// CPU engine (cpu_engine.hpp) runs a real model; later a simulated engine
// implements the same interface with a cost model.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "engine/kv_cache.hpp"
#include "engine/sampler.hpp"
#include "engine/tenant_usage.hpp"
#include "model/tokenizer.hpp"

namespace exa::engine {

struct generation_request {
  seq_id id = 0;
  /// Prompt token ids, used exactly as given (add BOS before, if wanted).
  std::vector<model::token_id> prompt;
  /// Tokens already generated and delivered elsewhere (request resume). They
  /// are prefilled after the prompt and never emitted again; sampling goes on
  /// from position resume_tokens.size() with the same seed.
  std::vector<model::token_id> resume_tokens;
  /// Total tokens to generate, resume_tokens included.
  std::uint32_t max_tokens = 16;
  sampling_params sampling;
  /// Generation ends when one of these is sampled; it is not emitted.
  std::vector<model::token_id> stop_tokens;
  /// Log-probabilities with each token (compute_logprobs): off by default,
  /// so a request that does not ask pays nothing. top_logprobs (at most
  /// max_top_logprobs) alternatives per token come with them.
  bool logprobs = false;
  std::uint32_t top_logprobs = 0;
  /// Who asked, for scheduling across tenants inside the replica
  /// (tenant_usage.hpp): the tenant ("" is the open one), its fair-share
  /// weight (> 0) and the request's priority class. With one tenant and one
  /// class, engines keep their first-come order.
  std::string tenant;
  double tenant_weight = 1;
  request_priority priority = request_priority::interactive;
};

/// nonfinite_logits: the token the sampler chose has a NaN or infinite logit,
/// which happens only when every logit is NaN or an infinity won: the model's
/// weights or activations overflowed (a broken or badly converted file, or a
/// faulty device). The sequence ends there; the token is not emitted.
enum class finish_reason { stop, length, cancelled, nonfinite_logits };
std::string_view to_string(finish_reason r) noexcept;
/// What a caller is told when its request ended with nonfinite_logits after
/// `generated` tokens.
std::string nonfinite_logits_message(std::uint32_t generated);

struct token_event {
  seq_id id = 0;
  model::token_id token = 0;
  std::uint32_t index = 0;  // position among generated tokens, 0-based
  /// Set only when the request asked for logprobs.
  std::optional<token_logprobs> logprobs;
};

struct finish_event {
  seq_id id = 0;
  finish_reason reason = finish_reason::stop;
  std::uint32_t generated = 0;  // total generated tokens, resume_tokens included
  /// Prompt tokens whose KV came from the prefix cache instead of being
  /// computed (at the request's first admission): OpenAI's
  /// usage.prompt_tokens_details.cached_tokens.
  std::uint32_t cached_tokens = 0;
};

struct step_result {
  std::vector<token_event> tokens;
  std::vector<finish_event> finished;
  std::uint32_t prefill_tokens = 0;  // prompt tokens computed this step
  std::uint32_t decode_tokens = 0;   // sequences that produced a token
  std::uint32_t preempted = 0;       // sequences pushed back to waiting
  /// The step stopped at a layer boundary for an arrival's prefill
  /// (offer_arrival) and produced nothing yet: the step after next completes it.
  bool yielded = false;
  /// Modeled duration of this step (simulated engines); 0 for engines that
  /// run for real (their time is measured, not modeled).
  double duration_s = 0;
};

struct engine_stats {
  std::uint32_t running = 0;
  std::uint32_t waiting = 0;
  std::uint32_t kv_capacity_tokens = 0;
  std::uint32_t kv_free_tokens = 0;
  std::uint64_t steps = 0;
  std::uint64_t generated_tokens = 0;
  std::uint64_t prefill_tokens = 0;
  std::uint64_t preemptions = 0;
  /// Sequences ended with finish_reason::nonfinite_logits.
  std::uint64_t nonfinite_logit_finishes = 0;
  /// Steps stopped at a layer boundary for a lighter arrival's prefill.
  std::uint64_t yielded_steps = 0;
  /// Prefix cache: prompt tokens looked up at admission, and how many of
  /// them were found cached (hit rate = hit / lookup); blocks held in the
  /// cache now (referenced or evictable).
  std::uint64_t prefix_lookup_tokens = 0;
  std::uint64_t prefix_hit_tokens = 0;
  std::uint32_t prefix_cached_blocks = 0;
  /// Cached blocks dropped from the prefix cache to make room (LRU) or
  /// replaced, since the engine started: its turnover. Once full, a cache
  /// evicts a block for each one it computes (kv_cache::evicted_blocks).
  std::uint64_t prefix_evicted_blocks = 0;
  /// Of the looked-up tokens not found (lookup - hit), those in blocks the
  /// cache had held and evicted among its last N evictions, N its size in
  /// blocks: what a cache about twice as large would have served too. High
  /// beside prefix_hit_tokens, the cache is too small for its prefixes.
  std::uint64_t prefix_evicted_miss_tokens = 0;
  /// Speculative decoding: draft tokens the target verified, and how many of
  /// them it accepted (acceptance rate = accepted / proposed).
  std::uint64_t draft_proposed_tokens = 0;
  std::uint64_t draft_accepted_tokens = 0;
  /// Bytes of the weight copies the engine holds (CPU engine: its forward's,
  /// a tensor-parallel group's members', a draft model's; weight_store.hpp),
  /// and whether the forward's were asked into huge pages.
  std::uint64_t weight_copy_bytes = 0;
  bool weight_huge_pages = false;
};

/// What a replica tells the router about its prefix cache: the chained block
/// hashes (model/prefix_hash.hpp) it holds, most recently used first.
struct prefix_summary {
  std::uint32_t block_tokens = 0;  // 0: no prefix cache
  std::vector<std::uint64_t> hashes;
};

/// Who a request about to be submitted is from (offer_arrival).
struct arrival_hint {
  /// The request's id (0: unknown). An offer whose request has been
  /// submitted by the time a step weighs it is ignored: the step's plan
  /// already had it.
  seq_id id = 0;
  std::string tenant;
  double tenant_weight = 1;
  request_priority priority = request_priority::interactive;
};

class inference_engine {
 public:
  virtual ~inference_engine() = default;

  /// Queues a request. Errors: invalid_argument (empty prompt, token out of
  /// vocabulary, prompt + max_tokens over the context length or the KV
  /// capacity, bad sampling parameters, top_logprobs over its bound,
  /// duplicate id), overloaded (waiting queue full), unsupported (logprobs
  /// asked of an engine without logits: the simulated and null engines).
  virtual expected<void> submit(generation_request request) = 0;
  /// Cancels a queued or running request and frees its KV blocks at once; the
  /// next step() reports it finished with reason cancelled. Unknown ids are
  /// ignored (the request may just have finished).
  virtual void cancel(seq_id id) = 0;
  /// True when nothing is queued or running.
  virtual bool idle() const = 0;
  /// Runs one batched step: every running sequence advances by one token or
  /// one prefill chunk.
  virtual step_result step() = 0;
  /// A request from `hint`'s tenant will be submitted once the step now
  /// running returns. The one call that may overlap step() (any thread). An
  /// engine that can stop a step part way (the CPU engine on one device:
  /// between layers, or between a layer's attention and its MLP; the CUDA
  /// engine likewise for its long steps, gpu/cuda_stage_pipeline.hpp) does so at
  /// the next such boundary when that request's prompt goes before the step
  /// in fair order (a light tenant beside tenants over their
  /// share, an interactive request beside batch work): that step returns
  /// `yielded` with nothing produced, the next one prefills such prompts
  /// alone (the arrival's first token leaves then), and the one after goes
  /// on with the stopped step (which may stop again, a stage or more later,
  /// for a later arrival) and completes it bitwise as it would have run. So
  /// the light prompt waits out about half a layer of a heavy step, not all
  /// of it. Other engines ignore the hint (the simulated one models the CPU
  /// engine's behaviour, or the CUDA engine's, when its layer_yield is set).
  virtual void offer_arrival(arrival_hint hint) { (void)hint; }
  virtual engine_stats stats() const = 0;
  /// The prefix cache's block hashes, at most `max_hashes`, most recently
  /// used first; an empty summary for engines without a prefix cache.
  virtual prefix_summary cached_prefixes(std::size_t max_hashes) const {
    (void)max_hashes;
    return {};
  }

  /// Why the engine has failed for good, or nullopt while it is healthy. A
  /// tensor-parallel engine fails when its group's collectives do (a member's
  /// device faulted, a collective timed out): its requests will not finish
  /// here, so the replica reports itself failed and they resume elsewhere.
  virtual std::optional<std::string> fault() const { return std::nullopt; }

  /// Simulated engines: how many replicas share this engine's device right
  /// now (memory bandwidth is split among them). Real engines ignore it.
  virtual void set_device_sharing(std::uint32_t active_replicas) { (void)active_replicas; }
  /// Simulated engines: cut the step last returned by step() short after
  /// `elapsed_s` of its modeled duration, at the first step boundary at or
  /// after it, so a request that arrived meanwhile joins there (as it would
  /// on a real engine). Returns the shortened step (what it produced, its
  /// new duration), or nullopt when the step cannot or need not be cut.
  virtual std::optional<step_result> truncate_last_step(double elapsed_s) {
    (void)elapsed_s;
    return std::nullopt;
  }
};

}  // namespace exa::engine
