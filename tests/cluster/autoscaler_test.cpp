// The autoscaler against synthetic load series: fast up, slow down, the
// tolerance band, cooldowns, the bounds and idle scale-to-zero.

#include <catch2/catch.hpp>

#include <cstdint>

#include "cluster/autoscaler.hpp"

using namespace exa;
using namespace exa::cluster;

namespace {

constexpr std::int64_t s_ns = 1000000000;

autoscale_policy queue_policy(std::uint32_t min = 1, std::uint32_t max = 20) {
  autoscale_policy p;
  p.min_replicas = min;
  p.max_replicas = max;
  p.metric = scale_metric::queue_depth;
  p.target = 4;
  p.up_window_ms = 10000;
  p.down_window_ms = 60000;
  p.up_cooldown_ms = 10000;
  p.down_cooldown_ms = 30000;
  return p;
}

load_sample queue(std::int64_t t_s, std::uint32_t replicas, double outstanding, std::uint64_t arrivals = 1) {
  load_sample s;
  s.at_ns = t_s * s_ns;
  s.replicas = replicas;
  s.outstanding = outstanding;
  s.arrivals = arrivals;
  return s;
}

}  // namespace

TEST_CASE("an autoscaler that is off never changes the count", "[autoscaler]") {
  autoscaler a(autoscale_policy{});
  a.observe(queue(0, 2, 1000));
  const auto d = a.decide(5 * s_ns, 2);
  CHECK_FALSE(d.changed);
  CHECK(d.replicas == 2);
}

TEST_CASE("a queue above target scales up at once, to what the queue needs", "[autoscaler]") {
  autoscaler a(queue_policy());
  for (int t = 0; t < 5; ++t) a.observe(queue(t, 4, 24));  // 6 per replica, target 4: wants 6
  const auto d = a.decide(5 * s_ns, 4);
  CHECK(d.changed);
  CHECK(d.replicas == 6);
  CHECK(d.reason.find("queue_depth") != std::string::npos);
}

TEST_CASE("scale-up is at most the up factor per decision and within max", "[autoscaler]") {
  autoscaler a(queue_policy(1, 10));
  for (int t = 0; t < 3; ++t) a.observe(queue(t, 2, 400));  // wants 100
  CHECK(a.decide(3 * s_ns, 2).replicas == 4);               // doubled, not 100
  CHECK(a.decide(3 * s_ns, 8).replicas == 10);              // capped by max
  CHECK_FALSE(a.decide(3 * s_ns, 10).changed);
}

TEST_CASE("within the tolerance band nothing changes", "[autoscaler]") {
  autoscaler a(queue_policy());
  for (int t = 0; t < 100; ++t) a.observe(queue(t, 4, 17));  // 4.25 per replica: within 10 %
  CHECK_FALSE(a.decide(100 * s_ns, 4).changed);
  for (int t = 100; t < 200; ++t) a.observe(queue(t, 4, 14.8));  // 3.7 per replica: within 10 %
  CHECK_FALSE(a.decide(200 * s_ns, 4).changed);
}

TEST_CASE("after a scale-up the next one waits for the up cooldown", "[autoscaler]") {
  autoscaler a(queue_policy());
  for (int t = 0; t < 5; ++t) a.observe(queue(t, 2, 16));
  REQUIRE(a.decide(5 * s_ns, 2).replicas == 4);
  a.scaled(5 * s_ns, true);
  for (int t = 5; t < 12; ++t) a.observe(queue(t, 4, 40));  // wants 10
  CHECK_FALSE(a.decide(12 * s_ns, 4).changed);              // 7 s after: cooling down
  for (int t = 12; t < 16; ++t) a.observe(queue(t, 4, 40));
  CHECK(a.decide(16 * s_ns, 4).replicas == 8);  // 11 s after: up again (doubling at most)
}

TEST_CASE("a short dip does not scale down but a dip the whole window long does, a step at a time", "[autoscaler]") {
  autoscaler a(queue_policy(2, 20));
  for (int t = 0; t < 60; ++t) a.observe(queue(t, 8, 32));  // exactly at target
  for (int t = 60; t < 100; ++t) a.observe(queue(t, 8, 4));  // a 40 s dip: wants 1
  CHECK_FALSE(a.decide(100 * s_ns, 8).changed);  // the window still holds the busy minute
  for (int t = 100; t < 125; ++t) a.observe(queue(t, 8, 4));
  const auto d = a.decide(125 * s_ns, 8);  // 65 s of dip: the window is all dip
  CHECK(d.changed);
  CHECK(d.replicas == 6);  // at most 25 % of 8 per decision
  a.scaled(125 * s_ns, false);
  for (int t = 125; t < 150; ++t) a.observe(queue(t, 6, 4));
  CHECK_FALSE(a.decide(150 * s_ns, 6).changed);  // cooldown and a fresh window
  for (int t = 150; t < 190; ++t) a.observe(queue(t, 6, 4));
  CHECK(a.decide(190 * s_ns, 6).replicas == 5);
}

TEST_CASE("scale-down never goes below min nor under what the window's peak needs", "[autoscaler]") {
  autoscaler a(queue_policy(3, 20));
  for (int t = 0; t < 70; ++t) a.observe(queue(t, 10, t == 30 ? 22 : 2));  // one peak wanting 6
  CHECK(a.decide(70 * s_ns, 10).replicas == 8);  // step limit first
  CHECK(a.decide(70 * s_ns, 7).replicas == 6);   // then the peak
  autoscaler b(queue_policy(3, 20));
  for (int t = 0; t < 70; ++t) b.observe(queue(t, 4, 0));
  CHECK(b.decide(70 * s_ns, 4).replicas == 3);
  CHECK_FALSE(b.decide(70 * s_ns, 3).changed);
}

