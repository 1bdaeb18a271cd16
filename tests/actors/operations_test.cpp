// Operations on the deterministic scheduler, in virtual time: draining a
// replica (what it has finishes, nothing new reaches it, its slot is placed
// again), a drain past its deadline (in-flight work resumes elsewhere,
// token-exact), draining a node (everything moves off, nothing new lands
// there until undrained), and degraded replicas (a slow device degrades its
// replica, the router passes it over, it recovers or is replaced).

#include <catch2/catch.hpp>

#include <caf/actor_system.hpp>
#include <caf/send.hpp>

#include <map>
#include <set>

#include "actors/messages.hpp"
#include "chaos/event_log.hpp"
#include "cluster_fixture.hpp"

using namespace exa;
using namespace std::chrono_literals;

namespace {

actors::cluster_options timed(std::uint32_t nodes, std::uint32_t replicas, std::shared_ptr<chaos::event_log> log) {
  auto o = test::cluster_fixture::defaults(replicas);
  o.nodes = nodes;
  o.model_step_time = true;  // steps take virtual time: requests are in flight when we act
  o.request_deadline_ms = 60000;
  o.event_log = std::move(log);
  return o;
}

api::generate_request request(std::string id, std::uint32_t max_tokens) {
  api::generate_request r;
  r.request_id = std::move(id);
  r.model = "tiny";
  r.prompt_text = "operations";
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

std::map<std::uint32_t, api::replica_status> by_slot(const api::cluster_status& s) {
  std::map<std::uint32_t, api::replica_status> out;
  for (const auto& r : s.replicas)
    if (r.state != "draining") out[r.slot] = r;
  return out;
}

const api::replica_status* find(const api::cluster_status& s, const std::string& id) {
  for (const auto& r : s.replicas)
    if (r.id == id) return &r;
  return nullptr;
}

expected<api::drain_result> drain(test::cluster_fixture& f, api::drain_request req) {
  std::optional<expected<api::drain_result>> out;
  f.backend().drain(req, [&](expected<api::drain_result> r) { out = std::move(r); });
  f.run();
  REQUIRE(out.has_value());
  return *out;
}

api::drain_request replica_drain(const std::string& id, std::uint32_t deadline_ms = 0) {
  return {api::drain_request::target::replica, std::stoull(id), deadline_ms, false};
}

api::drain_request node_drain(std::uint32_t node, bool undrain = false) {
  return {api::drain_request::target::node, node, 0, undrain};
}

void scale(test::cluster_fixture& f, std::uint32_t replicas) {
  std::optional<expected<void>> out;
  f.backend().scale("tiny", replicas, [&](expected<void> r) { out = std::move(r); });
  f.run();
  REQUIRE(out.has_value());
  REQUIRE(out->has_value());
}

// Which replica a request in flight is on: the one whose load says busy.
std::string busy_replica(test::cluster_fixture& f) {
  for (const auto& r : f.status().replicas)
    if (r.running + r.queued > 0) return r.id;
  FAIL("no replica is busy");
  return {};
}

}  // namespace

TEST_CASE("a drained replica finishes its requests, takes no new ones, and its slot is placed again", "[actors][drain]") {
  auto log = std::make_shared<chaos::event_log>();
  test::cluster_fixture f(timed(2, 2, log));
  f.advance(100ms);
  REQUIRE(test::replicas_up(f.status()) == 2);
  auto first = f.generate(request("long", 100));
  f.advance(5ms, 1ms);
  REQUIRE_FALSE(first->result.has_value());
  const std::string victim = busy_replica(f);
  const auto before = f.status();
  const auto slot = find(before, victim)->slot;
  const auto epoch = find(before, victim)->epoch;

  auto r = drain(f, replica_drain(victim, 30000));
  REQUIRE(r);
  CHECK(r->replicas == 1);
  CHECK(r->deadline_ms == 30000);
  auto again = drain(f, replica_drain(victim));  // draining twice is no error
  REQUIRE(again);
  CHECK(again->replicas == 0);
  auto during = f.status();
  REQUIRE(find(during, victim));
  CHECK(find(during, victim)->state == "draining");

  // New requests go elsewhere while it drains.
  std::vector<std::shared_ptr<test::recording_sink>> later;
  for (int i = 0; i < 4; ++i) later.push_back(f.generate(request("later" + std::to_string(i), 4)));
  f.advance(2000ms);
  for (const auto& k : later) {
    REQUIRE(k->result.has_value());
    CHECK_FALSE(k->result->err.has_value());
    CHECK(k->result->replica != victim);
  }
  // The one it had finished there, whole, without moving.
  REQUIRE(first->result.has_value());
  CHECK_FALSE(first->result->err.has_value());
  CHECK(first->result->replica == victim);
  CHECK(first->result->resumes == 0);
  CHECK(first->result->usage.completion_tokens == 100);
  // Gone, and its slot has a new replica under a new epoch.
  const auto after = f.status();
  CHECK_FALSE(find(after, victim));
  const auto slots = by_slot(after);
  REQUIRE(slots.count(slot));
  CHECK(slots.at(slot).state == "ready");
  CHECK(slots.at(slot).epoch == epoch + 1);
  CHECK(test::replicas_up(after) == 2);
}

TEST_CASE("past its deadline a drain resumes in-flight requests elsewhere, token-exact", "[actors][drain]") {
  std::vector<std::int32_t> reference;
  {
    test::cluster_fixture f(timed(2, 2, nullptr));
    f.advance(100ms);
    auto k = f.generate(request("exact", 120));
    f.advance(3000ms);
    REQUIRE(k->result.has_value());
    REQUIRE_FALSE(k->result->err.has_value());
    reference = k->tokens();
  }
  REQUIRE(reference.size() == 120);
  auto log = std::make_shared<chaos::event_log>();
  test::cluster_fixture f(timed(2, 2, log));
  f.advance(100ms);
  auto k = f.generate(request("exact", 120));
  f.advance(5ms, 1ms);
  const std::string victim = busy_replica(f);
  REQUIRE(drain(f, replica_drain(victim, 10)));
  f.advance(3000ms);
  REQUIRE(k->result.has_value());
  CHECK_FALSE(k->result->err.has_value());
  CHECK(k->result->resumes >= 1);
  CHECK(k->result->replica != victim);
  CHECK(k->tokens() == reference);
  // It stopped at the deadline, not when its request would have finished.
  bool stopped = false;
  for (const auto& e : log->events())
    stopped |= e.kind == chaos::event_kind::replica_state && e.replica == std::stoull(victim) && e.detail == "stopped";
  CHECK(stopped);
  CHECK(test::replicas_up(f.status()) == 2);
}

TEST_CASE("a drained node gives up every replica and takes nothing new until undrained", "[actors][drain]") {
  test::cluster_fixture f(timed(3, 3, nullptr));
  f.advance(100ms);
  auto s = f.status();
  REQUIRE(test::replicas_up(s) == 3);
  const std::uint32_t node = s.replicas.front().node;
  std::size_t on_node = 0;
  for (const auto& r : s.replicas) on_node += r.node == node;

  auto r = drain(f, node_drain(node));
  REQUIRE(r);
  CHECK(r->replicas == on_node);
  f.advance(1000ms);
  std::string metrics;
  f.backend().metrics([&](std::string text) { metrics = std::move(text); });
  f.run();
  CHECK_THAT(metrics, Catch::Contains("exaserve_drains_total{cause=\"node\"} " + std::to_string(on_node)));
  // Each drained replica's slot was placed again elsewhere: a migration by the drain's cause.
  CHECK_THAT(metrics, Catch::Contains("exaserve_migrations_total{reason=\"node\"} " + std::to_string(on_node) + "\n"));
  s = f.status();
  CHECK(test::replicas_up(s) == 3);
  for (const auto& rep : s.replicas) CHECK(rep.node != node);
  bool shown = false;
  for (const auto& n : s.nodes)
    if (n.id == node) shown = n.drained == "node";
  CHECK(shown);

  // Scaling up places nothing on it.
  scale(f, 6);
  f.advance(1000ms);
  s = f.status();
  CHECK(test::replicas_up(s) == 6);
  for (const auto& rep : s.replicas) CHECK(rep.node != node);

  // Undrained: it takes replicas again.
  REQUIRE(drain(f, node_drain(node, true)));
  scale(f, 9);
  f.advance(1000ms);
  s = f.status();
  CHECK(test::replicas_up(s) == 9);
  std::size_t back = 0;
  for (const auto& rep : s.replicas) back += rep.node == node;
  CHECK(back > 0);
  for (const auto& n : s.nodes)
    if (n.id == node) CHECK(n.drained.empty());
}

TEST_CASE("draining a node while its replicas still wait for their turn to load places none of them there",
          "[actors][drain][loads]") {
  auto o = timed(2, 6, nullptr);
  o.loads_max = 1;
  o.loads_per_node_max = 1;
  test::cluster_fixture f(o);  // placed on both nodes; one loads, the rest wait
  REQUIRE(drain(f, node_drain(0)));
  f.advance(1000ms);
  const auto s = f.status();
  CHECK(test::replicas_up(s) == 6);
  for (const auto& r : s.replicas) CHECK(r.node == 1);
}

TEST_CASE("drain requests that cannot be carried out name the problem", "[actors][drain]") {
  test::cluster_fixture f(timed(2, 2, nullptr));
  f.advance(100ms);
  const auto id = f.status().replicas.front().id;
  auto unknown = drain(f, replica_drain("999999"));
  REQUIRE_FALSE(unknown);
  CHECK(unknown.error().code == errc::not_found);
  CHECK_THAT(unknown.error().message, Catch::Contains("999999"));
  auto no_node = drain(f, node_drain(77));
  REQUIRE_FALSE(no_node);
  CHECK(no_node.error().code == errc::not_found);
  auto undrain_replica = drain(f, {api::drain_request::target::replica, std::stoull(id), 0, true});
  REQUIRE_FALSE(undrain_replica);
  CHECK(undrain_replica.error().code == errc::invalid_argument);
  auto not_drained = drain(f, node_drain(0, true));
  REQUIRE_FALSE(not_drained);
  CHECK_THAT(not_drained.error().message, Catch::Contains("not drained"));
  auto too_long = drain(f, replica_drain(id, 2 * 3600 * 1000));
  REQUIRE_FALSE(too_long);
  CHECK(too_long.error().code == errc::invalid_argument);
  CHECK(test::replicas_up(f.status()) == 2);  // nothing happened
}

TEST_CASE("a slow device degrades its replica, the router passes it over, and it recovers", "[actors][degraded]") {
  auto log = std::make_shared<chaos::event_log>();
  auto o = timed(2, 2, log);
  o.degraded_step_ms = 50;
  o.degraded_replace_after_ms = 0;  // never replaced: watch it recover
  test::cluster_fixture f(o);
  f.advance(100ms);
  const auto s = f.status();
  const auto& slow = s.replicas.front();
  caf::anon_send(f.node(slow.node), actors::inject_fault{"slow", slow.device, 3000, 200});
  f.run();
  // Enough traffic that the slow replica runs a few steps.
  std::vector<std::shared_ptr<test::recording_sink>> sinks;
  for (int i = 0; i < 4; ++i) sinks.push_back(f.generate(request("warm" + std::to_string(i), 6)));
  f.advance(2000ms);
  CHECK(find(f.status(), slow.id)->state == "degraded");
  // Requests now avoid it while the other replica can serve.
  std::vector<std::shared_ptr<test::recording_sink>> after;
  for (int i = 0; i < 6; ++i) after.push_back(f.generate(request("avoid" + std::to_string(i), 4)));
  f.advance(500ms);
  for (const auto& k : after) {
    REQUIRE(k->result.has_value());
    CHECK(k->result->replica != slow.id);
  }
  for (const auto& k : sinks) {
    REQUIRE(k->result.has_value());  // what was on it still finished
    CHECK_FALSE(k->result->err.has_value());
  }
  // The fault ends; probes show it is fast again; it recovers.
  f.advance(10000ms);
  CHECK(find(f.status(), slow.id)->state == "ready");
  bool detected = false;
  for (const auto& e : log->events())
    detected |= e.kind == chaos::event_kind::fault_detected && e.detail == "degraded" && e.node == slow.node;
  CHECK(detected);
}

TEST_CASE("a replica degraded past its limit is drained and replaced", "[actors][degraded]") {
  auto o = timed(2, 2, nullptr);
  o.degraded_step_ms = 50;
  o.degraded_replace_after_ms = 2000;
  test::cluster_fixture f(o);
  f.advance(100ms);
  const auto s = f.status();
  const auto slow = s.replicas.front();
  caf::anon_send(f.node(slow.node), actors::inject_fault{"slow", slow.device, 600000, 200});
  f.run();
  std::vector<std::shared_ptr<test::recording_sink>> sinks;
  for (int i = 0; i < 4; ++i) sinks.push_back(f.generate(request("warm" + std::to_string(i), 6)));
  f.advance(1500ms);
  REQUIRE(find(f.status(), slow.id));
  CHECK(find(f.status(), slow.id)->state == "degraded");
  f.advance(4000ms);
  const auto after = f.status();
  CHECK_FALSE(find(after, slow.id));
  const auto slots = by_slot(after);
  REQUIRE(slots.count(slow.slot));
  CHECK(slots.at(slow.slot).node != slow.node);  // away from the slow device's node
  CHECK(slots.at(slow.slot).state == "ready");
  CHECK(slots.at(slow.slot).epoch == slow.epoch + 1);
  for (const auto& k : sinks) {
    REQUIRE(k->result.has_value());
    CHECK_FALSE(k->result->err.has_value());
  }
}

namespace {
// Most replicas loading at once (loading or warming), per node and overall.
std::pair<std::size_t, std::size_t> peak_loads(const std::vector<chaos::event>& log) {
  std::map<std::int64_t, std::set<std::int64_t>> by_node;
  std::size_t node_peak = 0, total_peak = 0;
  for (const auto& e : log) {
    if (e.kind != chaos::event_kind::replica_state) continue;
    auto& s = by_node[e.node];
    if (e.detail == "loading" || e.detail == "warming") s.insert(e.replica);
    else s.erase(e.replica);
    std::size_t total = 0;
    for (const auto& [n, set] : by_node) total += set.size();
    node_peak = std::max(node_peak, s.size());
    total_peak = std::max(total_peak, total);
  }
  return {node_peak, total_peak};
}
}  // namespace

TEST_CASE("loads are staggered: at most the limits load at once, and every replica comes up", "[actors][loads]") {
  for (const bool gated : {true, false}) {
    CAPTURE(gated);
    auto log = std::make_shared<chaos::event_log>();
    auto o = timed(2, 8, log);
    o.loads_max = gated ? 3 : 1000;
    o.loads_per_node_max = gated ? 1 : 1000;
    test::cluster_fixture f(o);
    f.advance(500ms);
    CHECK(test::replicas_up(f.status()) == 8);
    const auto [node_peak, total_peak] = peak_loads(log->events());
    if (gated) {
      CHECK(node_peak == 1);
      CHECK(total_peak <= 2);  // two nodes, one each
    } else {
      CHECK(node_peak > 1);  // the control: without the gate every start loads at once
    }
    // A scale-up goes through the same gate.
    const std::size_t before = log->size();
    scale(f, 12);
    f.advance(500ms);
    CHECK(test::replicas_up(f.status()) == 12);
    const auto all = log->events();
    const std::vector<chaos::event> later(all.begin() + static_cast<std::ptrdiff_t>(before), all.end());
    if (gated) CHECK(peak_loads(later).first == 1);
  }
}

TEST_CASE("a deployment scaled to zero is woken by its next request, which waits instead of failing",
          "[actors][cold]") {
  test::cluster_fixture f(timed(2, 2, nullptr));
  f.advance(100ms);
  scale(f, 0);
  f.advance(500ms);
  auto s = f.status();
  CHECK(s.replicas.empty());
  REQUIRE(s.models.size() == 1);
  CHECK(s.models[0].replicas_desired == 0);
  CHECK(f.ready());  // a cold deployment does not hold readiness back

  // Three requests arrive while it is cold: the first wakes it, all wait.
  std::vector<std::shared_ptr<test::recording_sink>> sinks;
  for (int i = 0; i < 3; ++i) sinks.push_back(f.generate(request("cold" + std::to_string(i), 8)));
  f.run();
  for (const auto& k : sinks) CHECK_FALSE(k->result.has_value());  // waiting, not refused
  f.advance(1000ms);
  for (const auto& k : sinks) {
    REQUIRE(k->result.has_value());
    CHECK_FALSE(k->result->err.has_value());
    CHECK(k->result->usage.completion_tokens == 8);
  }
  s = f.status();
  CHECK(test::replicas_up(s) == 1);  // woken with one replica
  CHECK(s.models[0].replicas_desired == 1);
  // Warm again: requests go straight through.
  auto warm = f.generate(request("warm", 4));
  f.advance(200ms);
  REQUIRE(warm->result.has_value());
  CHECK_FALSE(warm->result->err.has_value());
}

TEST_CASE("a request for a cold deployment that cannot start in time fails with a deadline, not a hang",
          "[actors][cold]") {
  auto o = timed(2, 2, nullptr);
  o.request_deadline_ms = 300;
  test::cluster_fixture f(o);
  f.advance(100ms);
  scale(f, 0);
  f.advance(200ms);
  // Model loads take 5 s now: the woken replica cannot be ready in time.
  for (std::uint32_t n = 0; n < 2; ++n) caf::anon_send(f.node(n), actors::inject_fault{"slow_load", 0, 60000, 5000});
  f.run();
  auto k = f.generate(request("nowhere", 4));
  f.advance(1000ms);
  REQUIRE(k->result.has_value());
  REQUIRE(k->result->err.has_value());
  CHECK(k->result->err->code == errc::deadline_exceeded);
}
