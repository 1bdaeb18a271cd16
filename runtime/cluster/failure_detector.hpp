#pragma once
// Heartbeat failure detection, suspect-then-confirm: a node that misses k
// heartbeats in a row (k × interval of silence) becomes SUSPECT -- no new
// requests go to it, in-flight ones continue. If it stays silent for the
// observation window it is CONFIRMED failed and its replicas are migrated; a
// heartbeat before that makes it healthy again and nothing moves. A confirmed
// node that speaks again is healthy once more, but whatever it still runs is
// fenced (its slots moved on under new epochs).
//
// Time is a parameter (ns on the caller's clock); nothing here reads a clock.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "cluster/types.hpp"

namespace exa::cluster {

enum class node_health : std::uint8_t { healthy, suspect, confirmed };

std::string_view to_string(node_health h) noexcept;

struct detector_config {
  std::chrono::nanoseconds heartbeat_interval = std::chrono::seconds(2);
  std::uint32_t suspect_after_missed = 5;
  std::chrono::nanoseconds observation_window = std::chrono::seconds(30);
};

struct health_change {
  node_id node = 0;
  node_health from = node_health::healthy;
  node_health to = node_health::healthy;
  std::int64_t at_ns = 0;
};

class heartbeat_detector {
 public:
  explicit heartbeat_detector(detector_config config) : config_(config) {}

  /// Starts watching a node as if it had just sent a heartbeat.
  void watch(node_id node, std::int64_t now_ns);
  void forget(node_id node);

  /// A heartbeat arrived; returns the change it causes (suspect or
  /// confirmed -> healthy), if any. Unknown nodes are watched from now.
  std::optional<health_change> heartbeat(node_id node, std::int64_t now_ns);

  /// Evaluates silence at `now_ns`: healthy -> suspect after k intervals,
  /// suspect -> confirmed after the observation window. Call it at least
  /// every interval / 2 for timely detection.
  std::vector<health_change> tick(std::int64_t now_ns);

  /// Heartbeat intervals each node has stayed silent through since the
  /// last call, each interval counted once (the misses counter): a node
  /// heard again starts from zero. Nodes with nothing new are left out.
  std::vector<std::pair<node_id, std::uint64_t>> take_misses(std::int64_t now_ns);

  node_health health(node_id node) const;
  /// Watched nodes by health (every health present, zero or not).
  std::map<node_health, std::size_t> counts() const;
  /// When `node` was last heard from (0 if unknown).
  std::int64_t last_heard_ns(node_id node) const;
  const detector_config& config() const noexcept { return config_; }

 private:
  struct node_record {
    std::int64_t last_heard_ns = 0;
    std::int64_t suspected_at_ns = 0;
    node_health health = node_health::healthy;
    std::uint64_t misses_taken = 0;  // intervals of the current silence already reported
  };
  detector_config config_;
  std::map<node_id, node_record> nodes_;  // ordered: deterministic tick output
};

/// Request-level signal: the share of failed requests (timeouts, errors) per
/// replica over a sliding window. A replica at or above `error_rate_max` with
/// at least `min_samples` outcomes in the window is unhealthy.
struct error_rate_config {
  std::chrono::nanoseconds window = std::chrono::seconds(30);
  std::uint32_t min_samples = 5;
  double error_rate_max = 0.5;
};

class error_rate_tracker {
 public:
  explicit error_rate_tracker(error_rate_config config) : config_(config) {}

  /// Records an outcome; returns true when the replica is now unhealthy.
  bool record(replica_id replica, bool ok, std::int64_t now_ns);
  bool unhealthy(replica_id replica, std::int64_t now_ns);
  double error_rate(replica_id replica, std::int64_t now_ns);
  void forget(replica_id replica);

 private:
  struct outcome {
    std::int64_t at_ns;
    bool ok;
  };
  void expire(std::vector<outcome>& v, std::int64_t now_ns) const;
  error_rate_config config_;
  std::map<replica_id, std::vector<outcome>> outcomes_;
};

}  // namespace exa::cluster
