#pragma once
// The CPU inference engine: a Llama model, a paged KV cache on a device block
// pool, the continuous-batching scheduler, the batched forward pass and the
// sampler. One instance per replica; the model and the thread pool may be
// shared with other replicas (calls into one engine must not overlap).

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/batch_scheduler.hpp"
#include "engine/engine.hpp"
#include "engine/kv_cache.hpp"
#include "engine/llama_forward.hpp"
#include "engine/sampler.hpp"
#include "engine/speculative.hpp"
#include "model/llama_model.hpp"

namespace exa::engine {

class thread_pool;

struct cpu_engine_config {
  scheduler_config scheduler;
  std::uint32_t kv_block_tokens = 16;
  /// This replica's share of the device pool in blocks (0: the whole pool).
  /// Shares on one device must not add up to more than the pool, so that
  /// every replica can always reach its own share.
  std::uint32_t kv_max_blocks = 0;
  /// Share KV blocks between sequences with the same token prefix (kv_cache.hpp).
  bool prefix_cache = true;
  /// How the prefix cache copies a shared block on copy-on-write when the KV
  /// pool is device memory (the CUDA engine's stream); empty: memcpy.
  block_copier kv_block_copy;
  /// Speculative decoding (speculative.hpp): a draft model with the target's
  /// vocabulary proposes `draft_tokens` tokens per step for each decoding
  /// sequence; none without a draft. Check the pair with check_draft() first.
  std::shared_ptr<const model::llama_model> draft;
  std::uint32_t draft_tokens = default_draft_tokens;
  /// Where the engine's forward pass reads its weights (weight_store.hpp):
  /// copies of its own in huge pages by default.
  resident_options weights;
};

class cpu_engine final : public inference_engine {
 public:
  /// `pool` provides the KV blocks (block_bytes() >= kv_block_bytes()).
  cpu_engine(std::shared_ptr<const model::llama_model> model, block_pool& pool,
             thread_pool& threads, cpu_engine_config config = {});
  /// An engine whose batches run on `forward` instead of a forward pass of
  /// its own: a tensor-parallel group (tp_engine.hpp builds one). `pool`
  /// gives the scheduler's KV accounting, in blocks `kv_dim` wide (a member's
  /// share). No draft model (speculative decoding needs a forward of its own);
  /// config.prefix_cache must be off when `forward` keeps its KV elsewhere.
  cpu_engine(std::shared_ptr<const model::llama_model> model, block_pool& pool, std::uint32_t kv_dim,
             std::unique_ptr<forward_executor> forward, cpu_engine_config config);

  /// Bytes of one KV block for this model and block size (to size the pool).
  static std::size_t kv_block_bytes(const model::llama_config& c, std::uint32_t block_tokens);

  expected<void> submit(generation_request request) override;
  void cancel(seq_id id) override;
  bool idle() const override;
  step_result step() override;
  /// Stops the running step at its next layer boundary when the arrival
  /// goes before all of it (engine.hpp). Only on one device without a draft
  /// model: a tensor-parallel group's layers are collectives, and a
  /// speculative step's draft has run already.
  void offer_arrival(arrival_hint hint) override;
  engine_stats stats() const override;
  prefix_summary cached_prefixes(std::size_t max_hashes) const override;
  /// Why the engine failed: its forward did (a tensor-parallel group's
  /// collective was aborted). A failed engine runs nothing more: submit()
  /// refuses with unavailable, step() only reports cancellations, idle() is
  /// true once they are reported.
  std::optional<std::string> fault() const override { return fault_; }

  const model::llama_model& model() const noexcept { return *model_; }
  const kv_cache& cache() const noexcept { return cache_; }
  /// The tenant's usage in the scheduler (tokens charged lately over its
  /// weight); 0 for a tenant it has not seen.
  double tenant_usage_of(std::string_view tenant) const;
  /// The draft side of speculative decoding; null without a draft model.
  const speculator* speculation() const noexcept { return spec_.get(); }

 private:
  expected<void> check(const generation_request& r) const;
  /// Samples (or takes `decided`), emits and advances; false when that
  /// finished the sequence (it is gone then).
  bool sample_and_advance(sequence& seq, const float* logits, step_result& out,
                          std::optional<model::token_id> decided = std::nullopt);
  // A planned step's batch and the sequences whose logits it returns.
  forward_batch build_batch(const std::vector<scheduled_chunk>& plan, std::vector<sequence*>& wants_logits,
                            step_result& out);
  // After a step's forward: advances, publishes, samples and emits.
  void finish_step(const std::vector<scheduled_chunk>& plan, const std::vector<sequence*>& wants_logits,
                   step_result& out);
  // step() while a step is suspended: its interlude, then the rest of it.
  void continue_suspended(step_result& out);
  // At a layer boundary of `plan`'s forward: whether an arrival offered
  // meanwhile goes before all of it (consumes the offers).
  bool arrival_preempts(const std::vector<scheduled_chunk>& plan);
  // Drops the offers not taken (after a step its forward ran whole).
  void discard_offers();
  // Speculative decoding hooks (speculative.hpp).
  void append_proposals(forward_batch& batch, const sequence& seq, std::uint32_t index);
  void emit_speculated(const std::vector<sequence*>& wants_logits, step_result& out);

  std::shared_ptr<const model::llama_model> model_;
  cpu_engine_config config_;
  kv_cache cache_;
  batch_scheduler scheduler_;
  std::unique_ptr<forward_executor> forward_;
  sampler sampler_;
  std::vector<float> logits_;
  std::vector<finish_event> pending_finished_;  // cancellations, reported next step
  engine_stats stats_;
  std::unique_ptr<speculator> spec_;  // null without a draft model
  std::optional<std::string> fault_;  // set when a forward failed

  // A step stopped at a layer boundary for an arrival (offer_arrival): its
  // plan and batch as they were, until the step after its interlude ends it.
  struct suspended_step {
    std::vector<scheduled_chunk> plan;
    forward_batch batch;
    std::vector<sequence*> wants_logits;
    std::uint32_t prefill_tokens = 0;
    bool interlude_ran = false;
    bool interlude_admitted = false;   // its last interlude prefilled something
    std::uint64_t interlude_arrivals = 0;  // the scheduler's arrivals() when it was planned
    // The usage's halvings() after its plan was charged. Should the plan's
    // own charge have crossed a halving, the chunks charged before it are
    // refunded in full (clamped at zero): off by half a step's tokens at
    // most, once a window.
    std::uint64_t charged_at = 0;
  };
  std::optional<suspended_step> suspended_;
  forward_suspension suspension_;
  // Offered arrivals (any thread), bounded: past the bound, offers are
  // dropped (the request then waits for the step, as without offers).
  static constexpr std::size_t max_offers = 64;
  std::mutex offers_mu_;
  std::vector<arrival_hint> offers_;
  std::atomic<bool> offered_{false};
};

}  // namespace exa::engine