TEST_CASE("counts outside the bounds are brought inside them", "[autoscaler]") {
  autoscaler a(queue_policy(2, 5));
  CHECK(a.decide(0, 1).replicas == 2);
  CHECK(a.decide(0, 9).replicas == 5);
  CHECK(a.decide(0, 0).replicas == 2);  // min above 0 wakes a cold deployment
}

TEST_CASE("with min 0 an idle deployment goes to zero and a cold one stays cold", "[autoscaler]") {
  auto p = queue_policy(0, 10);
  p.idle_to_zero_ms = 30000;
  autoscaler a(p);
  for (int t = 0; t < 10; ++t) a.observe(queue(t, 2, 1, 1));
  for (int t = 10; t < 39; ++t) a.observe(queue(t, 2, 0, 0));
  CHECK(a.decide(38 * s_ns, 2).replicas != 0);  // 29 s since the last arrival (t = 9)
  a.observe(queue(41, 2, 0, 0));
  const auto d = a.decide(41 * s_ns, 2);
  CHECK(d.replicas == 0);
  CHECK(d.reason.find("idle") != std::string::npos);
  CHECK_FALSE(a.decide(41 * s_ns, 0).changed);  // cold: woken by its first request, not here
  // Woken (scaled to one): the idle clock starts again from the wake.
  a.scaled(50 * s_ns, true);
  CHECK(a.decide(60 * s_ns, 1).replicas == 1);
  // Woken, but its replica still loading (the waking request waits at the
  // router, no arrival and nothing outstanding): not idle, however long.
  a.scaled(100 * s_ns, true);
  for (int t = 100; t < 200; ++t) a.observe(queue(t, 0, 0, 0));
  CHECK(a.decide(200 * s_ns, 1).replicas == 1);
  p.idle_to_zero_ms = 0;  // never idle out without it
  autoscaler b(p);
  for (int t = 0; t < 500; ++t) b.observe(queue(t, 2, 0, 0));
  CHECK(b.decide(500 * s_ns, 2).replicas == 1);
}

TEST_CASE("kv utilisation and TTFT targets scale by their ratio to the target", "[autoscaler]") {
  auto p = queue_policy(1, 50);
  p.metric = scale_metric::kv_utilization;
  p.target = 0.5;
  autoscaler kv(p);
  load_sample s = queue(0, 4, 0);
  s.kv_fraction = 0.9;  // 4 × 0.9 / 0.5 = 7.2
  kv.observe(s);
  CHECK(kv.decide(1 * s_ns, 4).replicas == 8);

  p.metric = scale_metric::ttft_p99_ms;
  p.target = 500;
  autoscaler ttft(p);
  load_sample t = queue(0, 3, 0);
  t.ttft_p99_ms = 1000;  // twice the target: 6
  ttft.observe(t);
  load_sample quiet = queue(1, 3, 0);  // no request finished: says nothing
  ttft.observe(quiet);
  CHECK(ttft.decide(2 * s_ns, 3).replicas == 6);
  autoscaler none(p);
  none.observe(quiet);
  CHECK_FALSE(none.decide(2 * s_ns, 3).changed);
}

TEST_CASE("a diurnal series follows the load up by day and down by night", "[autoscaler]") {
  // Load rises from 8 to 80 outstanding and falls back; a replica takes
  // 4. The fleet must reach 20 near the peak and come back down to 2.
  autoscaler a(queue_policy(2, 30));
  std::uint32_t n = 2, peak = 0;
  for (int t = 0; t < 3600; t += 5) {
    const double phase = t < 1800 ? t / 1800.0 : (3600 - t) / 1800.0;
    a.observe(queue(t, n, 8 + 72 * phase));
    const auto d = a.decide(t * std::int64_t{s_ns}, n);
    if (d.changed) {
      a.scaled(t * std::int64_t{s_ns}, d.replicas > n);
      n = d.replicas;
    }
    peak = std::max(peak, n);
    // Never far below what the load needs (fast up): within the up window's lag.
    if (t > 60 && t < 1800) CHECK(n * 4 * 1.35 >= 8 + 72 * phase);
  }
  CHECK(peak >= 20);
  CHECK(peak <= 22);
  CHECK(n <= 4);
}

TEST_CASE("policies that cannot work are refused with the field named", "[autoscaler]") {
  auto p = queue_policy(5, 3);
  CHECK(validate(p).error().message.find("min_replicas") != std::string::npos);
  p = queue_policy();
  p.target = 0;
  CHECK(validate(p).error().message.find("target") != std::string::npos);
  p = queue_policy();
  p.metric = scale_metric::kv_utilization;
  p.target = 2;
  CHECK(validate(p).error().message.find("fraction") != std::string::npos);
  p = queue_policy();
  p.max_down_percent = 0;
  CHECK_FALSE(validate(p));
  CHECK(validate(queue_policy()));
  CHECK(validate(autoscale_policy{}));  // off: nothing to check
  CHECK(scale_metric_from_string("kv_utilization").value() == scale_metric::kv_utilization);
  CHECK(scale_metric_from_string("qps").error().message.find("queue_depth") != std::string::npos);
}
