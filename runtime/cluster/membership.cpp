#include "cluster/membership.hpp"

#include <algorithm>
#include <cstdint>

namespace exa::cluster {

expected<void> check_join(const member_identity& ours, const member_identity& joining) {
  if (joining.role != "node" && joining.role != "gateway")
    return make_error(errc::invalid_argument, "unknown role '" + joining.role + "' (expected node or gateway)");
  if (joining.cluster != ours.cluster)
    return make_error(errc::invalid_argument, "the " + joining.role + " belongs to cluster '" + joining.cluster +
                                                  "', this controller runs cluster '" + ours.cluster + "'");
  if (joining.version != ours.version)
    return make_error(errc::invalid_argument, "the " + joining.role + " was built as " + joining.version +
                                                  ", this controller as " + ours.version +
                                                  "; every process of a cluster must run the same build");
  return {};
}

std::uint32_t node_lease_ms(std::uint32_t heartbeat_interval_ms, std::uint32_t suspect_after_missed,
                            std::uint32_t observation_window_ms) {
  const std::uint64_t confirm_ms =
      std::uint64_t{suspect_after_missed} * heartbeat_interval_ms + observation_window_ms;
  // Two intervals short of it: the node looks at its lease once an
  // interval, so it fences itself at the latest one interval before the
  // monitor (which looks twice an interval) can confirm.
  const std::uint64_t lease =
      confirm_ms > 3ull * heartbeat_interval_ms ? confirm_ms - 2ull * heartbeat_interval_ms : confirm_ms / 2;
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(lease, UINT32_MAX));
}

std::uint32_t transport_timeout_ms(std::uint32_t heartbeat_interval_ms, std::uint32_t suspect_after_missed,
                                   std::uint32_t observation_window_ms) {
  const std::uint64_t confirm_ms =
      std::uint64_t{suspect_after_missed} * heartbeat_interval_ms + observation_window_ms;
  // Two more intervals: the confirmation has been acted on by then. Never
  // under 3 s: the transport's own heartbeats must not call a busy peer dead.
  const std::uint64_t t = std::max<std::uint64_t>(confirm_ms + 2ull * heartbeat_interval_ms, 3000);
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(t, UINT32_MAX));
}

std::uint32_t reconcile_window_ms(std::uint32_t lease_ms, std::uint32_t heartbeat_interval_ms,
                                  std::uint32_t reconnect_timeout_ms, std::uint32_t reconnect_backoff_max_ms) {
  const std::uint64_t sum = std::uint64_t{lease_ms} + heartbeat_interval_ms + reconnect_timeout_ms + reconnect_backoff_max_ms;
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(sum, UINT32_MAX));
}

}  // namespace exa::cluster
