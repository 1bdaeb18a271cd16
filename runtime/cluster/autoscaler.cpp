#include "cluster/autoscaler.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>

namespace exa::cluster {

std::string_view to_string(scale_metric m) noexcept {
  switch (m) {
    case scale_metric::queue_depth: return "queue_depth";
    case scale_metric::ttft_p99_ms: return "ttft_p99_ms";
    case scale_metric::kv_utilization: return "kv_utilization";
  }
  return "unknown";
}

expected<scale_metric> scale_metric_from_string(std::string_view s) {
  for (const auto m : {scale_metric::queue_depth, scale_metric::ttft_p99_ms, scale_metric::kv_utilization})
    if (s == to_string(m)) return m;
  return make_error(errc::invalid_argument, "unknown autoscale metric '" + std::string(s) +
                                                "' (queue_depth, ttft_p99_ms or kv_utilization)");
}

double default_target(scale_metric m) noexcept {
  switch (m) {
    case scale_metric::queue_depth: return 4;
    case scale_metric::ttft_p99_ms: return 1000;
    case scale_metric::kv_utilization: return 0.8;
  }
  return 1;
}

expected<void> validate(const autoscale_policy& p) {
  const auto bad = [](std::string what) { return make_error(errc::invalid_argument, "autoscale: " + what); };
  if (!p.enabled()) return {};
  if (p.min_replicas > p.max_replicas)
    return bad(fmt::format("min_replicas {} is above max_replicas {}", p.min_replicas, p.max_replicas));
  if (!(p.target > 0) || !std::isfinite(p.target)) return bad("the target must be above 0");
  if (p.metric == scale_metric::kv_utilization && p.target > 1)
    return bad("a kv_utilization target is a fraction: at most 1");
  if (!(p.tolerance >= 0 && p.tolerance < 1)) return bad("tolerance must be in [0, 1)");
  if (p.up_window_ms == 0 || p.down_window_ms == 0) return bad("windows must be above 0 ms");
  if (!(p.max_up_factor >= 1) || !std::isfinite(p.max_up_factor)) return bad("max_up_factor must be at least 1");
  if (p.max_down_percent < 1 || p.max_down_percent > 100) return bad("max_down_percent must be in 1..100");
  return {};
}

autoscaler::autoscaler(autoscale_policy policy) : policy_(policy) {}

void autoscaler::set_policy(autoscale_policy policy) { policy_ = policy; }

double autoscaler::metric_of(const load_sample& s) const noexcept {
  switch (policy_.metric) {
    case scale_metric::queue_depth: return s.replicas ? s.outstanding / s.replicas : s.outstanding;
    case scale_metric::ttft_p99_ms: return s.ttft_p99_ms;
    case scale_metric::kv_utilization: return s.kv_fraction;
  }
  return 0;
}

namespace {

// The replicas a sample asks for, unrounded; < 0: the sample says nothing.
double raw_wanted(const autoscale_policy& p, const load_sample& s) {
  switch (p.metric) {
    case scale_metric::queue_depth: return s.outstanding / p.target;
    case scale_metric::kv_utilization: return s.replicas * s.kv_fraction / p.target;
    case scale_metric::ttft_p99_ms:
      if (s.ttft_p99_ms < 0) return -1;
      return s.replicas * s.ttft_p99_ms / p.target;
  }
  return -1;
}

// ceil that forgives the last bits of a division (4 × 1.0000000001 is 4).
std::uint32_t ceil_count(double x) {
  if (!(x > 0)) return 0;
  const double c = std::ceil(x - 1e-9);
  return c >= 4e9 ? 4000000000u : static_cast<std::uint32_t>(c);
}

}  // namespace

std::uint32_t autoscaler::wanted(const load_sample& s) const noexcept {
  return ceil_count(raw_wanted(policy_, s));
}

void autoscaler::observe(const load_sample& s) {
  if (!samples_.empty() && s.at_ns < samples_.back().at_ns) return;
  if (!seen_any_) {
    seen_any_ = true;
    first_ns_ = s.at_ns;
  }
  if (s.arrivals > 0 || s.outstanding > 0) last_arrival_ns_ = s.at_ns;
  samples_.push_back(s);
  const std::int64_t keep_ns =
      std::int64_t{std::max(policy_.up_window_ms, policy_.down_window_ms)} * 1000000;
  while (!samples_.empty() && (samples_.front().at_ns < s.at_ns - keep_ns || samples_.size() > max_samples))
    samples_.pop_front();
}

void autoscaler::scaled(std::int64_t now_ns, bool up) {
  last_scale_ns_ = now_ns;
  (up ? last_up_ns_ : last_down_ns_) = now_ns;
}

scale_decision autoscaler::decide(std::int64_t now_ns, std::uint32_t current) const {
  scale_decision d{current, false, ""};
  if (!policy_.enabled()) return d;
  const auto& p = policy_;
  const auto to = [&](std::uint32_t n, std::string why) {
    d.replicas = n;
    d.changed = n != current;
    d.reason = std::move(why);
    return d;
  };
  const auto since = [&](std::int64_t t) { return t == INT64_MIN ? INT64_MAX : now_ns - t; };
  const std::int64_t ms = 1000000;

  // Idle: to zero (min 0), never below one replica otherwise.
  // Not while replicas it asked for are still loading: a woken deployment's
  // first request waits at the router, where it is neither an arrival nor
  // outstanding on a replica.
  if (p.min_replicas == 0 && p.idle_to_zero_ms > 0 && current > 0 && seen_any_ &&
      samples_.back().replicas >= current) {
    const std::int64_t idle_from = std::max({last_arrival_ns_, first_ns_, last_scale_ns_});
    if (now_ns - idle_from >= std::int64_t{p.idle_to_zero_ms} * ms)
      return to(0, fmt::format("idle for {} ms (idle_to_zero_ms {})", (now_ns - idle_from) / ms, p.idle_to_zero_ms));
  }
  if (current == 0) {
    if (p.min_replicas > 0) return to(p.min_replicas, fmt::format("below min_replicas {}", p.min_replicas));
    return d;  // cold: the first request wakes it
  }
  const std::uint32_t floor_n = std::max<std::uint32_t>(p.min_replicas, 1);
  if (current < floor_n) return to(floor_n, fmt::format("below min_replicas {}", p.min_replicas));
  if (current > p.max_replicas) return to(p.max_replicas, fmt::format("above max_replicas {}", p.max_replicas));

  // Up: the mean over the short window.
  double sum = 0, metric_sum = 0;
  std::size_t n = 0;
  for (auto it = samples_.rbegin(); it != samples_.rend() && now_ns - it->at_ns <= std::int64_t{p.up_window_ms} * ms;
       ++it) {
    const double w = raw_wanted(p, *it);
    if (w < 0) continue;
    sum += w;
    metric_sum += metric_of(*it);
    ++n;
  }
  if (n > 0 && current < p.max_replicas) {
    const double mean = sum / n;
    if (mean > current * (1 + p.tolerance) && since(last_up_ns_) >= std::int64_t{p.up_cooldown_ms} * ms) {
      const auto cap = std::max<std::uint32_t>(current + 1, static_cast<std::uint32_t>(
                                                                std::min(4e9, std::floor(current * p.max_up_factor))));
      const auto target = std::min({ceil_count(mean), cap, p.max_replicas});
      if (target > current)
        return to(target, fmt::format("{} {:.3g} per {} over {} ms wants {:.3g} replicas (target {:.3g})",
                                      to_string(p.metric), metric_sum / n,
                                      p.metric == scale_metric::queue_depth ? "replica" : "sample", p.up_window_ms,
                                      mean, p.target));
    }
  }

  // Down: the largest want over the whole long window, observed since the last scaling.
  if (current > floor_n && since(last_scale_ns_) >= std::int64_t{p.down_window_ms} * ms &&
      since(last_down_ns_) >= std::int64_t{p.down_cooldown_ms} * ms &&
      now_ns - first_ns_ >= std::int64_t{p.down_window_ms} * ms) {
    double most = 0;
    for (auto it = samples_.rbegin();
         it != samples_.rend() && now_ns - it->at_ns <= std::int64_t{p.down_window_ms} * ms; ++it)
      most = std::max(most, raw_wanted(p, *it));
    if (most < current * (1 - p.tolerance)) {
      const std::uint32_t step = std::max<std::uint32_t>(1, current * p.max_down_percent / 100);
      const auto target = std::max({floor_n, ceil_count(most), current > step ? current - step : floor_n});
      if (target < current)
        return to(target, fmt::format("{} over {} ms wants at most {:.3g} replicas (target {:.3g})",
                                      to_string(p.metric), p.down_window_ms, most, p.target));
    }
  }
  return d;
}

}  // namespace exa::cluster
