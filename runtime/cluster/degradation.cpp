#include "cluster/degradation.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace exa::cluster {

expected<void> validate(const degradation_config& c) {
  if (c.window == 0 || c.window > 4096) return make_error(errc::invalid_argument, "degradation window must be in [1, 4096]");
  if (c.min_samples == 0 || c.min_samples > c.window)
    return make_error(errc::invalid_argument, "degradation min_samples must be in [1, window]");
  if (c.step_latency_max.count() < 0) return make_error(errc::invalid_argument, "step_latency_max cannot be negative");
  if (!(c.error_rate_max >= 0)) return make_error(errc::invalid_argument, "error_rate_max must be >= 0");
  if (!(c.recover_ratio > 0 && c.recover_ratio <= 1))
    return make_error(errc::invalid_argument, "recover_ratio must be in (0, 1]");
  if (c.probe_interval.count() <= 0) return make_error(errc::invalid_argument, "probe_interval must be positive");
  return {};
}

degradation_detector::degradation_detector(degradation_config config) : config_(config) {}

void degradation_detector::observe_step(std::int64_t latency_ns) { steps_.push(std::max<std::int64_t>(0, latency_ns), config_.window); }

void degradation_detector::observe_request(bool failed) { requests_.push(failed ? 1 : 0, config_.window); }

std::int64_t degradation_detector::median_step_ns() const {
  if (steps_.size() == 0) return 0;
  auto v = steps_.items;
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

double degradation_detector::error_rate() const {
  if (requests_.size() == 0) return 0;
  std::size_t failed = 0;
  for (const auto f : requests_.items) failed += f;
  return static_cast<double>(failed) / static_cast<double>(requests_.size());
}

health_verdict degradation_detector::evaluate(std::int64_t now_ns) {
  const std::int64_t max_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(config_.step_latency_max).count();
  const bool steps_known = steps_.size() >= config_.min_samples;
  const bool requests_known = requests_.size() >= config_.min_samples;
  const std::int64_t median = median_step_ns();
  const double errors = error_rate();
  if (!degraded_) {
    const bool slow = max_ns > 0 && steps_known && median > max_ns;
    const bool erroring = requests_known && errors > config_.error_rate_max;
    if (!slow && !erroring) return health_verdict::unchanged;
    reason_ = slow ? fmt::format("median step latency {:.0f} ms over the last {} steps is above {} ms", median / 1e6,
                                 steps_.size(), config_.step_latency_max.count())
                   : fmt::format("{:.0f}% of the last {} requests failed (limit {:.0f}%)", errors * 100,
                                 requests_.size(), config_.error_rate_max * 100);
    degraded_ = true;
    degraded_since_ns_ = now_ns;
    last_probe_ns_ = now_ns;
    steps_.clear();
    requests_.clear();
    return health_verdict::degrade;
  }
  if (now_ns - degraded_since_ns_ < std::chrono::duration_cast<std::chrono::nanoseconds>(config_.recover_after).count())
    return health_verdict::unchanged;
  // Both signals need fresh evidence: a replica degraded for errors shows it
  // serves again (probes count), one degraded for latency that it is fast.
  if (!steps_known || !requests_known) return health_verdict::unchanged;
  const bool fast = max_ns == 0 || static_cast<double>(median) < config_.recover_ratio * static_cast<double>(max_ns);
  const bool clean = errors <= config_.recover_ratio * config_.error_rate_max;
  if (!fast || !clean) return health_verdict::unchanged;
  reason_ = fmt::format("recovered: median step latency {:.1f} ms, {:.0f}% of the last {} requests failed",
                        median / 1e6, errors * 100, requests_.size());
  degraded_ = false;
  return health_verdict::recover;
}

bool degradation_detector::probe_due(std::int64_t now_ns) const {
  return degraded_ &&
         now_ns - last_probe_ns_ >= std::chrono::duration_cast<std::chrono::nanoseconds>(config_.probe_interval).count();
}

}  // namespace exa::cluster
