// Degradation as pure logic, driven by synthetic series: a slow median or a
// high error rate degrades after min_samples; one slow step among fast ones
// does not; recovery needs the minimum time and fresh samples under the
// hysteresis thresholds; probes are due only while degraded.

#include <catch2/catch.hpp>

#include <chrono>

#include "cluster/degradation.hpp"

using namespace exa;
using namespace exa::cluster;
using namespace std::chrono_literals;

namespace {
constexpr std::int64_t ms = 1'000'000;

degradation_config config() {
  degradation_config c;
  c.window = 8;
  c.min_samples = 4;
  c.step_latency_max = 100ms;
  c.error_rate_max = 0.5;
  c.recover_ratio = 0.5;
  c.recover_after = 1s;
  c.probe_interval = 200ms;
  return c;
}
}  // namespace

TEST_CASE("a slow median degrades, a single slow step does not", "[degradation]") {
  degradation_detector d(config());
  for (int i = 0; i < 7; ++i) d.observe_step(5 * ms);
  d.observe_step(900 * ms);  // one long prefill
  CHECK(d.evaluate(0) == health_verdict::unchanged);
  CHECK_FALSE(d.degraded());

  degradation_detector slow(config());
  for (int i = 0; i < 3; ++i) slow.observe_step(300 * ms);
  CHECK(slow.evaluate(0) == health_verdict::unchanged);  // below min_samples
  slow.observe_step(300 * ms);
  CHECK(slow.evaluate(10 * ms) == health_verdict::degrade);
  CHECK(slow.degraded());
  CHECK(slow.degraded_since_ns() == 10 * ms);
  CHECK_THAT(slow.reason(), Catch::Contains("300 ms") && Catch::Contains("100 ms"));
  CHECK(slow.step_samples() == 0);  // judged afresh from here
}

TEST_CASE("a high error rate degrades", "[degradation]") {
  degradation_detector d(config());
  d.observe_request(false);
  d.observe_request(true);
  d.observe_request(true);
  d.observe_request(false);
  CHECK(d.evaluate(0) == health_verdict::unchanged);  // 50% is not above 50%
  d.observe_request(true);
  CHECK(d.error_rate() == Approx(0.6));
  CHECK(d.evaluate(0) == health_verdict::degrade);
  CHECK_THAT(d.reason(), Catch::Contains("60%"));
}

TEST_CASE("recovery waits for the minimum time and fresh good samples", "[degradation]") {
  degradation_detector d(config());
  for (int i = 0; i < 4; ++i) d.observe_step(500 * ms);
  REQUIRE(d.evaluate(0) == health_verdict::degrade);
  // Fast again at once, but not degraded long enough.
  for (int i = 0; i < 4; ++i) {
    d.observe_step(1 * ms);
    d.observe_request(false);
  }
  CHECK(d.evaluate(500 * ms) == health_verdict::unchanged);
  // Long enough, but 60 ms is above the hysteresis bound (0.5 x 100 ms).
  for (int i = 0; i < 8; ++i) d.observe_step(60 * ms);
  CHECK(d.evaluate(2000 * ms) == health_verdict::unchanged);
  for (int i = 0; i < 8; ++i) d.observe_step(2 * ms);
  CHECK(d.evaluate(2100 * ms) == health_verdict::recover);
  CHECK_FALSE(d.degraded());
  CHECK_THAT(d.reason(), Catch::Contains("recovered"));
}

TEST_CASE("recovery needs request evidence too", "[degradation]") {
  degradation_detector d(config());
  for (int i = 0; i < 4; ++i) d.observe_step(500 * ms);
  REQUIRE(d.evaluate(0) == health_verdict::degrade);
  for (int i = 0; i < 8; ++i) d.observe_step(1 * ms);
  CHECK(d.evaluate(5000 * ms) == health_verdict::unchanged);  // fast steps, no finished request yet
  for (int i = 0; i < 3; ++i) d.observe_request(false);
  d.observe_request(true);  // 25%: at the hysteresis bound, still clean
  CHECK(d.evaluate(5000 * ms) == health_verdict::recover);
}

TEST_CASE("probes are due only while degraded, once per interval", "[degradation]") {
  degradation_detector d(config());
  CHECK_FALSE(d.probe_due(10'000 * ms));
  for (int i = 0; i < 4; ++i) d.observe_step(500 * ms);
  REQUIRE(d.evaluate(1000 * ms) == health_verdict::degrade);
  CHECK_FALSE(d.probe_due(1100 * ms));
  CHECK(d.probe_due(1200 * ms));
  d.probe_sent(1200 * ms);
  CHECK_FALSE(d.probe_due(1300 * ms));
  CHECK(d.probe_due(1400 * ms));
}

TEST_CASE("a zero latency limit never degrades on latency", "[degradation]") {
  auto c = config();
  c.step_latency_max = 0ms;
  degradation_detector d(c);
  for (int i = 0; i < 8; ++i) d.observe_step(10'000 * ms);
  CHECK(d.evaluate(0) == health_verdict::unchanged);
}

TEST_CASE("degradation configs that cannot work are refused", "[degradation]") {
  CHECK(validate(config()));
  auto c = config();
  c.min_samples = 9;
  CHECK_FALSE(validate(c));
  c = config();
  c.recover_ratio = 0;
  CHECK_FALSE(validate(c));
  c = config();
  c.window = 0;
  CHECK_FALSE(validate(c));
  c = config();
  c.probe_interval = 0ms;
  CHECK_FALSE(validate(c));
}
