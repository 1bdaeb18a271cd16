#pragma once
// Who may join a cluster, and how long a node may go unheard before it must
// fence itself: the decisions behind the distributed mode's join handshake,
// kept apart from the actors that carry them out.

#include <cstdint>
#include <string>
#include <string_view>

#include "common/error.hpp"

namespace exa::cluster {

/// A joining process's claim, checked against the controller's own.
struct member_identity {
  std::string cluster;  // the cluster's name
  std::string version;  // the build's protocol version
  std::string role;     // "node" or "gateway"
};

/// Accepts `joining` into the cluster `ours` describes. Errors
/// (invalid_argument) name both sides of the first mismatch: another
/// cluster's name, another build's version, or an unknown role.
expected<void> check_join(const member_identity& ours, const member_identity& joining);

/// How long a node may go without a heartbeat ack before it stops serving:
/// two intervals before the monitor can confirm it failed (k missed
/// heartbeats, then the observation window; the node checks its lease once
/// an interval), so its replicas stop before the controller gives their
/// slots away.
std::uint32_t node_lease_ms(std::uint32_t heartbeat_interval_ms, std::uint32_t suspect_after_missed,
                            std::uint32_t observation_window_ms);

/// How long the transport may stay silent before it drops a connection:
/// past the failure detector's confirmation, so our own suspect-then-confirm
/// decides first and the transport only cleans up what it confirmed; never
/// under 3 s, so a peer that is merely busy keeps its connection.
std::uint32_t transport_timeout_ms(std::uint32_t heartbeat_interval_ms, std::uint32_t suspect_after_missed,
                                   std::uint32_t observation_window_ms);

/// How long a controller restarted from its journal waits for nodes to
/// rejoin before it places their slots anew. A node that lost the old
/// controller holds its lease only while no controller answers; once one
/// is up but unreachable for it (a reconnect attempt times out) it starts a
/// fresh lease. So every node either rejoins or has fenced itself within
/// one backoff, one attempt and one lease of the restart, plus a heartbeat.
std::uint32_t reconcile_window_ms(std::uint32_t lease_ms, std::uint32_t heartbeat_interval_ms,
                                  std::uint32_t reconnect_timeout_ms, std::uint32_t reconnect_backoff_max_ms);

}  // namespace exa::cluster
