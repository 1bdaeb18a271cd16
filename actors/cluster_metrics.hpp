#pragma once
// The metric families the cluster exports (GET /metrics), registered once per
// registry. Actors keep a shared pointer to this and update the series they
// own; every update is an atomic operation, safe from any thread.

#include <memory>
#include <string>
#include <string_view>

#include "metrics/metrics.hpp"

namespace exa::actors {

struct cluster_metrics {
  std::shared_ptr<metrics::registry> registry;
  metrics::counter_family* requests = nullptr;         // {model, tenant, outcome}
  metrics::counter_family* prompt_tokens = nullptr;    // {model}
  metrics::counter_family* generated_tokens = nullptr; // {model}
  metrics::histogram_family* ttft_ms = nullptr;        // {model, deployment, version, tenant}
  metrics::histogram_family* tpot_ms = nullptr;        // {model, deployment, version, tenant}
  metrics::histogram_family* e2e_ms = nullptr;         // {model, deployment, version, tenant}
  metrics::gauge_family* queue_depth = nullptr;        // {model}
  metrics::gauge_family* in_flight = nullptr;          // {model}
  metrics::gauge_family* replicas = nullptr;           // {state}
  metrics::gauge_family* kv_used_tokens = nullptr;     // {replica}
  metrics::gauge_family* kv_capacity_tokens = nullptr; // {replica}
  metrics::counter_family* resumes = nullptr;          // {model}: requests moved to another replica
  metrics::counter_family* replica_restarts = nullptr; // {node}
  metrics::gauge_family* node_replicas = nullptr;      // {node, state}: replica actors alive on the node
  metrics::gauge_family* nodes = nullptr;              // {health}: nodes the controller watches
  metrics::counter_family* node_health_changes = nullptr;  // {to}: suspect, confirmed, healthy
  metrics::gauge_family* device_memory = nullptr;      // {node, device, kind}: reserved, used
  metrics::gauge_family* device_temperature = nullptr; // {node, device}: where the device reports it (NVML)
  metrics::gauge_family* device_utilization = nullptr; // {node, device}: 0..1, where the device reports it (NVML)
  metrics::counter_family* drains = nullptr;           // {cause}: replicas the controller began draining
  metrics::counter_family* autoscale_decisions = nullptr;  // {deployment, direction}: up, down
  metrics::counter_family* rollout_transitions = nullptr;  // {deployment, phase}: started, step, complete, ...
  metrics::gauge_family* rollout_canary_percent = nullptr;  // {deployment}: traffic on the new version now
  metrics::counter_family* warm_pool_events = nullptr;  // {deployment, event}: take, return, refill
  metrics::gauge_family* warm_pool_standby = nullptr;   // {deployment}: loaded standbys now (pooled deployments only)
  metrics::gauge_family* warm_pool_wanted = nullptr;    // {deployment}: the pool size it keeps now (0 in a rollout)
  metrics::counter_family* migrations = nullptr;        // {reason}: slots placed on another node
  metrics::counter_family* heartbeat_misses = nullptr;  // {node}: heartbeat intervals that passed in silence
  metrics::counter_family* prefix_lookup_tokens = nullptr;  // {model}: prompt tokens looked up in prefix caches
  metrics::counter_family* prefix_hit_tokens = nullptr;     // {model}: of them, found cached
  metrics::gauge_family* prefix_cached_blocks = nullptr;    // {replica}: KV blocks a prefix cache holds now
  metrics::counter_family* prefix_evicted_blocks = nullptr;  // {model}: cached blocks dropped (turnover)
  metrics::counter_family* prefix_evicted_miss_tokens = nullptr;  // {model}: misses on lately evicted blocks
  metrics::counter_family* draft_proposed_tokens = nullptr;  // {model}: draft tokens the model verified
  metrics::counter_family* draft_accepted_tokens = nullptr;  // {model}: of them, accepted
  metrics::counter_family* stopped_steps = nullptr;          // {model}: engine steps stopped part way for an arrival
  metrics::counter_family* nonfinite_logits = nullptr;       // {model}: requests stopped for non-finite logits

  /// Registers every family in `registry` (a fresh one when null).
  static std::shared_ptr<cluster_metrics> create(std::shared_ptr<metrics::registry> registry = nullptr);

  /// The series of a family for one label value (created on first use);
  /// past the family's series cap, its _overflow series. The label counts
  /// here are fixed, so only the cap can refuse, and it never does.
  template <class Family>
  static auto* series(Family* f, std::string_view label) {
    return f->with_or_overflow({label}).value();
  }
  template <class Family>
  static auto* series(Family* f, std::string_view a, std::string_view b) {
    return f->with_or_overflow({a, b}).value();
  }
  template <class Family>
  static auto* series(Family* f, std::string_view a, std::string_view b, std::string_view c) {
    return f->with_or_overflow({a, b, c}).value();
  }
  template <class Family>
  static auto* series(Family* f, std::string_view a, std::string_view b, std::string_view c, std::string_view d) {
    return f->with_or_overflow({a, b, c, d}).value();
  }
};

}  // namespace exa::actors
