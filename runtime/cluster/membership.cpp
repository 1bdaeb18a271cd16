#include "cluster/membership.hpp"

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
  const std::uint64_t lease = confirm_ms > 2ull * heartbeat_interval_ms ? confirm_ms - heartbeat_interval_ms : confirm_ms;
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(lease, UINT32_MAX));
}

std::uint32_t transport_timeout_ms(std::uint32_t heartbeat_interval_ms, std::uint32_t suspect_after_missed,
                                   std::uint32_t observation_window_ms) {
  const std::uint64_t confirm_ms =
      std::uint64_t{suspect_after_missed} * heartbeat_interval_ms + observation_window_ms;
  // Two more intervals: the confirmation has been acted on by then.
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(confirm_ms + 2ull * heartbeat_interval_ms, UINT32_MAX));
}

}  // namespace exa::cluster
