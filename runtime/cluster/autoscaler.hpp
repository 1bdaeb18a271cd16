#pragma once
// How many replicas a deployment should have, as pure logic: the controller
// feeds one load sample per deployment per tick (from the routers' reports)
// and asks for a decision; the decision is a function of the samples kept
// (a bounded window) and of when the deployment last scaled, nothing else.
//
//   per sample:  wanted = ceil(outstanding / target)               queue_depth
//                       = ceil(replicas × kv_fraction / target)     kv_utilization
//                       = ceil(replicas × ttft_p99 / target)        ttft_p99_ms
//   scale up   (fast): the mean `wanted` over the last up_window, when it is
//                      above the current count by more than the tolerance;
//                      at most ×max_up_factor (and at least +1) per decision,
//                      at most once per up_cooldown.
//   scale down (slow): the largest `wanted` over the whole down_window (so a
//                      dip must last the window), only when the window has
//                      been observed since the last scaling, at most
//                      max_down_percent of the replicas (at least 1) per
//                      decision, at most once per down_cooldown.
//   to zero:           with min_replicas 0, no arrival and nothing
//                      outstanding for idle_to_zero: 0 (the first request
//                      then wakes it as a cold deployment).
//   always within [max(min_replicas, 1 unless idle), max_replicas].
//
// The same shape as the Kubernetes HPA's (ratio to target, tolerance,
// stabilization window for scale-down), written for our own samples.

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>

#include "common/error.hpp"

namespace exa::cluster {

enum class scale_metric : std::uint8_t {
  queue_depth,     // requests outstanding (running + queued) per replica
  ttft_p99_ms,     // time to first token, p99 over the sample, in ms
  kv_utilization,  // KV tokens used / capacity, 0..1
};

std::string_view to_string(scale_metric m) noexcept;
/// "queue_depth", "ttft_p99_ms", "kv_utilization"; invalid_argument naming the accepted ones.
expected<scale_metric> scale_metric_from_string(std::string_view s);
/// The target a metric gets when none is named: 4 requests per replica,
/// 1000 ms, 0.8.
double default_target(scale_metric m) noexcept;

struct autoscale_policy {
  std::uint32_t min_replicas = 1;
  /// 0: autoscaling off (the replica count is what deploy and scale set).
  std::uint32_t max_replicas = 0;
  scale_metric metric = scale_metric::queue_depth;
  double target = 4;
  /// No change while the metric is within this fraction of the target.
  double tolerance = 0.1;
  std::uint32_t up_window_ms = 10000;
  std::uint32_t down_window_ms = 300000;
  std::uint32_t up_cooldown_ms = 10000;
  std::uint32_t down_cooldown_ms = 120000;
  double max_up_factor = 2.0;
  std::uint32_t max_down_percent = 25;
  /// With min_replicas 0: this long without arrivals scales to zero. 0: never.
  std::uint32_t idle_to_zero_ms = 0;

  bool enabled() const noexcept { return max_replicas > 0; }
};

/// invalid_argument naming the field: min above max, a target not above 0
/// (or a kv target above 1), a tolerance outside [0, 1), windows or
/// cooldowns of 0 where they matter, an up factor below 1, a down percent
/// outside 1..100.
expected<void> validate(const autoscale_policy& p);

/// What one tick saw of a deployment.
struct load_sample {
  std::int64_t at_ns = 0;
  std::uint32_t replicas = 0;   // serving replicas (ready or busy) the sample was taken over
  double outstanding = 0;       // requests running + queued, summed over them
  double kv_fraction = 0;       // KV used / capacity over them, 0..1
  double ttft_p99_ms = -1;      // < 0: no request finished in the sample
  std::uint64_t arrivals = 0;   // requests that arrived since the previous sample
};

struct scale_decision {
  std::uint32_t replicas = 0;  // what the deployment should have
  bool changed = false;        // replicas != current
  std::string reason;          // for the log: the metric, its value and the rule
};

class autoscaler {
 public:
  /// Bound on samples kept, whatever the windows say.
  static constexpr std::size_t max_samples = 4096;

  explicit autoscaler(autoscale_policy policy);

  const autoscale_policy& policy() const noexcept { return policy_; }
  void set_policy(autoscale_policy policy);

  /// Samples must come in time order; an older one is ignored.
  void observe(const load_sample& s);

  /// The decision for a deployment that has `current` replicas now.
  scale_decision decide(std::int64_t now_ns, std::uint32_t current) const;

  /// The deployment was scaled (by this autoscaler or anyone) at `now_ns`:
  /// cooldowns and the scale-down window start again.
  void scaled(std::int64_t now_ns, bool up);

  /// The replicas one sample asks for (the formula above), before clamping.
  std::uint32_t wanted(const load_sample& s) const noexcept;

  std::size_t samples() const noexcept { return samples_.size(); }

 private:
  double metric_of(const load_sample& s) const noexcept;

  autoscale_policy policy_;
  std::deque<load_sample> samples_;
  std::int64_t last_up_ns_ = INT64_MIN;
  std::int64_t last_down_ns_ = INT64_MIN;
  std::int64_t last_scale_ns_ = INT64_MIN;
  std::int64_t last_arrival_ns_ = INT64_MIN;
  bool seen_any_ = false;
  std::int64_t first_ns_ = 0;
};

}  // namespace exa::cluster
