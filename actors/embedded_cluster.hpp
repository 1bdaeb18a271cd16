#pragma once
// The embedded cluster: N nodes × G devices as actors in this process, the
// supervision tree of ARCHITECTURE.md, and the gateway backend the front
// doors talk to. This header keeps CAF out of its includers.

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "api/gateway.hpp"
#include "cluster/storage_model.hpp"
#include "common/error.hpp"
#include "engine/sim_step_stop.hpp"

namespace caf {
class actor_system;
namespace scheduler {
class test_coordinator;
}
}  // namespace caf

namespace exa::metrics {
class registry;
}
namespace exa::cluster {
class fault_injector;
class event_log;
}

namespace exa::actors {

struct sim_storage_stats;

struct cluster_options {
  std::uint32_t nodes = 2;
  std::uint32_t devices_per_node = 2;
  std::uint32_t racks = 1;                         // nodes spread round-robin over racks
  std::uint32_t regions = 0;                       // 0: none; else nodes spread round-robin over r0, r1, ...
  std::string gateway_region;                      // the embedded gateway's region ("" = none)
  /// Several gateways in one process (tests): "the router" is a hub that
  /// routers subscribe to (subscribe_msg, then gateway_join to the
  /// controller) instead of one router; the backend then has no router.
  bool routers_subscribe = false;
  std::uint64_t device_memory_bytes = 1ull << 30;  // ledger capacity and KV region per device
  std::size_t kv_page_bytes = 32 * 1024;
  std::uint32_t device_threads = 1;                // engine worker threads per device
  /// The kind of the nodes' devices: "cpu", "cuda" (every node's devices on
  /// GPUs of this host, nodes × devices_per_node of them; too few is an
  /// `unavailable` error naming why) or "auto" (CUDA when there are enough
  /// GPUs, else CPU, saying why). Simulated engines ignore it.
  std::string device_kind = "cpu";
  std::uint32_t scheduler_threads = 0;             // CAF workers; 0 = cores
  std::string engine = "cpu";                      // "cpu", "null" (zero-cost) or "sim" (cost model)
  std::string sim_gpu = "h100-80gb";               // engine "sim": the device preset simulated
  /// engine "sim": prefix cache block size of the simulated engines (0: none).
  std::uint32_t sim_prefix_block_tokens = 0;
  /// engine "sim": whether and how the simulated engines stop a decode step
  /// or a prefill chunk at a layer boundary for a lighter arrival, as the CPU
  /// engine (every_step) or the CUDA engine (long_steps) does
  /// (engine::sim_step_stop).
  engine::sim_step_stop sim_step_stop = engine::sim_step_stop::none;
  std::string default_model_file;                  // for deployments naming no file
  std::uint32_t default_kv_tokens = 4096;
  std::string default_routing = "least_outstanding";
  std::vector<api::deploy_request> deployments;    // deployed at start
  std::uint32_t heartbeat_interval_ms = 2000;
  std::uint32_t suspect_after_missed = 5;        // k missed heartbeats: suspect
  std::uint32_t observation_window_ms = 30000;   // then silent this long: confirmed
  std::uint32_t device_check_interval_ms = 30000;
  std::uint32_t device_check_timeout_ms = 5000;
  std::uint32_t step_timeout_ms = 60000;         // an engine step this slow: the device is hung
  /// Engines may stop a step part way for a lighter tenant's arriving prompt
  /// (replica_context::step_stop; the CPU engine, the CUDA engine's long
  /// steps, and simulated ones with sim_step_stop). Off: an arrival waits
  /// for the step in flight.
  bool step_stop = true;
  std::uint32_t migration_parallelism = 4;       // replacements warming at once
  std::uint32_t drain_deadline_ms = 60000;       // a drain naming no deadline
  std::uint32_t degraded_replace_after_ms = 120000;  // degraded this long: replaced (0: never)
  std::uint32_t degraded_step_ms = 5000;         // median step latency above this: degraded (0: never)
  std::uint32_t degraded_error_percent = 50;     // failed requests above this share: degraded
  std::uint32_t loads_max = 32;                  // replicas loading at once, cluster-wide
  std::uint32_t loads_per_node_max = 4;          // replicas loading at once, per node
  std::uint32_t rollout_bake_s = 300;            // a rollout step naming no bake time runs this long
  std::uint32_t rollout_min_samples = 100;       // requests of each version per step before a verdict
  // The tolerance: the new version's p99 may exceed the old one's by this
  // ratio plus this slack, its error rate the old one's by these points.
  std::uint32_t rollout_latency_percent = 20;
  std::uint32_t rollout_latency_slack_ms = 5;
  std::uint32_t rollout_error_points = 1;
  std::uint32_t rollout_tick_ms = 1000;          // how often the controller judges and moves a rollout
  std::uint32_t rollout_start_timeout_ms = 300000;  // replicas of a step not ready this long: rolled back
  std::uint32_t rollout_drop_grace_ms = 5000;    // the losing version serves this long after the end
  // Autoscaling (deployments name min, max, metric and target): the mean
  // over the up window scales up, the peak over the down window scales
  // down, each at most once per its cooldown; a change within the
  // tolerance is none.
  std::uint32_t autoscale_up_window_s = 10;
  std::uint32_t autoscale_down_window_s = 300;
  std::uint32_t autoscale_up_cooldown_s = 10;
  std::uint32_t autoscale_down_cooldown_s = 120;
  std::uint32_t autoscale_tolerance_percent = 10;
  std::uint32_t autoscale_max_down_percent = 25;  // of the replicas, per decision
  std::uint32_t autoscale_tick_ms = 1000;
  std::uint64_t model_cache_bytes = 64ull << 30;  // per node: model files kept loaded (in-use ones always stay)
  std::string model_store;                       // models found nowhere on a node are fetched from here
  std::string model_cache_dir;                   // fetched models go to <dir>/node-N (needed with model_store)
  std::uint32_t max_attempts = 4;                // replicas one request may try
  std::uint32_t request_deadline_ms = 120000;
  std::uint32_t queued_per_model_max = 1024;
  std::uint32_t queued_global_max = 4096;
  std::uint32_t in_flight_per_replica_max = 64;
  std::string chat_template;  // router_config::chat_template ("": each file's own)
  /// Requests waiting for full replicas are served in fair order across
  /// tenants (fair_queue.hpp); false: first come, first served.
  bool fair_across_tenants = true;
  std::uint32_t tenant_headroom_slots = 2;  // router_config::tenant_headroom_slots
  /// Deterministic mode for tests: CAF's test scheduler in virtual time, and
  /// devices run inline instead of on their own threads.
  bool deterministic = false;
  /// Deterministic mode: engine steps take their modeled cost in virtual
  /// time instead of none, so requests are in flight when faults land.
  bool model_step_time = false;
  /// Chaos harness hooks (null outside chaos runs).
  std::shared_ptr<cluster::fault_injector> fault_injector;
  std::shared_ptr<cluster::event_log> event_log;
  std::shared_ptr<std::atomic<std::uint64_t>> device_busy_us;  // simulation: device busy time
  /// engine "sim": model the model store and the nodes' disks that loads
  /// read (cluster::storage_model, sim_storage_actor); unset: every load
  /// takes a fixed modeled time.
  std::optional<cluster::storage_config> sim_storage;
  /// With sim_storage: nodes whose cache holds every deployment's model
  /// file at start (they announce it when they join, as a scanned cache).
  std::vector<std::uint32_t> sim_warm_nodes;
  /// With sim_storage: what the storage saw (filled as the run goes).
  std::shared_ptr<sim_storage_stats> storage_stats;
  /// Cache-aware placement and loads (controller_config::cache_affinity).
  bool cache_affinity = true;
  /// Night-time consolidation of autoscaled deployments (controller_config::consolidate).
  bool consolidate = false;
};

class embedded_cluster {
 public:
  static expected<std::unique_ptr<embedded_cluster>> start(cluster_options options);
  ~embedded_cluster();

  /// What the HTTP and RPC front doors call.
  std::shared_ptr<api::gateway_backend> backend() const;
  std::shared_ptr<metrics::registry> metrics() const;

  caf::actor_system& system();
  /// The test scheduler in deterministic mode, else nullptr.
  caf::scheduler::test_coordinator* test_scheduler();

  /// Shuts the tree down and waits for every actor to finish.
  void stop();

 private:
  struct impl;
  explicit embedded_cluster(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace exa::actors
