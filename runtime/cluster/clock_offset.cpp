#include "cluster/clock_offset.hpp"

#include <cstdlib>

namespace exa::cluster {

void clock_offset_estimator::add(std::int64_t t0_ns, std::int64_t t1_ns, std::int64_t t3_ns) {
  if (t3_ns < t0_ns) return;
  // Halves first: the sum of two wall-clock stamps would overflow.
  const std::int64_t midpoint = t0_ns / 2 + t3_ns / 2 + ((t0_ns % 2) + (t3_ns % 2)) / 2;
  samples_[next_] = {midpoint - t1_ns, t3_ns - t0_ns};
  next_ = (next_ + 1) % window;
  if (count_ < window) ++count_;
}

std::optional<std::int64_t> clock_offset_estimator::node_minus_monitor_ns() const {
  if (count_ == 0) return std::nullopt;
  std::size_t best = 0;
  for (std::size_t i = 1; i < count_; ++i)
    if (samples_[i].rtt_ns < samples_[best].rtt_ns) best = i;
  return samples_[best].offset_ns;
}

std::optional<std::int64_t> clock_offset_estimator::rtt_ns() const {
  if (count_ == 0) return std::nullopt;
  std::int64_t best = samples_[0].rtt_ns;
  for (std::size_t i = 1; i < count_; ++i) best = std::min(best, samples_[i].rtt_ns);
  return best;
}

bool clock_skewed(std::int64_t offset_ns, std::uint32_t threshold_ms) {
  return std::llabs(offset_ns) > std::int64_t{threshold_ms} * 1000000;
}

}  // namespace exa::cluster
