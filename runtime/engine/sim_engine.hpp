#pragma once
// The simulated engine: the inference_engine interface over a cost model
// instead of a model, so the real control plane (actors) can run a 256-node,
// 3072-replica cluster in virtual time. Continuous batching is modeled like
// the CPU engine's scheduler (admission within KV capacity and batch limits,
// prefill of the admitted prompts, decode steps for every running sequence;
// KV is reserved whole at admission, so nothing is preempted), but one step()
// covers a whole *macro step*: every decode step until the next sequence
// finishes, capped by a horizon -- the batch does not change in between, so
// its duration is computed in closed form instead of one event per token. A
// request that arrives meanwhile is joined exactly at the next step boundary
// via truncate_last_step(). Token ids are a deterministic function of the
// sequence (like the zero-cost engine), so resumed requests continue exactly.
//
// Across tenants (tenant_usage.hpp), once two tenants (or two priority
// classes) have work here, prompts are served in fair order instead of
// first come (interactive first, then the tenant served least lately) and
// prefilled one sequence after another, those of a tenant over its share in
// even chunks of at most fair_prefill_chunk tokens; every chunk ends at a
// step boundary, so a light tenant's request that arrives during a heavy
// tenant's prefill starts its own at the next chunk boundary instead of
// after the whole prompt, and a step that completes a prefill ends there, so
// its first token leaves at once. A sequence being prefilled holds its KV
// reservation and does not decode. A second tenant's first request that
// arrives while a one-tenant step prefills re-plans that step this way (see
// truncate_last_step). While it is over its share, a tenant keeps in the
// running set only what a decode step within fair_step_budget reads, so the
// step in flight when a light tenant's request arrives is short.

#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/engine.hpp"
#include "engine/evicted_hashes.hpp"
#include "engine/sim_step_stop.hpp"

namespace exa::engine {

/// What the cost model needs about a device (see cluster::device_spec for the
/// public presets it is built from).
struct sim_device {
  double memory_bandwidth_bytes_per_s = 3.35e12;  // H100 SXM
  double flops_per_s = 989e12;                    // dense fp16/bf16
  double int8_ops_per_s = 1979e12;
  double load_bytes_per_s = 2e9;                  // storage / network, for model loads
  double bandwidth_efficiency = 0.8;              // achievable share of peak bandwidth
  double compute_efficiency = 0.5;                // achievable share of peak compute (MFU)
};

/// What the cost model needs about a model (see cluster::model_shape).
struct sim_model {
  std::uint64_t parameters = 0;
  std::uint64_t weight_bytes = 0;           // as stored (precision included)
  std::uint64_t kv_bytes_per_token = 0;     // all layers, K and V
  std::uint32_t n_layers = 0;
  std::uint32_t dim = 0;
  std::uint32_t vocab_size = 32000;
  std::uint32_t context_length = 4096;
  bool int8_compute = false;                // int8/int4 weights: compute at int8 rate
};

/// Closed-form step times. Pure; documented formulas (docs/SIMULATION.md).
class sim_cost_model {
 public:
  sim_cost_model(sim_model model, sim_device device) : model_(model), device_(device) {}

  /// Prefill of `tokens` new prompt tokens that attend to `context_before`
  /// earlier ones: compute-bound, 2·params·tokens FLOPs for the matrices
  /// plus the attention term 4·layers·dim·tokens·(context_before + tokens/2).
  double prefill_s(std::uint64_t tokens, std::uint64_t context_before = 0) const;
  /// One decode step for `batch` sequences holding `context_tokens` in total,
  /// with `sharing` replicas splitting the device's bandwidth: the larger of
  /// the memory time (weights + KV read) and the compute time.
  double decode_step_s(std::uint32_t batch, std::uint64_t context_tokens, std::uint32_t sharing = 1) const;
  /// A decode step's reads (weights + KV of `context_tokens`) at the
  /// device's peak bandwidth, unshared: what the CUDA engine weighs to decide
  /// whether a decode step runs stage by stage (gpu::stoppable_step).
  double decode_read_s(std::uint64_t context_tokens) const;
  /// Model load: weight bytes over the load bandwidth.
  double load_s() const;

