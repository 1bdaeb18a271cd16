#include "cluster/drain.hpp"

#include <string>

namespace exa::cluster {

std::string_view to_string(drain_cause cause) noexcept {
  switch (cause) {
    case drain_cause::replica: return "replica";
    case drain_cause::node: return "node";
    case drain_cause::shutdown: return "shutdown";
    case drain_cause::degraded: return "degraded";
    case drain_cause::defrag: return "defrag";
  }
  return "unknown";
}

expected<std::chrono::milliseconds> drain_tracker::deadline_for(std::chrono::milliseconds asked) const {
  if (asked.count() < 0) return make_error(errc::invalid_argument, "a drain deadline cannot be negative");
  if (asked.count() == 0) return config_.default_deadline;
  if (asked > config_.max_deadline)
    return make_error(errc::invalid_argument, "drain deadline " + std::to_string(asked.count() / 1000) +
                                                  " s is above the limit of " +
                                                  std::to_string(config_.max_deadline.count() / 1000) + " s");
  return asked;
}

expected<bool> drain_tracker::begin(replica_id id, node_id node, slot_ref slot, drain_cause cause, std::int64_t now_ns,
                                    std::chrono::milliseconds deadline, std::vector<node_id> avoid) {
  if (replicas_.count(id)) return false;
  if (replicas_.size() >= config_.draining_max)
    return make_error(errc::overloaded, std::to_string(replicas_.size()) +
                                            " replicas are draining already (the limit); retry when some have stopped");
  draining_replica d;
  d.id = id;
  d.node = node;
  d.slot = std::move(slot);
  d.cause = cause;
  d.started_ns = now_ns;
  d.deadline_ns = now_ns + std::chrono::duration_cast<std::chrono::nanoseconds>(deadline).count();
  d.avoid = std::move(avoid);
  replicas_.emplace(id, std::move(d));
  return true;
}

bool drain_tracker::mark_slot_moved(replica_id id) {
  const auto it = replicas_.find(id);
  if (it == replicas_.end() || it->second.slot_moved) return false;
  it->second.slot_moved = true;
  return true;
}

const draining_replica* drain_tracker::find(replica_id id) const {
  const auto it = replicas_.find(id);
  return it == replicas_.end() ? nullptr : &it->second;
}

std::optional<draining_replica> drain_tracker::ended(replica_id id) {
  const auto it = replicas_.find(id);
  if (it == replicas_.end()) return std::nullopt;
  auto out = std::move(it->second);
  replicas_.erase(it);
  return out;
}

std::vector<replica_id> drain_tracker::expire(std::int64_t now_ns) {
  std::vector<replica_id> out;
  for (auto& [id, d] : replicas_)
    if (!d.forced && d.deadline_ns <= now_ns) {
      d.forced = true;
      out.push_back(id);
    }
  return out;
}

std::optional<std::int64_t> drain_tracker::next_deadline_ns() const {
  std::optional<std::int64_t> out;
  for (const auto& [id, d] : replicas_)
    if (!d.forced && (!out || d.deadline_ns < *out)) out = d.deadline_ns;
  return out;
}

std::size_t drain_tracker::draining_on(node_id node) const {
  std::size_t n = 0;
  for (const auto& [id, d] : replicas_) n += d.node == node;
  return n;
}

bool drain_tracker::drain_node(node_id node, drain_cause cause) {
  const auto it = nodes_.find(node);
  if (it == nodes_.end()) {
    nodes_.emplace(node, cause);
    return true;
  }
  // An operator's drain outlives the process: it wins over a shutdown's.
  if (it->second == drain_cause::shutdown && cause != drain_cause::shutdown) it->second = cause;
  return false;
}

bool drain_tracker::undrain_node(node_id node) { return nodes_.erase(node) != 0; }

bool drain_tracker::node_restarted(node_id node) {
  const auto it = nodes_.find(node);
  if (it == nodes_.end() || it->second != drain_cause::shutdown) return false;
  nodes_.erase(it);
  return true;
}

std::optional<drain_cause> drain_tracker::node_cause(node_id node) const {
  const auto it = nodes_.find(node);
  if (it == nodes_.end()) return std::nullopt;
  return it->second;
}

}  // namespace exa::cluster
