#pragma once
// Continuous-batching policy: which sequences run in the next step and how
// many of their tokens, within a token budget and the KV cache. Sequences join
// and leave between steps; prefill is chunked so a long prompt cannot stall
// the decoding sequences; when the cache runs out the newest sequence is
// preempted (its blocks freed, recomputed later from prompt + generated
// tokens, which batch invariance makes exact). The oldest running sequence
// always progresses, so nothing deadlocks. With the prefix cache on, an
// admitted sequence (new or preempted) starts from the longest cached run of
// its tokens' blocks and computes only the rest, always at least its last
// token, whose logits it needs.
//
// Across tenants (tenant_usage.hpp), once two tenants (or two priority
// classes) have work here: prompts are prefilled and admitted in fair order
// (interactive first, then the tenant served least lately) instead of first
// come, and while such a prompt waits, the decodes of tenants over their
// share that have been served more than its tenant sit out the step (at most
// max_held_steps steps in a row), and so do their prompts' prefill chunks and
// admissions, so the light tenant's prefill runs in a short step of its own.
// A step already running when such a prompt arrives may stop for it at a
// layer boundary (arrival_preempts, plan_interlude; cpu_engine.hpp). Batch invariance makes this safe: which tokens share
// a step never changes what they compute. With fair_context_tokens, a
// tenant over its share keeps only that much context in the running set, so
// the decode steps a light tenant's prompt waits out stay short.

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "engine/engine.hpp"
#include "engine/kv_cache.hpp"
#include "engine/tenant_usage.hpp"

namespace exa::engine {

struct scheduler_config {
  std::uint32_t max_batch_tokens = 512;  // tokens computed per step
  std::uint32_t max_running = 64;        // sequences in the running set
  std::uint32_t max_waiting = 4096;      // queued sequences; more is overloaded
  std::uint32_t prefill_chunk = 256;     // prompt tokens per sequence per step
  /// Steps in a row that a heavy tenant's decodes may sit out for another
  /// tenant's prefill; the step after that runs them whatever waits.
  std::uint32_t max_held_steps = 2;
  /// Across tenants: a tenant over its share is admitted only while the
  /// running set's context with it, every sequence at prompt + max_tokens,
  /// stays within this many tokens (a decode step reads that context, so it
  /// bounds the step a light tenant's prompt waits out); one with nothing
  /// running is always admitted. 0: no bound (the default: the CPU engine
  /// has no cost model to size it from; see sim_engine's fair_step_budget).
  std::uint64_t fair_context_tokens = 0;
  /// Across tenants: prompt tokens prefilled per step, in all, for the
  /// tenants over their share beside the lightest tenant with work (0: no
  /// cap). Their prompts go in smaller pieces, so the steps a light prompt
  /// waits out (or stops part way) stay short; prefill is compute bound, so
  /// the pieces cost them about the same in all.
  std::uint32_t fair_prefill_tokens = 128;
  tenant_usage_config usage{};
};

struct sequence {
  generation_request request;
  std::vector<model::token_id> tokens;  // prompt, then every generated token
  std::uint32_t prompt_len = 0;
  std::uint32_t computed = 0;     // tokens whose K/V are in the cache
  std::uint64_t admit_order = 0;  // larger = admitted later
  bool is_running = false;
  bool was_admitted = false;      // admitted at least once (preemption re-admits)
  /// Prompt tokens taken from the prefix cache at the first admission.
  std::uint32_t cached_tokens = 0;
  tenant_usage::slot tenant = 0;  // the request's tenant (batch_scheduler's usage)
  std::uint64_t arrival = 0;      // enqueue order

  std::uint32_t generated() const noexcept {
    return static_cast<std::uint32_t>(tokens.size()) - prompt_len;
  }
  std::uint32_t pending() const noexcept {
    return static_cast<std::uint32_t>(tokens.size()) - computed;
  }
};

struct scheduled_chunk {
  sequence* seq = nullptr;
  std::uint32_t n_tokens = 0;  // tokens [computed, computed + n) run this step
};

class batch_scheduler {
 public:
  batch_scheduler(scheduler_config config, kv_cache& cache);

  const scheduler_config& config() const noexcept { return config_; }

  /// Takes ownership of a new sequence (validated by the engine).
  void enqueue(std::unique_ptr<sequence> seq);
  /// The sequence with this id, queued or running, or nullptr.
  sequence* find(seq_id id);
  /// Removes a sequence wherever it is and frees its blocks; false if unknown.
  bool remove(seq_id id);
  /// Removes a finished running sequence and frees its blocks.
  void finish(seq_id id);

  /// Plans the next step and reserves the KV blocks it writes. `preempted`
  /// counts sequences pushed back to waiting while planning.
  std::vector<scheduled_chunk> plan(std::uint32_t& preempted);