  const sim_model& model() const noexcept { return model_; }
  const sim_device& device() const noexcept { return device_; }

 private:
  /// Achievable matrix throughput: the int8 rate for int8_compute models,
  /// in prefill and decode alike, scaled by compute_efficiency.
  double compute_ops_per_s() const noexcept;

  sim_model model_;
  sim_device device_;
};

struct sim_engine_config {
  std::uint32_t max_running = 64;
  std::uint32_t max_waiting = 4096;
  std::uint32_t max_batch_tokens = 2048;  // prompt tokens prefilled per macro step; a longer prompt is admitted alone
  std::uint64_t kv_capacity_tokens = 1 << 20;
  double horizon_s = 2.0;                 // a macro step never models more than this
  /// A macro step that prefills ends after its prefill, so first tokens
  /// reach clients when they exist (exact TTFT; what the simulator uses).
  /// Off: prefill and the decode steps after it share one macro step (fewer
  /// events, TTFT late by up to a macro step).
  bool prefill_ends_step = false;
  /// Prefix cache block size in tokens; 0: no prefix cache. The cache is an
  /// LRU of chained block hashes (model/prefix_hash.hpp) of the prompts
  /// admitted, at most kv_capacity_tokens / prefix_block_tokens blocks: a
  /// sequence admitted with its first k blocks cached prefills only the
  /// rest (attending to the cached k). Blocks of generated tokens are not
  /// cached, and cached blocks do not lower a sequence's KV reservation
  /// (both err toward fewer savings).
  std::uint32_t prefix_block_tokens = 0;
  /// Across tenants: prompt tokens per prefill chunk (see above). A chunk
  /// costs at least one read of the weights.
  std::uint32_t fair_prefill_chunk = 128;
  /// Across tenants: a tenant over its share is admitted only while a decode
  /// step of the running set with it, every sequence at its reserved length
  /// (prompt + max_tokens), would take at most this many times one read of
  /// the weights (decode_step_s(0, 0)); one with nothing running here is
  /// always admitted. So the decode step in flight when a light tenant's
  /// request arrives is short. 0: no bound (the default: in
  /// bench/scenarios/fairness.json, 1.5 cost the flooding tenant a third of
  /// its throughput and did not lower the quiet tenant's p99; see
  /// docs/PERFORMANCE.md "Fairness across tenants").
  double fair_step_budget = 0;
  /// Model an engine that stops a step at a layer boundary for an arriving
  /// prompt that goes before the step's batch (offer_arrival; the CPU engine
  /// does this, the CUDA engine for its long steps: see the next two fields
  /// and set_step_stop): the decode step, or across
  /// tenants the prefill chunk, in flight is cut at the next of its
  /// 2 n_layers even stage boundaries (between layers, and between a layer's
  /// attention and its MLP) instead of its end, an interlude step prefills
  /// such prompts alone, and a remainder step finishes the stopped one after
  /// the rest of its time -- a decode step's tokens, or a chunk's prompt
  /// tokens (and the first token, when it completes the prompt) -- and may
  /// itself stop again. Off: arrivals wait for the decode step or chunk in
  /// flight.
  bool layer_yield = false;
  /// With layer_yield: a decode step whose reads at the device's peak
  /// bandwidth (sim_cost_model::decode_read_s, as the CUDA engine weighs
  /// them) take less than this runs whole; chunks stop whatever their
  /// length. 0: every step may stop.
  double layer_yield_min_decode_s = 0;
  /// With layer_yield: stage boundaries the stop comes after the first one
  /// at or after the arrival (0: the CPU engine, which asks between the
  /// stages it runs; 1: the CUDA engine, whose host asks one stage ahead).
  std::uint32_t layer_yield_lag_stages = 0;
  tenant_usage_config usage{};
};

/// Sets `c`'s layer_yield fields for `mode` on a model of `n_layers` layers.
void set_step_stop(sim_engine_config& c, sim_step_stop mode, std::uint32_t n_layers) noexcept;

/// "none", "every_step" or "long_steps" (for logs and reports).
const char* to_string(sim_step_stop mode) noexcept;

class sim_engine final : public inference_engine {
 public:
  sim_engine(sim_cost_model cost, sim_engine_config config);

