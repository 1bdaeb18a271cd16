#include "actors/cluster_metrics.hpp"

#include "common/assert.hpp"

namespace exa::actors {
namespace {

// Latency bounds in ms, finer than the default at the low end: the serving
// path itself is sub-millisecond and worth seeing.
const std::vector<double> latency_bounds_ms = {0.1, 0.25, 0.5, 1,    2.5,  5,    10,   25,   50,
                                               100, 250,  500, 1000, 2500, 5000, 10000, 30000};

template <class T>
T must(expected<T> v) {
  EXA_ASSERT_MSG(v.has_value(), "metric family registration failed");
  return *v;
}

}  // namespace

std::shared_ptr<cluster_metrics> cluster_metrics::create(std::shared_ptr<metrics::registry> registry) {
  auto m = std::make_shared<cluster_metrics>();
  m->registry = registry ? std::move(registry) : std::make_shared<metrics::registry>();
  auto& r = *m->registry;
  m->requests = must(r.register_counter("exaserve_requests_total",
                                        "Requests by model, tenant (\"\" without keys or with an admin key) and "
                                        "outcome (completed, error, cancelled, refused).",
                                        {"model", "tenant", "outcome"}));
  m->prompt_tokens = must(r.register_counter("exaserve_prompt_tokens_total", "Prompt tokens of finished requests.", {"model"}));
  m->generated_tokens = must(r.register_counter("exaserve_generated_tokens_total", "Tokens streamed to clients.", {"model"}));
  // Latency per version: `model` is the deployment that served (NAME, or
  // NAME@V for a version a rollout added), `deployment` and `version` its
  // two parts (NAME and V, "1" for the plain name), so a rollout's versions
  // compare with `sum by (le, version)` over one deployment. Both follow
  // from `model`: they add no series.
  m->ttft_ms = must(r.register_histogram("exaserve_time_to_first_token_ms", "Request accepted to first token.",
                                         {"model", "deployment", "version", "tenant"}, latency_bounds_ms));
  m->tpot_ms = must(r.register_histogram("exaserve_time_per_output_token_ms",
                                         "Mean time per output token after the first, per request.",
                                         {"model", "deployment", "version", "tenant"}, latency_bounds_ms));
  m->e2e_ms = must(r.register_histogram("exaserve_request_duration_ms", "Request accepted to finished.",
                                        {"model", "deployment", "version", "tenant"}, latency_bounds_ms));
  m->queue_depth = must(r.register_gauge("exaserve_queue_depth", "Requests admitted and waiting for a replica.", {"model"}));
  m->in_flight = must(r.register_gauge("exaserve_requests_in_flight", "Requests admitted and not finished.", {"model"}));
  m->replicas = must(r.register_gauge("exaserve_replicas", "Replicas by lifecycle state.", {"state"}));
  m->kv_used_tokens = must(r.register_gauge("exaserve_kv_used_tokens", "KV cache tokens in use per replica.", {"replica"}));
  m->kv_capacity_tokens =
      must(r.register_gauge("exaserve_kv_capacity_tokens", "KV cache capacity in tokens per replica.", {"replica"}));
  m->resumes = must(r.register_counter("exaserve_request_resumes_total",
                                       "Requests resumed on another replica after theirs failed.", {"model"}));
  m->replica_restarts =
      must(r.register_counter("exaserve_replica_restarts_total", "Replicas restarted in place by their node.", {"node"}));
  m->node_replicas = must(r.register_gauge("exaserve_node_replicas",
                                           "Replicas running on a node by lifecycle state, as the node sees them.",
                                           {"node", "state"}));
  m->device_memory = must(r.register_gauge("exaserve_device_memory_bytes",
                                           "A device's memory: the region reserved at start, and the KV pages in use.",
                                           {"node", "device", "kind"}));
  m->device_temperature = must(r.register_gauge("exaserve_device_temperature_celsius",
                                                "A GPU's temperature, where its driver reports it (NVML); "
                                                "no series for devices that do not.",
                                                {"node", "device"}));
  m->device_utilization = must(r.register_gauge("exaserve_device_utilization_ratio",
                                                "A GPU's busy fraction over the driver's last sample period (NVML); "
                                                "no series for devices that do not report it.",
                                                {"node", "device"}));
  m->nodes = must(r.register_gauge("exaserve_nodes", "Nodes the controller's failure detector watches, by health.",
                                   {"health"}));
  m->node_health_changes = must(r.register_counter(
      "exaserve_node_health_changes_total", "Node health changes the failure detector decided, by the new health.",
      {"to"}));
  m->drains = must(r.register_counter("exaserve_drains_total",
                                      "Replicas the controller began draining, by cause (replica, node, shutdown, "
                                      "degraded).",
                                      {"cause"}));
  m->rollout_transitions = must(r.register_counter(
      "exaserve_rollout_transitions_total",
      "Rollout transitions, by deployment (plain name) and what happened: started, step, paused, resumed, "
      "complete, rolled_back, aborted.",
      {"deployment", "phase"}));
  m->autoscale_decisions = must(r.register_counter(
      "exaserve_autoscale_decisions_total",
      "Replica count changes the autoscaler made, by deployment and direction (up, down).",
      {"deployment", "direction"}));
  m->rollout_canary_percent = must(r.register_gauge(
      "exaserve_rollout_canary_percent", "Share of a deployment's traffic sent to the version being rolled out.",
      {"deployment"}));
  m->warm_pool_events = must(r.register_counter(
      "exaserve_warm_pool_events_total",
      "Warm-pool changes by deployment and event: take (a standby began serving), return (a serving replica "
      "stood by again), refill (a new replica was placed to stand by).",
      {"deployment", "event"}));
  m->warm_pool_standby = must(r.register_gauge(
      "exaserve_warm_pool_standby",
      "Loaded standbys of a deployment that has a warm pool (0 while its pool is empty or refilling).",
      {"deployment"}));
  m->warm_pool_wanted = must(r.register_gauge(
      "exaserve_warm_pool_wanted",
      "Standbys a deployment with warm_pool_percent above 0 keeps now: its share of the serving count, 0 while "
      "its pool is suspended by a rollout.",
      {"deployment"}));
  m->migrations = must(r.register_counter(
      "exaserve_migrations_total",
      "Slots the controller placed on another node, by reason: node_lost, or the drain cause (replica, node, "
      "shutdown, degraded, defrag), or orphaned (stopped by a predecessor's drain).",
      {"reason"}));
  m->heartbeat_misses = must(r.register_counter(
      "exaserve_heartbeat_misses_total",
      "Heartbeat intervals a node stayed silent through, counted once each as the failure detector sees them.",
      {"node"}));
  m->prefix_lookup_tokens = must(r.register_counter(
      "exaserve_prefix_cache_lookup_tokens_total",
      "Prompt tokens (with any resumed tokens) the replicas of a deployment looked up in their prefix caches at "
      "admission.",
      {"model"}));
  m->prefix_hit_tokens = must(r.register_counter(
      "exaserve_prefix_cache_hit_tokens_total",
      "Of the tokens looked up, those whose KV was found in the prefix cache and not computed again (hit rate = "
      "hit / lookup).",
      {"model"}));
  m->prefix_cached_blocks = must(r.register_gauge(
      "exaserve_prefix_cache_blocks", "KV blocks a replica's prefix cache holds now, in use or evictable.",
      {"replica"}));
  m->prefix_evicted_blocks = must(r.register_counter(
      "exaserve_prefix_cache_evicted_blocks_total",
      "Cached KV blocks the replicas of a deployment dropped from their prefix caches to make room (least recently "
      "used first) or to replace a stale entry: the caches' turnover. A full cache evicts a block for each one it "
      "computes; exaserve_prefix_cache_blocks over this rate is how long a cached prefix stays.",
      {"model"}));
  m->prefix_evicted_miss_tokens = must(r.register_counter(
      "exaserve_prefix_cache_evicted_miss_tokens_total",
      "Of the tokens looked up and not found, those whose blocks the replica's cache had held and evicted among its "
      "last N evictions (N its size in blocks): what caches about twice as large would have served too. High beside "
      "exaserve_prefix_cache_hit_tokens_total, the caches are too small for their prefixes (they thrash).",
      {"model"}));
  m->draft_proposed_tokens = must(r.register_counter(
      "exaserve_draft_proposed_tokens_total",
      "Speculative decoding: tokens the draft models of a deployment's replicas proposed and the model verified.",
      {"model"}));
  m->draft_accepted_tokens = must(r.register_counter(
      "exaserve_draft_accepted_tokens_total",
      "Of the draft tokens verified, those the model accepted (acceptance rate = accepted / proposed).", {"model"}));
  m->stopped_steps = must(r.register_counter(
      "exaserve_engine_stopped_steps_total",
      "Engine steps of a deployment's replicas stopped part way (at a layer boundary) so that a lighter tenant's "
      "arriving prompt ran first ([cluster] step_stop).",
      {"model"}));
  m->nonfinite_logits = must(r.register_counter(
      "exaserve_engine_nonfinite_logits_total",
      "Requests a deployment's replicas stopped because the model produced no finite logit (NaN or infinite "
      "values: weights or activations that overflow, or a faulty device); each one ended with an error.",
      {"model"}));
  return m;
}

}  // namespace exa::actors