  /// Whether a request of `tenant` (weight, priority) about to arrive goes
  /// before `planned` in fair order -- some of it yields to the request and
  /// the rest is the request's own tenant's, in its class -- and would find
  /// room in the running set: then a step running `planned` should stop for
  /// its prefill (cpu_engine's yield). Interns the tenant.
  bool arrival_preempts(const std::vector<scheduled_chunk>& planned, std::string_view tenant, double weight,
                        request_priority priority);
  /// Whether a prompt submitted at or after `since` (arrivals(), enqueue
  /// order) and not yet admitted goes before `planned`, as arrival_preempts
  /// asks of one arriving: one submitted while a stopped step's interlude ran.
  /// Older waiting prompts are not asked: the interlude had them.
  bool waiting_preempts(const std::vector<scheduled_chunk>& planned, std::uint64_t since) const;
  /// Sequences enqueued so far (the next one's enqueue order).
  std::uint64_t arrivals() const noexcept { return next_arrival_; }
  /// The step that runs while a step of `suspended` waits part way: waiting
  /// prompts that go before it (as arrival_preempts), admitted in fair order
  /// into free blocks only (nothing is preempted) and prefilled, one chunk
  /// each. Empty when there are none.
  std::vector<scheduled_chunk> plan_interlude(const std::vector<scheduled_chunk>& suspended);

  std::size_t running() const noexcept { return running_.size(); }
  std::size_t waiting() const noexcept { return waiting_.size(); }
  bool empty() const noexcept { return running_.empty() && waiting_.empty(); }

  /// Tokens computed per tenant lately (what scheduling across tenants reads).
  const tenant_usage& usage() const noexcept { return usage_; }
  /// Takes back what planning `plan` charged (usage().halvings() was
  /// `charged_at` after it), except `kept`'s chunk: the step was dropped
  /// before it completed, and its other sequences will be charged again when
  /// their tokens are planned again. `kept` (the cancelled sequence, whose
  /// tokens will not run again) stays charged for the part that ran.
  void refund(const std::vector<scheduled_chunk>& plan, const sequence* kept, std::uint64_t charged_at);
  /// Decodes that sat out the last planned step for another tenant's prefill.
  std::uint32_t held_decodes() const noexcept { return held_decodes_; }

  /// Prefix cache: tokens looked up at first admissions, and those found.
  std::uint64_t prefix_lookup_tokens() const noexcept { return prefix_lookup_tokens_; }
  std::uint64_t prefix_hit_tokens() const noexcept { return prefix_hit_tokens_; }
  /// Of the looked-up tokens not found, those the cache had evicted lately
  /// (kv_cache::evicted_run_tokens), counted at first admission as the others.
  std::uint64_t prefix_evicted_miss_tokens() const noexcept { return prefix_evicted_miss_tokens_; }

 private:
  bool grow(std::vector<scheduled_chunk>& plan, sequence& seq, std::uint32_t n,
            std::uint32_t& budget, std::uint32_t& preempted);
  void preempt(sequence& victim, std::vector<scheduled_chunk>& plan, std::uint32_t& budget);
  sequence* newest_after(const sequence& seq);
  void admit(std::vector<scheduled_chunk>& plan, std::uint32_t& budget, bool fair,
             const std::vector<scheduled_chunk>* only_before = nullptr, const sequence* favoured = nullptr);
  void attach_cached(sequence& seq);
  bool contended() const;
  fair_key key(const sequence& seq, std::uint64_t order) const;
  const sequence* favoured_prefill() const;
  bool yields_to(const sequence& decoding, const sequence& favoured) const;
  bool yields_to(const sequence& decoding, tenant_usage::slot tenant, request_priority priority) const;
  bool goes_before(const std::vector<scheduled_chunk>& planned, tenant_usage::slot tenant,
                   request_priority priority) const;
  bool within_context_budget(const sequence& candidate) const;
  std::optional<tenant_usage::slot> lightest_with_work() const;
  // The tokens a capped (over its share) sequence may prefill in the step
  // being planned: fair_prefill_tokens in all.
  std::uint32_t prefill_allowance(const sequence& seq, std::uint32_t n) const;

  scheduler_config config_;
  kv_cache& cache_;
  std::deque<std::unique_ptr<sequence>> waiting_;
  std::vector<std::unique_ptr<sequence>> running_;  // admission order, oldest first
  std::uint64_t next_admit_ = 1;
  std::uint64_t next_arrival_ = 0;
  tenant_usage usage_;
  // While planning a step across tenants: the lightest tenant with work,
  // and what the tenants over their share beside it may still prefill.
  std::optional<tenant_usage::slot> lightest_;
  std::uint32_t heavy_prefill_left_ = 0;
  std::uint32_t held_steps_ = 0;    // consecutive steps that held decodes back
  std::uint32_t held_decodes_ = 0;  // in the last step
  std::uint64_t prefix_lookup_tokens_ = 0;
  std::uint64_t prefix_hit_tokens_ = 0;
  std::uint64_t prefix_evicted_miss_tokens_ = 0;
};

}  // namespace exa::engine
