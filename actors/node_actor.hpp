#pragma once
// A node: one host. It supervises its devices and its model cache (static
// children, one_for_one, with restart intensity) and the replicas the
// controller places on it (dynamic children: a crashed replica is restarted
// in place until its slot crash-loops, then quarantined and reported failed so
// the controller places it elsewhere). It also sends the health monitor a
// heartbeat every interval.

#include <caf/fwd.hpp>

#include <atomic>
#include <chrono>
#include <limits>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>

#include "actors/chaos_hooks.hpp"
#include "actors/device_actor.hpp"
#include "actors/messages.hpp"
#include "actors/supervisor.hpp"
#include "gpu/device.hpp"
#include "cluster/clock_offset.hpp"
#include "cluster/degradation.hpp"
#include "cluster/restart_intensity.hpp"

namespace exa::actors {

struct cluster_metrics;

struct node_config {
  cluster::node_id id = 0;
  cluster::rack_id rack = 0;
  std::string region;  // "" = none
  std::uint32_t devices = 1;
  device_config device;         // template: node, index and the opener are filled in
  /// The kind of this node's devices (reported when it joins).
  gpu::device_kind device_kind = gpu::device_kind::cpu;
  /// Devices opened before the node started (gpu::open_devices: a process's
  /// GPUs), one per index; a restarted device actor takes the same one
  /// again. Empty: each device actor opens a fresh device of device_kind.
  std::vector<std::shared_ptr<gpu::device>> opened_devices;
  std::uint64_t model_cache_bytes = 64ull << 30;  // model files kept loaded, in bytes (in-use ones always stay)
  std::string model_dir;  // where models missing at their path are looked for (by sha256, then name)
  std::string model_store;      // operator's model store: models found nowhere on the node are fetched from it
  std::string model_cache_dir;  // this node's own directory for fetched models (needed with a store)
  std::uint32_t heartbeat_interval_ms = 2000;
  std::uint32_t replica_max_restarts = 3;      // per slot, within the window
  std::uint32_t replica_restart_window_ms = 60000;
  std::uint32_t replica_step_timeout_ms = 60000;
  bool replica_step_stop = true;  // replica_context::step_stop
  std::uint32_t device_check_interval_ms = 30000;  // device health checks
  std::uint32_t device_check_timeout_ms = 5000;    // a check unanswered this long: hung
  /// No heartbeat ack for this long: the control plane has (or is about to
  /// have) declared this node failed and moved its slots -- stop serving
  /// them first, so a slot never has two serving replicas. Set below the
  /// monitor's confirmation time (k × interval + window). 0: never.
  std::uint32_t lease_ms = 0;
  std::shared_ptr<cluster_metrics> metrics;  // may be null
  chaos_hooks hooks;
  std::string address;  // host:port this node's process publishes its hub on ("" embedded)
  std::string engine;   // "" = as each replica spec says; "cpu" or "null" overrides it
  cluster::degradation_config degradation;  // when its replicas count as degraded
  /// Stamp heartbeats with the actor clock instead of the host's wall clock
  /// (virtual time, where the wall clock would mean nothing).
  bool wall_clock_from_actor_clock = false;
  /// Simulation: model files the node's cache holds at start (a warm cache
  /// with no directory to scan); announced in its join like scanned ones.
  std::vector<cluster::cached_file> simulated_cache;
};

struct node_context {
  node_config config;
  caf::actor controller;
  caf::actor router;
  caf::actor health_monitor;
};

struct node_state {
  node_context ctx;
  std::optional<supervisor> sup;  // devices and model cache
  struct replica_entry {
    replica_spec spec;
    caf::actor handle;
    cluster::restart_intensity intensity;
    bool stopping = false;  // told to stop: a crash now ends it instead of restarting it
  };
  std::map<cluster::replica_id, replica_entry> replicas;
  std::uint64_t heartbeat_sequence = 0;
  cluster::clock_offset_estimator clock;
  std::optional<std::int64_t> logged_offset_ns;  // the clock offset last written to the event log
  std::int64_t last_ack_ns = 0;
  bool self_fenced = false;
  /// The controller's process went away while our lease was good: nobody
  /// can give our slots away until a controller returns, and a returning
  /// one reconciles with what we report, so the lease is held meanwhile.
  bool lease_held = false;
  /// Until when (actor clock, ns) this node's replicas may serve: the last
  /// ack plus the lease, or forever while the lease is held or there is
  /// none. Replicas check it before every submit and step, so a node that
  /// wakes from a freeze serves nothing before its own lease check runs.
  std::shared_ptr<std::atomic<std::int64_t>> lease_until =
      std::make_shared<std::atomic<std::int64_t>>(std::numeric_limits<std::int64_t>::max());
  bool powered_off = false;  // chaos: the host lost power; this actor only stands in for its silence
  /// What the model cache last said it holds (announced again if it cannot answer in time).
  std::vector<cluster::cached_file> cache_files;
  std::uint64_t replica_restarts = 0;
  static inline const char* name = "node";
};

/// uplink -> node: the control plane is unreachable (its process closed the
/// connection) or back; when back, the node joins again with its replicas.
struct control_plane_state {
  bool reachable = true;
  /// While unreachable: true when no controller is up at all (its process
  /// closed the connection, reconnects are refused), so nothing can move our
  /// slots and the lease may be held; false once a reconnect timed out (a
  /// controller may be up but cut off from us), which starts a fresh lease.
  bool hold_allowed = true;
};

caf::behavior node_actor(caf::stateful_actor<node_state>* self, node_context ctx);

}  // namespace exa::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::control_plane_state)
