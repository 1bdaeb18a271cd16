// Admission: bounded queues refuse with `overloaded` and a Retry-After
// estimate, recover when places free up, and never lose count.

#include <catch2/catch.hpp>

#include <vector>

#include "cluster/admission.hpp"

using namespace exa;
using namespace exa::cluster;

namespace {

constexpr std::uint64_t ms = 1'000'000;  // ns per millisecond

admission_controller make(admission_config config) {
  auto controller = admission_controller::create(config);
  REQUIRE(controller);
  return std::move(*controller);
}

}  // namespace

TEST_CASE("a model's queue refuses when full and recovers after release", "[admission]") {
  admission_config config;
  config.queued_per_model_max = 3;
  auto ac = make(config);
  std::vector<admission_ticket> tickets;
  for (int i = 0; i < 3; ++i) {
    auto t = ac.try_admit("llama", 0);
    REQUIRE(t);
    tickets.push_back(*t);
  }
  const auto refused = ac.try_admit("llama", 0);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == errc::overloaded);
  CHECK(refused.error().message.starts_with("model 'llama' has 3 queued requests (limit 3); retry after"));
  CHECK(ac.try_admit("mistral", 0));  // other models have their own queue
  CHECK(ac.queued("llama") == 3);

  REQUIRE(ac.release(tickets[0], 1 * ms));
  CHECK(ac.queued("llama") == 2);
  CHECK(ac.try_admit("llama", 2 * ms));
  CHECK_FALSE(ac.try_admit("llama", 2 * ms));
}

TEST_CASE("the global queue bounds all models together", "[admission]") {
  admission_config config;
  config.queued_global_max = 4;
  auto ac = make(config);
  std::vector<admission_ticket> tickets;
  for (const char* model : {"a", "b", "c", "d"}) tickets.push_back(*ac.try_admit(model, 0));
  const auto refused = ac.try_admit("e", 0);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == errc::overloaded);
  CHECK(refused.error().message.starts_with("all models together have 4 queued requests (limit 4)"));
  CHECK(ac.queued_total() == 4);
  // Dispatching moves a request out of the queue: room again.
  REQUIRE(ac.try_dispatch(tickets[0], 7, 1 * ms));
  CHECK(ac.queued_total() == 3);
  CHECK(ac.in_flight_total() == 1);
  CHECK(ac.try_admit("e", 1 * ms));
}

TEST_CASE("a replica takes at most its in-flight limit and the ticket keeps its place", "[admission]") {
  admission_config config;
  config.in_flight_per_replica_max = 2;
  auto ac = make(config);
  const auto a = *ac.try_admit("m", 0);
  const auto b = *ac.try_admit("m", 0);
  const auto c = *ac.try_admit("m", 0);
  REQUIRE(ac.try_dispatch(a, 1, 0));
  REQUIRE(ac.try_dispatch(b, 1, 0));
  const auto full = ac.try_dispatch(c, 1, 0);
  REQUIRE_FALSE(full);
  CHECK(full.error().code == errc::overloaded);
  CHECK(full.error().message == "replica 1 has 2 requests in flight (limit 2)");
  CHECK(ac.queued("m") == 1);  // c is still queued
  REQUIRE(ac.try_dispatch(c, 2, 0));
  CHECK(ac.in_flight(1) == 2);
  CHECK(ac.in_flight(2) == 1);
  // Resume elsewhere: an in-flight request moves between replicas.
  REQUIRE(ac.try_dispatch(a, 2, 0));
  CHECK(ac.in_flight(1) == 1);
  CHECK(ac.in_flight(2) == 2);
  REQUIRE(ac.release(a, 0));
  REQUIRE(ac.release(b, 0));
  REQUIRE(ac.release(c, 0));
  CHECK(ac.in_flight_total() == 0);
  CHECK(ac.in_flight(1) == 0);
  CHECK(ac.queued_total() == 0);
}

