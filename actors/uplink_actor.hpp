#pragma once
// A node's or gateway's line to the controller process. The node actor and
// its replicas send "to the controller" and "to the health monitor" through
// it, so neither needs to know that the controller lives elsewhere or that
// it may go away: the uplink forwards under the original sender, drops what
// cannot be delivered while the control plane is unreachable (the node's
// lease and the controller's reconciliation cover that gap), and reconnects
// with bounded backoff and says hello again; then the node joins anew with
// what it runs (or the gateway re-joins), so a restarted controller learns
// what this process runs.

#include <caf/fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "actors/messages.hpp"

namespace exa::actors {

struct uplink_config {
  std::string host;  // the controller's directory
  std::uint16_t port = 0;
  hello_msg hello;   // said at every (re)connect
  std::uint32_t request_timeout_ms = 5000;
  std::uint32_t retry_min_ms = 100;   // first wait after a loss; doubles
  std::uint32_t retry_max_ms = 2000;
  /// Gateways: re-sent after each reconnect (the controller then sends a
  /// fresh snapshot); empty router for nodes.
  gateway_join gateway;
};


struct uplink_state {
  uplink_config config;
  caf::actor controller;
  caf::actor health_monitor;
  caf::actor node;  // told of control_plane_state (nodes only), learnt from its join
  std::uint32_t backoff_ms = 0;
  bool connecting = false;
  std::uint64_t dropped = 0;  // messages that found no controller
  static inline const char* name = "uplink";
};

caf::behavior uplink_actor(caf::stateful_actor<uplink_state>* self, uplink_config config, welcome_msg first);

}  // namespace exa::actors
