#pragma once
// The health monitor collects node heartbeats and answers what it knows of
// each node. (Failure detection -- suspect after missed heartbeats, confirm
// after an observation window -- builds on this.)

#include <caf/fwd.hpp>

#include <cstdint>
#include <map>

#include "actors/messages.hpp"

namespace exa::actors {

struct health_config {
  std::uint32_t heartbeat_interval_ms = 2000;
};

struct health_monitor_state {
  health_config config;
  struct node_seen {
    std::uint64_t sequence = 0;
    std::int64_t last_ns = 0;
  };
  std::map<cluster::node_id, node_seen> nodes;
  static inline const char* name = "health_monitor";
};

caf::behavior health_monitor_actor(caf::stateful_actor<health_monitor_state>* self, health_config config);

}  // namespace exa::actors