TEST_CASE("releasing twice or an unknown ticket is an error, not a miscount", "[admission]") {
  auto ac = make({});
  const auto t = *ac.try_admit("m", 0);
  REQUIRE(ac.release(t, 0));
  const auto again = ac.release(t, 0);
  REQUIRE_FALSE(again);
  CHECK(again.error().code == errc::not_found);
  CHECK(ac.try_dispatch(admission_ticket{999}, 1, 0).error().code == errc::not_found);
  CHECK(ac.queued_total() == 0);
}

TEST_CASE("retry-after follows the drain rate, else the default, within the clamp", "[admission]") {
  admission_config config;
  config.queued_per_model_max = 10;
  config.retry_after_ms_default = 1500;
  config.retry_after_ms_min = 50;
  config.retry_after_ms_max = 20000;
  config.drain_window_ns = 8000 * ms;
  auto ac = make(config);
  std::vector<admission_ticket> tickets;
  for (int i = 0; i < 10; ++i) tickets.push_back(*ac.try_admit("m", 0));
  CHECK(ac.retry_after_ms("m", 0) == 1500);  // nothing has drained yet
  CHECK(ac.retry_after_ms("other", 0) == 0);  // nothing blocks another model

  // Dispatch 8, one every 500 ms from t = 0, and refill: 10 queued at 2/s → 5 s.
  for (int i = 0; i < 8; ++i)
    REQUIRE(ac.try_dispatch(tickets[i], 1 + i % 4, static_cast<std::uint64_t>(i) * 500 * ms));
  for (int i = 0; i < 8; ++i) REQUIRE(ac.try_admit("m", 4000 * ms));
  CHECK(ac.retry_after_ms("m", 4000 * ms) == 5000);
  const auto refused = ac.try_admit("m", 4000 * ms);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().message.ends_with("retry after 5000 ms"));
  // Long after the window the old departures no longer count: back to the default.
  CHECK(ac.retry_after_ms("m", 100000 * ms) == 1500);
}

TEST_CASE("retry-after is clamped", "[admission]") {
  admission_config config;
  config.queued_per_model_max = 1;
  config.retry_after_ms_min = 200;
  config.retry_after_ms_max = 3000;
  config.drain_window_ns = 8000 * ms;
  auto ac = make(config);
  // Very fast drain: 1000 departures within 1 s → far below the minimum.
  for (int i = 0; i < 1000; ++i) REQUIRE(ac.release(*ac.try_admit("m", i * ms), i * ms));
  REQUIRE(ac.try_admit("m", 1000 * ms));
  CHECK(ac.retry_after_ms("m", 1000 * ms) == 200);
  // One departure in 7 s: 7 s for a backlog of 1, clamped to the maximum.
  auto slow = make(config);
  const auto t = *slow.try_admit("m", 0);
  REQUIRE(slow.release(t, 0));
  REQUIRE(slow.try_admit("m", 7000 * ms));
  CHECK(slow.retry_after_ms("m", 7000 * ms) == 3000);
  // Once that departure leaves the window the rate is unknown: the default.
  CHECK(slow.retry_after_ms("m", 9000 * ms) == config.retry_after_ms_default);
}

TEST_CASE("event rate counts a sliding window", "[admission]") {
  event_rate rate(8000 * ms);
  CHECK(rate.per_s(0) == 0);
  for (int i = 0; i < 40; ++i) rate.record(static_cast<std::uint64_t>(i) * 100 * ms);  // 10/s for 4 s
  CHECK(rate.per_s(4000 * ms) == Approx(10.0));
  CHECK(rate.per_s(7000 * ms) == Approx(40.0 / 7));  // same 40 events, longer span
  CHECK(rate.per_s(8000 * ms) == Approx(30.0 / 8));  // the first second's bucket expired
  CHECK(rate.per_s(20000 * ms) == 0);
}

TEST_CASE("admission configuration is checked", "[admission]") {
  admission_config zero;
  zero.queued_global_max = 0;
  CHECK(admission_controller::create(zero).error().code == errc::invalid_argument);
  admission_config inverted;
  inverted.retry_after_ms_min = 10;
  inverted.retry_after_ms_max = 5;
  CHECK_FALSE(admission_controller::create(inverted));
}
