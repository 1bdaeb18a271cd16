#include "cluster/lifecycle.hpp"

#include <algorithm>
#include <string>

#include "common/assert.hpp"

namespace exa::cluster {

namespace {

constexpr std::uint16_t bit(replica_state s) noexcept {
  return static_cast<std::uint16_t>(1u << static_cast<unsigned>(s));
}

using rs = replica_state;

// successors[from] is the set of states that may follow `from`. Kept as one
// table so the diagram in the header and the code cannot drift apart in more
// than one place, and so the exhaustive test can compare against it.
constexpr std::array<std::uint16_t, replica_state_count> successors = {
    /* creating */ bit(rs::loading) | bit(rs::failed),
    /* loading  */ bit(rs::warming) | bit(rs::failed),
    /* warming  */ bit(rs::ready) | bit(rs::standby) | bit(rs::failed),
    /* ready    */ bit(rs::serving) | bit(rs::draining) | bit(rs::degraded) | bit(rs::standby) | bit(rs::failed),
    /* serving  */ bit(rs::ready) | bit(rs::draining) | bit(rs::degraded) | bit(rs::standby) | bit(rs::failed),
    /* draining */ bit(rs::stopped) | bit(rs::failed),
    /* stopped  */ 0,
    /* degraded */ bit(rs::ready) | bit(rs::serving) | bit(rs::draining) | bit(rs::failed),
    /* failed   */ 0,
    /* standby  */ bit(rs::ready) | bit(rs::serving) | bit(rs::draining) | bit(rs::failed),
};

}  // namespace

std::string_view to_string(replica_state state) noexcept {
  switch (state) {
    case rs::creating: return "creating";
    case rs::loading: return "loading";
    case rs::warming: return "warming";
    case rs::ready: return "ready";
    case rs::serving: return "serving";
    case rs::draining: return "draining";
    case rs::stopped: return "stopped";
    case rs::degraded: return "degraded";
    case rs::failed: return "failed";
    case rs::standby: return "standby";
  }
  return "unknown";
}

bool is_valid_transition(replica_state from, replica_state to) noexcept {
  const auto index = static_cast<std::size_t>(from);
  if (index >= replica_state_count || static_cast<std::size_t>(to) >= replica_state_count) {
    return false;
  }
  return (successors[index] & bit(to)) != 0;
}

expected<replica_state> transition(replica_state from, replica_state to) {
  if (is_valid_transition(from, to)) return to;
  std::string message = "invalid replica state transition ";
  message += to_string(from);
  message += " -> ";
  message += to_string(to);
  if (is_terminal(from)) {
    message += " (";
    message += to_string(from);
    message += " is terminal)";
  }
  return make_error(errc::invalid_argument, std::move(message));
}

lifecycle::lifecycle(std::uint64_t created_at_ns) noexcept : entered_at_ns_(created_at_ns) {}

expected<replica_state> lifecycle::advance(replica_state to, std::uint64_t now_ns) {
  if (now_ns < entered_at_ns_) {
    return make_error(errc::invalid_argument,
                      "replica lifecycle clock went backwards: " + std::to_string(now_ns) +
                          " ns is before the current state's entry at " +
                          std::to_string(entered_at_ns_) + " ns");
  }
  auto next = transition(state_, to);
  if (!next) return next;
  ring_[transitions_total_ % history_max] = state_change{state_, to, now_ns};
  ++transitions_total_;
  state_ = to;
  entered_at_ns_ = now_ns;
  return next;
}

std::vector<state_change> lifecycle::history() const {
  const std::size_t kept =
      static_cast<std::size_t>(std::min<std::uint64_t>(transitions_total_, history_max));
  std::vector<state_change> out;
  out.reserve(kept);
  const std::uint64_t first = transitions_total_ - kept;
  for (std::uint64_t i = first; i < transitions_total_; ++i) out.push_back(ring_[i % history_max]);
  EXA_ASSERT(out.empty() || out.back().to == state_);
  return out;
}

}  // namespace exa::cluster