  expected<void> submit(generation_request request) override;
  void cancel(seq_id id) override;
  bool idle() const override;
  /// A macro step: admissions and their prefill (first tokens at its end),
  /// then decode steps until the next finish or the horizon; duration_s set.
  step_result step() override;
  engine_stats stats() const override;
  void set_device_sharing(std::uint32_t active_replicas) override;
  /// Cuts the last macro step at its first boundary at or after elapsed_s
  /// (the end of its prefill part, or of a decode step) by undoing it and
  /// replaying it up to there. Requests submitted since stay waiting for the
  /// next step. Nullopt when that boundary is the step's end, or when a
  /// cancel of one of its sequences (or a reuse of an id it finished) has
  /// made it final. A step that prefilled first come (one tenant) while a
  /// request of another tenant or class has been submitted since is instead
  /// replayed as a step across tenants, cut at its first chunk boundary at
  /// or after elapsed_s, when that comes before the step's end. See
  /// docs/SIMULATION.md.
  std::optional<step_result> truncate_last_step(double elapsed_s) override;
  /// With layer_yield: the request the next truncate_last_step is for. Kept
  /// until the next step() begins (bounded; more are dropped).
  void offer_arrival(arrival_hint hint) override;
  prefix_summary cached_prefixes(std::size_t max_hashes) const override;

  const sim_cost_model& cost() const noexcept { return cost_; }

 private:
  /// One request as the simulation needs it: counters and a running hash,
  /// never the tokens themselves (O(1) state per sequence).
  struct seq {
    seq_id id = 0;
    std::uint64_t admit_order = 0;  // larger = admitted later
    std::uint32_t prompt_tokens = 0;
    std::uint32_t max_tokens = 0;   // resume tokens included
    std::uint32_t generated = 0;    // resume tokens included
    std::uint64_t hash = 0;         // FNV-1a over prompt + generated tokens
    // The two counters as the last macro step found them, so that
    // truncate_last_step() can roll the sequence back without a copy.
    std::uint32_t generated_before = 0;
    std::uint64_t hash_before = 0;
    bool done = false;              // finished within the current macro step
    std::vector<model::token_id> stop_tokens;
    std::vector<std::uint64_t> blocks;  // chained hashes of the context's full blocks (prefix cache)
    std::uint32_t cached_tokens = 0;    // of the context, found in the prefix cache at admission
    tenant_usage::slot tenant = 0;
    request_priority priority = request_priority::interactive;
    std::uint64_t arrival = 0;          // submit order
    // Across tenants, a running sequence may be part way through its
    // prefill: `prefilled` context tokens are computed. Kept as the last
    // macro step found them too, for the rollback.
    bool prefilling = false;
    std::uint32_t prefilled = 0;
    bool prefilling_before = false;
    std::uint32_t prefilled_before = 0;

    std::uint64_t kv_tokens() const noexcept { return std::uint64_t{prompt_tokens} + max_tokens; }
    std::uint64_t context() const noexcept { return std::uint64_t{prompt_tokens} + generated; }
  };

