#pragma once
// A replica: one engine instance serving one deployment slot. It walks the
// lifecycle (creating → loading → warming → ready ⇄ serving → draining →
// stopped; failed on errors), reports each transition to the controller and
// the router, takes requests, and runs its continuous-batching loop by sending
// one engine step at a time to its device. Tokens go straight to each
// request's actor. Engine calls never overlap a step on the device thread:
// while a step is out, submissions and cancellations wait in `deferred`.

#include <caf/fwd.hpp>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>

#include "actors/chaos_hooks.hpp"
#include "actors/messages.hpp"
#include "cluster/degradation.hpp"
#include "cluster/lifecycle.hpp"

namespace exa::actors {

struct cluster_metrics;

struct replica_context {
  replica_spec spec;
  cluster::node_id node = 0;
  caf::actor device;                // where its steps run: the first of `devices`
  std::vector<caf::actor> devices;  // its whole placement (tensor-parallel group), ascending
  caf::actor model_cache;
  caf::actor controller;
  caf::actor router;
  std::uint32_t step_timeout_ms = 60000;      // a step taking longer means a hung device
  /// Offer arrivals to the engine while a step is in flight, so it may stop
  /// the step part way for a lighter tenant's prompt (engine.hpp,
  /// offer_arrival). Off: arrivals wait for the step in flight.
  bool step_stop = true;
  std::uint32_t load_report_interval_ms = 5;  // at most one load report per interval
  /// Prefix-cache block hashes (8 bytes each) a load report carries at most,
  /// for prefix-aware routing; 0: none.
  std::uint32_t prefix_hashes_reported = 512;
  chaos_hooks hooks;
  /// The node's metrics (replicas by state, KV use); null: none.
  std::shared_ptr<cluster_metrics> metrics;
  /// The node's lease (node_state::lease_until); null: no lease.
  std::shared_ptr<const std::atomic<std::int64_t>> lease_until;
  /// When the replica counts as degraded (slow steps, failing requests).
  cluster::degradation_config degradation;
};

struct replica_actor_state {
  replica_context ctx;
  cluster::replica_state state = cluster::replica_state::creating;
  std::shared_ptr<const model::llama_model> model;
  std::shared_ptr<const model::llama_model> draft;  // spec.draft_model, loaded; null without one
  /// Built by the device (it holds the device's pool and threads until it goes).
  std::shared_ptr<engine::inference_engine> engine;
  /// A tensor-parallel engine: aborts its group's collectives (a member
  /// device was lost), so a step out on the device returns at once.
  std::function<void(const std::string&)> abort_group;
  bool step_in_flight = false;  // no new step may start (one is out, or deferred work runs)
  bool step_out = false;        // a step is on the device: the engine must not be touched
  std::vector<std::function<void()>> deferred;  // engine calls waiting for the step to return
  struct active_request {
    caf::actor requester;
    std::uint32_t prompt_tokens = 0;
    std::uint32_t max_tokens = 0;
    std::uint32_t generated = 0;
    bool first_token_seen = false;  // prefill done
    std::string request_id;         // the client's, for log lines
  };
  std::map<std::uint64_t, active_request> active;
  double decode_tokens_per_s = 0;   // EWMA of decode-only steps
  double prefill_tokens_per_s = 0;  // EWMA of steps with prefill
  std::int64_t last_load_report_ns = 0;
  /// The engine's prefix-cache counters as last added to the metrics (the
  /// engine's count from its start; the metrics grow by the difference).
  std::uint64_t prefix_lookup_exported = 0;
  std::uint64_t prefix_hit_exported = 0;
  std::uint64_t prefix_evicted_exported = 0;
  std::uint64_t prefix_evicted_miss_exported = 0;
  std::uint64_t draft_proposed_exported = 0;  // the same for speculative decoding's counters
  std::uint64_t draft_accepted_exported = 0;
  std::uint64_t stopped_steps_exported = 0;
  std::uint64_t nonfinite_logits_exported = 0;
  std::optional<cluster::degradation_detector> health;  // set at start from ctx.degradation
  bool probe_out = false;
  bool model_requested = false;  // acquire_model sent: released at the end even if the answer never came
  bool draft_requested = false;  // the same for spec.draft_model
  bool sim_storage_loaded = false;  // simulation: the model's bytes came through the modelled storage
  bool fenced_while_draining = false;  // logged once  // a probe (warm-up id) is in the engine
  static inline const char* name = "replica";
  ~replica_actor_state();
};

caf::behavior replica_actor(caf::stateful_actor<replica_actor_state>* self, replica_context ctx);

/// The id the warm-up pass uses inside the engine (never a client request).
inline constexpr std::uint64_t warmup_request_id = ~std::uint64_t{0};

}  // namespace exa::actors
