#pragma once
// The health monitor: node heartbeats in, suspect-then-confirm out
// (runtime/cluster/failure_detector). A node missing k heartbeats becomes
// suspect -- the router stops sending it new requests -- and after the
// observation window without a heartbeat it is confirmed failed, which makes
// the controller fence and migrate its replicas. Heartbeats that resume in
// time clear the suspicion and nothing moves.

#include <caf/fwd.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "actors/chaos_hooks.hpp"
#include "actors/messages.hpp"
#include "cluster/failure_detector.hpp"

namespace exa::actors {

struct cluster_metrics;

struct health_config {
  std::uint32_t heartbeat_interval_ms = 2000;
  std::uint32_t suspect_after_missed = 5;
  std::uint32_t observation_window_ms = 30000;
  std::vector<cluster::node_id> nodes;  // watched from the start
  chaos_hooks hooks;
  bool wall_clock_from_actor_clock = false;  // virtual time: see node_config
  std::uint32_t clock_skew_warn_ms = 250;    // merged logs out of order by more than this: warn
  std::shared_ptr<cluster_metrics> metrics;  // nodes by health, health changes; may be null
};

struct health_monitor_state {
  health_config config;
  std::optional<cluster::heartbeat_detector> detector;
  struct clock_view {
    std::int64_t reported_ns = 0;  // last offset told to the controller
    bool skewed = false;
  };
  std::map<cluster::node_id, clock_view> clocks;
  static inline const char* name = "health_monitor";
};

caf::behavior health_monitor_actor(caf::stateful_actor<health_monitor_state>* self, health_config config);

}  // namespace exa::actors
