#include "cluster/failure_detector.hpp"

#include <algorithm>

namespace exa::cluster {

std::string_view to_string(node_health h) noexcept {
  switch (h) {
    case node_health::healthy: return "healthy";
    case node_health::suspect: return "suspect";
    case node_health::confirmed: return "confirmed";
  }
  return "unknown";
}

void heartbeat_detector::watch(node_id node, std::int64_t now_ns) {
  nodes_[node] = node_record{now_ns, 0, node_health::healthy};
}

void heartbeat_detector::forget(node_id node) { nodes_.erase(node); }

std::optional<health_change> heartbeat_detector::heartbeat(node_id node, std::int64_t now_ns) {
  auto [it, inserted] = nodes_.try_emplace(node, node_record{now_ns, 0, node_health::healthy});
  auto& r = it->second;
  if (now_ns > r.last_heard_ns) r.misses_taken = 0;  // a new silence starts now
  r.last_heard_ns = std::max(r.last_heard_ns, now_ns);
  if (inserted || r.health == node_health::healthy) return std::nullopt;
  const health_change change{node, r.health, node_health::healthy, now_ns};
  r.health = node_health::healthy;
  r.suspected_at_ns = 0;
  return change;
}

std::map<node_health, std::size_t> heartbeat_detector::counts() const {
  std::map<node_health, std::size_t> out{{node_health::healthy, 0}, {node_health::suspect, 0}, {node_health::confirmed, 0}};
  for (const auto& [node, r] : nodes_) ++out[r.health];
  return out;
}

std::vector<health_change> heartbeat_detector::tick(std::int64_t now_ns) {
  std::vector<health_change> out;
  const std::int64_t silence_max = config_.heartbeat_interval.count() * config_.suspect_after_missed;
  for (auto& [node, r] : nodes_) {
    if (r.health == node_health::healthy && now_ns - r.last_heard_ns >= silence_max) {
      r.health = node_health::suspect;
      r.suspected_at_ns = now_ns;
      out.push_back({node, node_health::healthy, node_health::suspect, now_ns});
    } else if (r.health == node_health::suspect &&
               now_ns - r.suspected_at_ns >= config_.observation_window.count()) {
      r.health = node_health::confirmed;
      out.push_back({node, node_health::suspect, node_health::confirmed, now_ns});
    }
  }
  return out;
}

std::vector<std::pair<node_id, std::uint64_t>> heartbeat_detector::take_misses(std::int64_t now_ns) {
  std::vector<std::pair<node_id, std::uint64_t>> out;
  const std::int64_t interval = config_.heartbeat_interval.count();
  if (interval <= 0) return out;
  for (auto& [node, r] : nodes_) {
    if (now_ns <= r.last_heard_ns) continue;
    const auto missed = static_cast<std::uint64_t>((now_ns - r.last_heard_ns) / interval);
    if (missed <= r.misses_taken) continue;
    out.emplace_back(node, missed - r.misses_taken);
    r.misses_taken = missed;
  }
  return out;
}

node_health heartbeat_detector::health(node_id node) const {
  const auto it = nodes_.find(node);
  return it == nodes_.end() ? node_health::healthy : it->second.health;
}

std::int64_t heartbeat_detector::last_heard_ns(node_id node) const {
  const auto it = nodes_.find(node);
  return it == nodes_.end() ? 0 : it->second.last_heard_ns;
}

void error_rate_tracker::expire(std::vector<outcome>& v, std::int64_t now_ns) const {
  const std::int64_t cutoff = now_ns - config_.window.count();
  v.erase(v.begin(), std::find_if(v.begin(), v.end(), [&](const outcome& o) { return o.at_ns > cutoff; }));
}

bool error_rate_tracker::record(replica_id replica, bool ok, std::int64_t now_ns) {
  auto& v = outcomes_[replica];
  v.push_back({now_ns, ok});
  // Bounded: a window never holds more than this many outcomes per replica.
  constexpr std::size_t max_outcomes = 4096;
  if (v.size() > max_outcomes) v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() - max_outcomes));
  return unhealthy(replica, now_ns);
}

double error_rate_tracker::error_rate(replica_id replica, std::int64_t now_ns) {
  auto it = outcomes_.find(replica);
  if (it == outcomes_.end()) return 0;
  expire(it->second, now_ns);
  if (it->second.empty()) return 0;
  const auto errors = std::count_if(it->second.begin(), it->second.end(), [](const outcome& o) { return !o.ok; });
  return static_cast<double>(errors) / static_cast<double>(it->second.size());
}

bool error_rate_tracker::unhealthy(replica_id replica, std::int64_t now_ns) {
  const double rate = error_rate(replica, now_ns);
  const auto it = outcomes_.find(replica);
  return it != outcomes_.end() && it->second.size() >= config_.min_samples && rate >= config_.error_rate_max;
}

void error_rate_tracker::forget(replica_id replica) { outcomes_.erase(replica); }

}  // namespace exa::cluster
