// Clock offsets from heartbeat round trips: exact for symmetric legs, the
// tightest round trip wins, and a clock stepping back is ignored.

#include <catch2/catch.hpp>

#include "cluster/clock_offset.hpp"

using namespace exa::cluster;

TEST_CASE("a symmetric round trip gives the offset exactly", "[clock]") {
  clock_offset_estimator e;
  CHECK_FALSE(e.node_minus_monitor_ns().has_value());
  // The node's clock runs 250 ms ahead; each leg takes 2 ms.
  const std::int64_t ahead = 250'000'000, leg = 2'000'000;
  const std::int64_t t0 = 1'796'000'000'000'000'000;  // a wall clock in 2026, in ns
  e.add(t0, t0 - ahead + leg, t0 + 2 * leg);
  REQUIRE(e.node_minus_monitor_ns().has_value());
  CHECK(*e.node_minus_monitor_ns() == ahead);
  CHECK(*e.rtt_ns() == 2 * leg);
  CHECK(clock_skewed(*e.node_minus_monitor_ns(), 100));
  CHECK_FALSE(clock_skewed(*e.node_minus_monitor_ns(), 500));
}

TEST_CASE("the sample with the smallest round trip is the estimate", "[clock]") {
  clock_offset_estimator e;
  const std::int64_t behind = -40'000'000;  // the node's clock is 40 ms behind
  std::int64_t t0 = 1'000'000'000'000;
  // A slow first leg (queueing) skews a sample; a quick round trip does not.
  e.add(t0, t0 - behind + 30'000'000, t0 + 31'000'000);
  t0 += 2'000'000'000;
  e.add(t0, t0 - behind + 500'000, t0 + 1'000'000);
  t0 += 2'000'000'000;
  e.add(t0, t0 - behind + 5'000'000, t0 + 20'000'000);
  CHECK(*e.node_minus_monitor_ns() == behind);
  CHECK(*e.rtt_ns() == 1'000'000);
  // Old samples leave the window.
  for (std::size_t i = 0; i < clock_offset_estimator::window; ++i) {
    t0 += 2'000'000'000;
    e.add(t0, t0 + 3'000'000, t0 + 6'000'000);  // now in step, 6 ms round trips
  }
  CHECK(*e.node_minus_monitor_ns() == 0);
  // A clock that stepped back mid-sample is not a sample.
  e.add(t0 + 10, t0, t0);
  CHECK(*e.rtt_ns() == 6'000'000);
}