  /// What undoing the tail of the last macro step needs. Sequences untouched
  /// by it (waiting ones, later submissions) need nothing.
  struct last_step {
    bool valid = false;                 // a macro step ran and nothing since forbids undoing it
    /// layer_yield: it may be stopped at a layer boundary (like valid, but a
    /// step with one boundary, its end, qualifies too).
    bool layer_cuttable = false;
    bool has_prefill = false;           // boundaries_s[0] is the end of the prefill part
    bool fair = false;                  // scheduled across tenants (chunked prefill, fair order)
    std::size_t prefill_boundaries = 0; // boundaries_s[0..this) end prefill chunks (1 unless fair)
    std::vector<seq_id> prefill_order;  // fair: the sequences it prefilled, in order
    std::vector<char> prefill_chunked;  // fair: whether each was chunked
    std::vector<seq_id> chunk_seq;      // fair: the sequence of each prefill boundary's chunk
    tenant_usage::snapshot usage;       // state before it
    std::uint32_t sharing = 1;          // the bandwidth share it ran under
    std::uint32_t admitted = 0;         // sequences it admitted (and prefilled)
    std::uint64_t kv_used = 0;          // state before it
    std::uint64_t next_admit = 0;
    std::uint64_t arrivals = 0;         // submissions before it (submit order)
    engine_stats stats;
    std::vector<finish_event> pending;  // finishes decided before it (cancellations) that it reported
    std::vector<seq> finished;          // sequences it retired, kept until the next step
    std::vector<double> boundaries_s;   // its step boundaries; the last one is its duration
    /// Each decode step's reads at the device's peak bandwidth
    /// (sim_cost_model::decode_read_s), boundaries_s[prefill_boundaries + i]'s
    /// step: what layer_yield_min_decode_s is weighed against.
    std::vector<double> decode_read_s;
    /// Blocks its admissions prefilled: they enter the prefix cache when the
    /// step is final (begin_step), so undoing it has nothing to undo there.
    /// Sequences admitted in one step do not share blocks with each other.
    std::vector<std::uint64_t> cache_inserts;
  };

  /// The prefix cache: block hashes, most recently used first, bounded.
  class prefix_lru {
   public:
    explicit prefix_lru(std::size_t capacity_blocks) : capacity_(capacity_blocks), evicted_hashes_(capacity_blocks) {}
    /// Leading hashes of `blocks` held.
    std::size_t match(std::span<const std::uint64_t> blocks) const;
    /// Of `blocks` after the first `from`, the leading ones evicted among the
    /// last `capacity` evictions (evicted_hashes).
    std::size_t evicted_run(std::span<const std::uint64_t> blocks, std::size_t from) const;
    /// Inserts or refreshes each of `blocks`, the first becoming the most
    /// recent (a chain is evicted from its end, never its shared start),
    /// evicting the least recently used beyond the capacity.
    void touch(std::span<const std::uint64_t> blocks);
    std::vector<std::uint64_t> most_recent(std::size_t max) const;
    std::size_t size() const noexcept { return where_.size(); }
    /// Blocks evicted beyond the capacity since the start.
    std::uint64_t evicted() const noexcept { return evicted_; }

   private:
    std::size_t capacity_;
    std::uint64_t evicted_ = 0;
    evicted_hashes evicted_hashes_;
    std::list<std::uint64_t> order_;  // front: most recent
    std::unordered_map<std::uint64_t, std::list<std::uint64_t>::iterator> where_;
  };

  /// What a replay of a cut macro step keeps of it.
  struct replay {
    bool fair = false;
    std::uint32_t admitted = 0;  // not fair: sequences it admits
    std::vector<seq_id> order;   // fair: sequences it prefills, in order
    std::vector<char> chunked;   // fair: whether each was chunked (empty: decide afresh)
    std::size_t prefill_kept = 0;
    std::uint32_t decode_kept = 0;
    /// layer_yield: after the kept decode steps, the next one runs this long
    /// and stops there (its tokens owed); 0: none.
    double partial_s = 0;
    /// partial_s stops the prefill chunk after the prefill_kept ones instead
    /// (its prompt tokens owed), and nothing decodes.
    bool partial_prefill = false;
  };

