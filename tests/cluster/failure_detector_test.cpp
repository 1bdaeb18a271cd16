// Suspect-then-confirm heartbeat detection, request error rates, and the
// channel fault points.

#include <catch2/catch.hpp>

#include "cluster/failure_detector.hpp"
#include "cluster/fault_injector.hpp"

using namespace exa::cluster;
using namespace std::chrono_literals;

namespace {
constexpr std::int64_t s = 1'000'000'000;
detector_config defaults() { return {2s, 5, 30s}; }
}  // namespace

TEST_CASE("k missed heartbeats make a node suspect, the window confirms it", "[detector]") {
  heartbeat_detector d(defaults());
  d.watch(1, 0);
  d.watch(2, 0);
  for (std::int64_t t = 2 * s; t <= 8 * s; t += 2 * s) {  // node 2 keeps beating
    d.heartbeat(2, t);
    CHECK(d.tick(t).empty());
  }
  d.heartbeat(2, 10 * s);
  auto changes = d.tick(10 * s);  // node 1 silent for 5 × 2 s
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].node == 1);
  CHECK(changes[0].to == node_health::suspect);
  CHECK(d.health(1) == node_health::suspect);
  CHECK(d.health(2) == node_health::healthy);
  const auto counts = d.counts();  // what the exaserve_nodes gauge shows
  CHECK(counts.at(node_health::healthy) == 1);
  CHECK(counts.at(node_health::suspect) == 1);
  CHECK(counts.at(node_health::confirmed) == 0);
  for (std::int64_t t = 12 * s; t < 40 * s; t += 2 * s) {
    d.heartbeat(2, t);
    CHECK(d.tick(t).empty());  // still inside the 30 s window
  }
  changes = d.tick(40 * s);
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].to == node_health::confirmed);
}

TEST_CASE("a heartbeat inside the window clears suspicion and nothing is confirmed", "[detector]") {
  heartbeat_detector d(defaults());
  d.watch(1, 0);
  REQUIRE(d.tick(10 * s).size() == 1);
  const auto back = d.heartbeat(1, 25 * s);
  REQUIRE(back.has_value());
  CHECK(back->from == node_health::suspect);
  CHECK(back->to == node_health::healthy);
  for (std::int64_t t = 27 * s; t <= 41 * s; t += 2 * s) {
    d.heartbeat(1, t);
    CHECK(d.tick(t).empty());  // past the window's end at 40 s: not confirmed
  }
  CHECK(d.health(1) == node_health::healthy);
}

TEST_CASE("jitter shorter than k intervals never raises suspicion", "[detector]") {
  heartbeat_detector d(defaults());
  d.watch(1, 0);
  // Heartbeats arrive late, up to 9.9 s apart: below 5 × 2 s.
  std::int64_t t = 0;
  for (int i = 0; i < 20; ++i) {
    t += (i % 2 ? 99 : 20) * s / 10;
    CHECK(d.tick(t - 1).empty());
    d.heartbeat(1, t);
  }
  CHECK(d.health(1) == node_health::healthy);
}

TEST_CASE("a confirmed node that speaks again is reported healthy", "[detector]") {
  heartbeat_detector d(defaults());
  d.watch(3, 0);
  d.tick(10 * s);
  d.tick(40 * s);
  REQUIRE(d.health(3) == node_health::confirmed);
  const auto back = d.heartbeat(3, 50 * s);
  REQUIRE(back.has_value());
  CHECK(back->from == node_health::confirmed);
  CHECK(d.health(3) == node_health::healthy);
}

TEST_CASE("error rate marks a replica unhealthy only with enough samples", "[detector]") {
  error_rate_tracker t({10s, 4, 0.5});
  CHECK_FALSE(t.record(7, false, 0));
  CHECK_FALSE(t.record(7, false, 1));
  CHECK_FALSE(t.record(7, false, 2));  // 3 samples: below min_samples
  CHECK(t.record(7, true, 3));         // 3 errors of 4
  CHECK_FALSE(t.unhealthy(7, 12 * s)); // the window slid past them
}

TEST_CASE("fault points partition, jitter, drop and duplicate a node's channel", "[detector][chaos]") {
  fault_injector f(42);
  CHECK(f.decide(1, message_class::heartbeat, 0).deliver);
  f.arm(1, channel_fault::partition, 10 * s);
  CHECK_FALSE(f.decide(1, message_class::control, 5 * s).deliver);
  CHECK(f.partitioned(1, 5 * s));
  CHECK(f.decide(2, message_class::control, 5 * s).deliver);  // other nodes unaffected
  CHECK(f.decide(1, message_class::control, 10 * s).deliver);  // expired
  f.arm(1, channel_fault::jitter, 20 * s, 1.0, 3 * s);
  CHECK(f.decide(1, message_class::heartbeat, 11 * s).delay_ns == 3 * s);
  CHECK(f.decide(1, message_class::control, 11 * s).delay_ns == 0);  // jitter delays heartbeats only
  f.clear(1);
  f.arm(1, channel_fault::drop, 100 * s, 0.5);
  int delivered = 0;
  for (int i = 0; i < 1000; ++i) delivered += f.decide(1, message_class::control, 30 * s).deliver;
  CHECK(delivered > 400);
  CHECK(delivered < 600);
  f.clear(1);
  f.arm(1, channel_fault::duplicate, 100 * s, 1.0);
  CHECK(f.decide(1, message_class::control, 30 * s).copies == 2);
}

TEST_CASE("each silent heartbeat interval is counted once, and a heartbeat starts a new silence", "[detector]") {
  heartbeat_detector d(defaults());  // 2 s interval
  d.watch(1, 0);
  d.watch(2, 0);
  CHECK(d.take_misses(1 * s).empty());  // under one interval: nothing missed yet
  d.heartbeat(2, 3 * s);
  auto m = d.take_misses(5 * s);  // node 1: 2 intervals; node 2: 1 since its beat at 3 s
  REQUIRE(m.size() == 2);
  CHECK(m[0] == std::pair<node_id, std::uint64_t>{1, 2});
  CHECK(m[1] == std::pair<node_id, std::uint64_t>{2, 1});
  CHECK(d.take_misses(5 * s).empty());  // the same instant again: nothing new
  m = d.take_misses(6 * s);  // node 1 reaches 3 intervals; node 2 still 1
  REQUIRE(m.size() == 1);
  CHECK(m[0] == std::pair<node_id, std::uint64_t>{1, 1});
  d.heartbeat(1, 7 * s);  // heard again: its counted misses restart from zero
  m = d.take_misses(8 * s);  // node 1: 1 s of silence, none; node 2: 5 s since 3 s, 2 in all
  REQUIRE(m.size() == 1);
  CHECK(m[0] == std::pair<node_id, std::uint64_t>{2, 1});
  m = d.take_misses(9 * s);
  REQUIRE(m.size() == 2);
  CHECK(m[0] == std::pair<node_id, std::uint64_t>{1, 1});
  CHECK(m[1] == std::pair<node_id, std::uint64_t>{2, 1});  // 6 s since 3 s: 3 in all
}
