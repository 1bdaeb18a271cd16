#pragma once
// When a replica is degraded, as pure logic: slow or erroring, but still
// reachable. The replica actor feeds it every engine step's latency and
// every request's outcome (probes included) and asks for a verdict after
// each; the router then passes a degraded replica over while any healthy
// one can serve, and the controller replaces one that stays degraded past
// its limit.
//
//   healthy ──(median step latency > step_latency_max, or
//              error rate > error_rate_max, over >= min_samples)──> degraded
//   degraded ──(at least recover_after, and fresh samples below
//               recover_ratio × each threshold)──> healthy
//
// Entering degraded empties both windows, so recovery is judged only on
// what happened since. A degraded replica that gets no traffic is probed
// (one tiny request through its engine every probe_interval) so that it can
// show it behaves again. Time is a parameter: tests replay exactly.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace exa::cluster {

struct degradation_config {
  /// Samples kept per signal (the last N steps, the last N requests).
  std::uint32_t window = 16;
  /// Samples a signal needs before it can degrade or recover a replica.
  std::uint32_t min_samples = 4;
  /// Median step latency above this is degraded. 0: latency never degrades.
  std::chrono::milliseconds step_latency_max = std::chrono::seconds(5);
  /// Fraction of failed requests above this is degraded; above 1: never.
  double error_rate_max = 0.5;
  /// Recovered when below this fraction of each threshold (hysteresis).
  double recover_ratio = 0.5;
  /// Degraded at least this long before recovering (no flapping).
  std::chrono::milliseconds recover_after = std::chrono::seconds(5);
  /// While degraded and idle: one probe this often.
  std::chrono::milliseconds probe_interval = std::chrono::seconds(1);
};

/// invalid_argument naming the field for a config that cannot work.
expected<void> validate(const degradation_config& config);

enum class health_verdict : std::uint8_t {
  unchanged,  // stay as it is
  degrade,    // healthy -> degraded now
  recover,    // degraded -> healthy now
};

class degradation_detector {
 public:
  explicit degradation_detector(degradation_config config = {});

  void observe_step(std::int64_t latency_ns);
  void observe_request(bool failed);

  /// Moves between healthy and degraded as the windows say (see the file
  /// comment) and tells whether it moved.
  health_verdict evaluate(std::int64_t now_ns);

  bool degraded() const noexcept { return degraded_; }
  std::int64_t degraded_since_ns() const noexcept { return degraded_since_ns_; }
  /// Why the last degrade or recover verdict was given, with its numbers.
  const std::string& reason() const noexcept { return reason_; }

  /// Degraded and no probe for probe_interval: send one now.
  bool probe_due(std::int64_t now_ns) const;
  void probe_sent(std::int64_t now_ns) { last_probe_ns_ = now_ns; }

  /// Median of the step window in ns (0 while empty); failed fraction of
  /// the request window (0 while empty).
  std::int64_t median_step_ns() const;
  double error_rate() const;
  std::size_t step_samples() const noexcept { return steps_.size(); }
  std::size_t request_samples() const noexcept { return requests_.size(); }

 private:
  template <class T>
  struct ring {
    std::vector<T> items;
    std::size_t next = 0;
    void push(T v, std::size_t cap) {
      if (items.size() < cap) items.push_back(v);
      else items[next] = v;
      next = (next + 1) % cap;
    }
    std::size_t size() const noexcept { return items.size(); }
    void clear() {
      items.clear();
      next = 0;
    }
  };

  degradation_config config_;
  ring<std::int64_t> steps_;
  ring<std::uint8_t> requests_;  // 1 = failed
  bool degraded_ = false;
  std::int64_t degraded_since_ns_ = 0;
  std::int64_t last_probe_ns_ = 0;
  std::string reason_;
};

}  // namespace exa::cluster