  /// layer_yield: a decode step, or a prefill chunk, stopped at a layer
  /// boundary.
  struct owed_step {
    std::vector<seq_id> ids;     // its batch: each emits a token when it ends (a chunk: its one sequence)
    std::uint32_t prefill_tokens = 0;  // a chunk: its prompt tokens, computed when it ends; 0: a decode step
    double remaining_s = 0;      // its time still to run
    double layer_s = 0;          // one stage of it, half a layer (its stops are multiples)
    bool interlude_ran = false;  // the prompts it stopped for were prefilled
    bool interlude_admitted = false;  // its last interlude prefilled something
    std::uint64_t interlude_arrivals = 0;  // submissions before its last interlude
  };

  expected<void> check(const generation_request& r) const;
  void begin_step(std::uint32_t sharing);
  void run_macro(step_result& out, const replay* limits);
  void close_step(step_result& out);
  double admit(step_result& out, std::uint32_t admit_limit);
  bool contended() const;
  /// Sequences being prefilled, and waiting ones submitted before
  /// `arrived_before` (submit order), in fair order.
  std::vector<seq_id> fair_order(std::uint64_t arrived_before = std::numeric_limits<std::uint64_t>::max()) const;
  std::optional<step_result> replan_fair(double elapsed_s);
  step_result replay_last(const replay& limits);
  double prefill_fair(step_result& out, const replay* limits, bool& finished);
  std::uint64_t cached_prefix(const seq& s) const;
  void take_waiting(std::deque<seq>::iterator it, std::uint64_t cached);
  void charge_decodes();
  std::size_t token_bound(double prefill_s) const;
  void decode(step_result& out, double prefill_s, std::uint32_t decode_limit, double partial_s = 0);
  bool emit(seq& s, step_result& out);
  void retire();
  void rollback();
  // layer_yield (see the config).
  using member = std::pair<tenant_usage::slot, request_priority>;
  std::vector<member> members(const std::vector<seq_id>& ids) const;
  bool goes_before(const std::vector<member>& batch, tenant_usage::slot tenant, request_priority priority) const;
  bool offered_goes_before(const std::vector<member>& batch);
  bool run_interlude(step_result& out);
  bool waiting_goes_before(const std::vector<member>& batch, std::uint64_t since) const;
  void owed_time_only(double duration_s);
  void run_first_stage(step_result& out);
  void run_remainder(step_result& out);
  std::optional<step_result> cut_remainder(double elapsed_s);
  std::optional<step_result> cut_at_layer(double elapsed_s);
  // Where a decode step may stop: between layers and between each layer's
  // attention and MLP, as the CPU engine's forward pass does.
  double stages_per_step() const noexcept { return 2.0 * std::max<std::uint32_t>(cost_.model().n_layers, 1); }

  sim_cost_model cost_;
  sim_engine_config config_;
  std::vector<seq> running_;  // admission order: the order tokens are emitted in
  std::deque<seq> waiting_;
  std::unordered_set<seq_id> active_;  // ids running or waiting
  std::vector<finish_event> pending_finished_;
  std::uint32_t sharing_ = 1;
  std::uint64_t kv_used_ = 0;  // tokens reserved by running sequences
  std::uint64_t next_admit_ = 0;
  std::uint64_t next_arrival_ = 0;
  tenant_usage usage_;
  engine_stats stats_;
  last_step last_;
  prefix_lru prefix_;
  std::optional<owed_step> owed_;
  bool interlude_ = false;        // fair_order() lists only prompts that go before owed_
  bool last_was_remainder_ = false;  // the last step ran an owed step's rest
  owed_step last_owed_;              // owed_ as that step found it
  static constexpr std::size_t max_offers = 64;
  // offer_arrival may come from the replica's thread (held by pointer: the
  // engine stays movable).
  std::unique_ptr<std::mutex> offers_mu_ = std::make_unique<std::mutex>();
  std::vector<arrival_hint> offers_;
};

}  // namespace exa::engine
