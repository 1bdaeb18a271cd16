#pragma once
// How far a node's wall clock is from the controller's, estimated the way
// NTP does from heartbeat round trips: the node stamps a heartbeat with its
// clock (t0), the monitor stamps the ack with its own (t1), the node notes
// when the ack arrives (t3). Then rtt = t3 - t0 and, if the two legs took
// equally long, the monitor's clock minus the node's is t1 - (t0 + t3) / 2,
// give or take rtt / 2. Of the last few samples the one with the smallest
// round trip is the tightest, so that one is the estimate.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace exa::cluster {

class clock_offset_estimator {
 public:
  static constexpr std::size_t window = 8;

  /// One round trip. Samples with t3 < t0 (a clock that stepped back) are
  /// ignored.
  void add(std::int64_t t0_ns, std::int64_t t1_ns, std::int64_t t3_ns);

  /// The node's clock minus the monitor's, in ns; nullopt before any sample.
  std::optional<std::int64_t> node_minus_monitor_ns() const;
  /// The round trip of the sample behind the estimate (its error bound is half of it).
  std::optional<std::int64_t> rtt_ns() const;

 private:
  struct sample {
    std::int64_t offset_ns = 0;  // node minus monitor
    std::int64_t rtt_ns = 0;
  };
  std::array<sample, window> samples_{};
  std::size_t count_ = 0, next_ = 0;
};

/// Whether an offset is large enough to warn about (merged logs of the two
/// hosts would read out of order by more than `threshold_ms`).
bool clock_skewed(std::int64_t offset_ns, std::uint32_t threshold_ms);

}  // namespace exa::cluster
