// The warm pool and the autoscaler on the deterministic scheduler, in
// virtual time: a standby takes a failed replica's place at once and its
// replacement loads as a standby; a scale-up takes the pool first; load
// above target scales a deployment up, quiet scales it down and, with min 0,
// to zero -- and the next request wakes it and is served.

#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <string>

#include <caf/send.hpp>

#include "actors/messages.hpp"
#include "cluster_fixture.hpp"

using namespace exa;
using namespace std::chrono_literals;

namespace {

std::map<std::string, std::string> states_of(const api::cluster_status& s, const std::string& deployment) {
  std::map<std::string, std::string> out;
  for (const auto& r : s.replicas)
    if (r.deployment == deployment) out[r.id] = r.state;
  return out;
}

std::size_t count_state(const std::map<std::string, std::string>& states, const std::string& state) {
  std::size_t n = 0;
  for (const auto& [id, s] : states) n += s == state;
  return n;
}

std::uint32_t node_of(const api::cluster_status& s, const std::string& id) {
  for (const auto& r : s.replicas)
    if (r.id == id) return r.node;
  FAIL("no replica " << id);
  return 0;
}

api::generate_request request(std::string id, std::uint32_t max_tokens = 4) {
  api::generate_request r;
  r.request_id = std::move(id);
  r.model = "tiny";
  r.prompt_text = "warm";
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

std::uint32_t serving_replicas(test::cluster_fixture& f) {
  for (const auto& m : f.status().models)
    if (m.name == "tiny") return m.replicas_desired;
  FAIL("tiny is not listed");
  return 0;
}

expected<void> scale(test::cluster_fixture& f, std::uint32_t n) {
  std::optional<expected<void>> out;
  f.backend().scale("tiny", n, [&](expected<void> r) { out = std::move(r); });
  f.run();
  REQUIRE(out.has_value());
  return *out;
}

}  // namespace

TEST_CASE("a standby replica takes a crashed one's place at once and the restarted one joins the pool",
          "[actors][warm_pool]") {
  auto o = test::cluster_fixture::defaults(2);
  o.deployments[0].warm_pool_percent = 50;
  test::cluster_fixture f(o);
  f.advance(200ms);
  auto before = states_of(f.status(), "tiny");
  REQUIRE(before.size() == 3);
  REQUIRE(count_state(before, "standby") == 1);
  std::string standby, victim;
  for (const auto& [id, s] : before) {
    if (s == "standby") standby = id;
    else victim = id;
  }
  // Traffic goes to serving replicas only.
  for (int i = 0; i < 6; ++i) {
    auto k = f.generate(request("w" + std::to_string(i)));
    f.advance(50ms);
    REQUIRE(k->result.has_value());
    CHECK_FALSE(k->result->err.has_value());
    CHECK(k->result->replica != standby);
  }
  // The node restarts the crashed replica in place (it reloads); the
  // standby serves in its stead without waiting for that.
  f.kill_replica(node_of(f.status(), victim), std::stoull(victim));
  auto now = states_of(f.status(), "tiny");
  REQUIRE(now.count(standby) == 1);
  CHECK(now[standby] == "ready");
  auto k = f.generate(request("after"));
  f.advance(200ms);
  REQUIRE(k->result.has_value());
  CHECK_FALSE(k->result->err.has_value());
  // The pool is whole again: two serving, the restarted one standing by.
  auto after = states_of(f.status(), "tiny");
  CHECK(after.size() == 3);
  CHECK(count_state(after, "standby") == 1);
  CHECK(count_state(after, "ready") == 2);
  CHECK(after[standby] == "ready");
  CHECK(after[victim] == "standby");
}

TEST_CASE("a lost node's serving replica is replaced by a standby at once and the pool refills elsewhere",
          "[actors][warm_pool]") {
  auto o = test::cluster_fixture::defaults(2);
  o.deployments[0].warm_pool_percent = 50;
  o.loads_max = 1;  // one load at a time: a warmed standby must give its turn back
  test::cluster_fixture f(o);
  f.advance(200ms);
  const auto s = f.status();
  std::string standby;
  for (const auto& r : s.replicas)
    if (r.state == "standby") standby = r.id;
  REQUIRE_FALSE(standby.empty());
  const std::uint32_t keep = node_of(s, standby);
  std::uint32_t lost = keep;
  for (const auto& r : s.replicas)
    if (r.node != keep) lost = r.node;
  REQUIRE(lost != keep);
  caf::anon_send_exit(f.node(lost), caf::exit_reason::user_shutdown);
  f.run();
  auto now = states_of(f.status(), "tiny");
  CHECK(now[standby] == "ready");
  f.advance(200ms);
  const auto after = f.status();
  auto states = states_of(after, "tiny");
  CHECK(count_state(states, "ready") == 2);
  CHECK(count_state(states, "standby") == 1);
  for (const auto& r : after.replicas) CHECK(r.node == keep);
  auto k = f.generate(request("after-node"));
  f.advance(200ms);
  REQUIRE(k->result.has_value());
  CHECK_FALSE(k->result->err.has_value());
}

TEST_CASE("a lost node moves the warm-pool take, refill and migration counters and the standby gauge",
          "[actors][warm_pool][metrics]") {
  auto o = test::cluster_fixture::defaults(2);
  o.deployments[0].warm_pool_percent = 50;  // 2 serving, 1 standing by
  test::cluster_fixture f(o);
  f.advance(200ms);
  const auto metrics = [&] {
    std::string text;
    f.backend().metrics([&](std::string t) { text = std::move(t); });
    f.run();
    return text;
  };
  auto m = metrics();
  // The first standby was placed to stand by: a refill; nothing taken yet.
  CHECK_THAT(m, Catch::Contains("exaserve_warm_pool_events_total{deployment=\"tiny\",event=\"refill\"} 1\n"));
  CHECK_THAT(m, !Catch::Contains("event=\"take\""));
  CHECK_THAT(m, Catch::Contains("exaserve_warm_pool_standby{deployment=\"tiny\"} 1\n"));
  CHECK_THAT(m, Catch::Contains("exaserve_warm_pool_wanted{deployment=\"tiny\"} 1\n"));
  CHECK_THAT(m, !Catch::Contains("exaserve_migrations_total{"));
  const auto s = f.status();
  std::string standby;
  for (const auto& r : s.replicas)
    if (r.state == "standby") standby = r.id;
  REQUIRE_FALSE(standby.empty());
  const std::uint32_t keep = node_of(s, standby);
  std::uint32_t lost = keep;
  std::size_t on_lost = 0;
  for (const auto& r : s.replicas)
    if (r.node != keep) lost = r.node;
  for (const auto& r : s.replicas) on_lost += r.node == lost;
  REQUIRE(lost != keep);
  // Loads take 5 s on the surviving node, so the empty pool can be seen.
  caf::anon_send(f.node(keep), actors::inject_fault{"slow_load", 0, 60000, 5000});
  f.run();
  caf::anon_send_exit(f.node(lost), caf::exit_reason::user_shutdown);
  f.run();
  m = metrics();
  // The standby serves now; its replacement is placed, still loading.
  CHECK_THAT(m, Catch::Contains("exaserve_warm_pool_events_total{deployment=\"tiny\",event=\"take\"} 1\n"));
  CHECK_THAT(m, Catch::Contains("exaserve_warm_pool_standby{deployment=\"tiny\"} 0\n"));
  CHECK_THAT(m, Catch::Contains("exaserve_migrations_total{reason=\"node_lost\"} " + std::to_string(on_lost) + "\n"));
  CHECK_THAT(m, Catch::Contains("exaserve_warm_pool_events_total{deployment=\"tiny\",event=\"refill\"} 2\n"));
  f.advance(6000ms);
  m = metrics();
  // Loaded on the surviving node: a standby again, and nothing counted twice.
  CHECK_THAT(m, Catch::Contains("exaserve_warm_pool_standby{deployment=\"tiny\"} 1\n"));
  CHECK_THAT(m, Catch::Contains("exaserve_warm_pool_events_total{deployment=\"tiny\",event=\"refill\"} 2\n"));
  CHECK_THAT(m, Catch::Contains("exaserve_warm_pool_events_total{deployment=\"tiny\",event=\"take\"} 1\n"));
}

TEST_CASE("a pool too small for a standby reads 0 of 0, a deployment without one exports none",
          "[actors][warm_pool][metrics]") {
  auto o = test::cluster_fixture::defaults(2);
  const bool pooled = GENERATE(true, false);
  o.deployments[0].warm_pool_percent = pooled ? 10 : 0;  // 10 % of 2 serving is no standby
  test::cluster_fixture f(o);
  f.advance(200ms);
  std::string text;
  f.backend().metrics([&](std::string t) { text = std::move(t); });
  f.run();
  REQUIRE_THAT(text, Catch::Contains("exaserve_replicas{"));
  // The alert on an empty pool must fire for neither.
  if (pooled) {
    CHECK_THAT(text, Catch::Contains("exaserve_warm_pool_standby{deployment=\"tiny\"} 0\n"));
    CHECK_THAT(text, Catch::Contains("exaserve_warm_pool_wanted{deployment=\"tiny\"} 0\n"));
  } else {
    CHECK_THAT(text, !Catch::Contains("exaserve_warm_pool_standby{"));
  }
  CHECK_THAT(text, !Catch::Contains("exaserve_warm_pool_events_total{"));
}

TEST_CASE("warmed standbys give their turn to load back, so the whole pool loads one at a time", "[actors][warm_pool]") {
  auto o = test::cluster_fixture::defaults(4);
  o.deployments[0].warm_pool_percent = 50;  // 4 serving, 2 standing by
  o.loads_max = 1;
  test::cluster_fixture f(o);
  f.advance(500ms);
  const auto states = states_of(f.status(), "tiny");
  CHECK(states.size() == 6);
  CHECK(count_state(states, "ready") == 4);
  CHECK(count_state(states, "standby") == 2);
}

TEST_CASE("a scale-up takes the warm pool first and a scale-down sends the extra back to it", "[actors][warm_pool]") {
  auto o = test::cluster_fixture::defaults(2);
  o.deployments[0].warm_pool_percent = 50;
  test::cluster_fixture f(o);
  f.advance(200ms);
  std::string standby;
  for (const auto& [id, s] : states_of(f.status(), "tiny"))
    if (s == "standby") standby = id;
  REQUIRE_FALSE(standby.empty());
  REQUIRE(scale(f, 3));
  auto now = states_of(f.status(), "tiny");  // no time passed
  CHECK(now[standby] == "ready");
  f.advance(200ms);
  auto grown = states_of(f.status(), "tiny");
  CHECK(count_state(grown, "ready") == 3);
  CHECK(count_state(grown, "standby") == 1);  // floor(3 × 50 %)
  CHECK(serving_replicas(f) == 3);
  REQUIRE(scale(f, 2));
  f.advance(200ms);
  auto shrunk = states_of(f.status(), "tiny");
  CHECK(count_state(shrunk, "ready") == 2);
  CHECK(count_state(shrunk, "standby") == 1);
  CHECK(shrunk.size() == 3);
}

TEST_CASE("the autoscaler follows load up, down, to zero, and the next request wakes it", "[actors][autoscale]") {
  auto o = test::cluster_fixture::defaults(1);
  o.model_step_time = true;
  o.request_deadline_ms = 60000;
  o.autoscale_tick_ms = 100;
  o.autoscale_up_window_s = 1;
  o.autoscale_up_cooldown_s = 1;
  o.autoscale_down_window_s = 3;
  o.autoscale_down_cooldown_s = 1;
  o.autoscale_max_down_percent = 100;
  auto& d = o.deployments[0];
  d.warm_pool_percent = 0;
  d.autoscale_min = 0;
  d.autoscale_max = 3;
  d.autoscale_metric = "queue_depth";
  d.autoscale_target = 2;
  d.idle_to_zero_s = 5;
  test::cluster_fixture f(o);
  f.advance(200ms);
  REQUIRE(serving_replicas(f) == 1);

  // Eight long requests at a time: 8 outstanding at a target of 2 wants 4, capped at 3.
  std::vector<std::shared_ptr<test::recording_sink>> sinks;
  std::uint32_t peak = 0;
  for (int t = 0; t < 60; ++t) {
    std::size_t open = 0;
    for (const auto& k : sinks) open += !k->result.has_value();
    while (open++ < 8) sinks.push_back(f.generate(request("l" + std::to_string(sinks.size()), 64)));
    f.advance(100ms, 5ms);
    peak = std::max(peak, serving_replicas(f));
  }
  CHECK(peak == 3);
  // Status carries the last minute's latency as the router saw it (for top).
  bool listed = false;
  for (const auto& m : f.status().models)
    if (m.name == "tiny") {
      listed = true;
      CHECK(m.ttft_p50_ms > 0);
      CHECK(m.ttft_p99_ms >= m.ttft_p50_ms);
      CHECK(m.tpot_p50_ms > 0);
      CHECK(m.tpot_p99_ms >= m.tpot_p50_ms);
    }
  CHECK(listed);
  // Quiet: down within the window and cooldowns, then to zero once idle.
  f.advance(30000ms, 50ms);
  for (const auto& k : sinks) {
    REQUIRE(k->result.has_value());
    CHECK_FALSE(k->result->err.has_value());
  }
  CHECK(serving_replicas(f) == 0);
  CHECK(states_of(f.status(), "tiny").empty());
  // Cold: a request wakes it, waits, and is served.
  auto woke = f.generate(request("wake"));
  f.advance(2000ms, 10ms);
  REQUIRE(woke->result.has_value());
  CHECK_FALSE(woke->result->err.has_value());
  CHECK(serving_replicas(f) == 1);
}

TEST_CASE("a deployment whose autoscaling cannot work is refused with the reason", "[actors][autoscale]") {
  auto o = test::cluster_fixture::defaults(1);
  test::cluster_fixture f(o);
  api::deploy_request d;
  d.name = "bad";
  d.replicas = 1;
  d.autoscale_min = 4;
  d.autoscale_max = 2;
  std::optional<expected<void>> out;
  f.backend().deploy(d, [&](expected<void> r) { out = std::move(r); });
  f.run();
  REQUIRE(out.has_value());
  REQUIRE_FALSE(*out);
  CHECK_THAT(out->error().message, Catch::Contains("min_replicas"));
  d.autoscale_min = 1;
  d.autoscale_metric = "qps";
  out.reset();
  f.backend().deploy(d, [&](expected<void> r) { out = std::move(r); });
  f.run();
  REQUIRE(out.has_value());
  REQUIRE_FALSE(*out);
  CHECK_THAT(out->error().message, Catch::Contains("queue_depth"));
}

TEST_CASE("an autoscaled deployment keeps its count through a rollout and the new version after it",
          "[actors][autoscale]") {
  auto o = test::cluster_fixture::defaults(2);
  o.model_step_time = true;
  o.request_deadline_ms = 60000;
  o.rollout_tick_ms = 100;
  o.rollout_min_samples = 5;
  o.rollout_drop_grace_ms = 300;
  o.autoscale_tick_ms = 100;
  auto& d = o.deployments[0];
  d.autoscale_min = 1;
  d.autoscale_max = 4;
  d.autoscale_target = 1000;  // never up; down only after the (long) default window
  test::cluster_fixture f(o);
  f.advance(200ms);
  api::rollout_request r;
  r.what = api::rollout_request::op::start;
  r.name = "tiny";
  r.model_file = test::tiny_model_path();
  r.steps = "100";
  r.bake_s = 1;
  r.surge = 1;
  std::optional<expected<api::rollout_result>> begun;
  f.backend().rollout(r, [&](expected<api::rollout_result> x) { begun = std::move(x); });
  f.run();
  REQUIRE(begun.has_value());
  REQUIRE(*begun);
  for (int i = 0; i < 80; ++i) {
    auto k = f.generate(request("r" + std::to_string(i)));
    f.advance(100ms, 5ms);
  }
  f.advance(5000ms, 20ms);
  std::uint32_t new_ready = 0, old_left = 0;
  for (const auto& x : f.status().replicas) {
    new_ready += x.deployment == "tiny@2" && x.state == "ready";
    old_left += x.deployment == "tiny";
  }
  CHECK(old_left == 0);
  CHECK(new_ready == 2);  // the autoscaler did not take the new version for a cold one
  CHECK(serving_replicas(f) == 2);
}

namespace {

actors::cluster_options two_single_device_nodes(std::uint64_t device_bytes) {
  auto o = test::cluster_fixture::defaults(2);
  o.devices_per_node = 1;
  o.device_memory_bytes = device_bytes;
  o.deployments[0].name = "a";
  o.deployments[0].kv_tokens = 2048;
  o.deployments[0].max_replicas_per_node = 2;
  o.deployments[0].warm_pool_percent = 0;
  return o;
}

expected<void> deploy(test::cluster_fixture& f, const api::deploy_request& d) {
  std::optional<expected<void>> out;
  f.backend().deploy(d, [&](expected<void> r) { out = std::move(r); });
  f.run();
  REQUIRE(out.has_value());
  return *out;
}

api::deploy_request big_one() {
  api::deploy_request d;
  d.name = "b";
  d.replicas = 1;
  d.kv_tokens = 3072;
  d.warm_pool_percent = 0;
  return d;
}

}  // namespace

TEST_CASE("a replica that fits nowhere gets room: another moves to the other node first", "[actors][defrag]") {
  // Measure one replica of each on roomy devices.
  std::uint64_t a_bytes = 0, b_bytes = 0;
  {
    test::cluster_fixture probe(two_single_device_nodes(64ull << 20));
    probe.advance(200ms);
    REQUIRE(deploy(probe, big_one()));
    probe.advance(200ms);
    std::uint64_t lo = UINT64_MAX, hi = 0;
    for (const auto& d : probe.status().devices) {
      lo = std::min(lo, d.memory_used_bytes);
      hi = std::max(hi, d.memory_used_bytes);
    }
    a_bytes = lo;
    b_bytes = hi - lo;
  }
  REQUIRE(b_bytes > a_bytes);
  REQUIRE(b_bytes < 3 * a_bytes);
  // Devices that hold two a's, or one b, but not an a and a b: each a sits
  // on its own node, and b fits nowhere, though there is room in total.
  const std::uint64_t device = 2 * a_bytes + (b_bytes - a_bytes) / 2;
  test::cluster_fixture f(two_single_device_nodes(device));
  f.advance(200ms);
  auto before = f.status();
  std::set<std::uint32_t> a_nodes;
  for (const auto& r : before.replicas) a_nodes.insert(r.node);
  REQUIRE(a_nodes.size() == 2);
  REQUIRE(deploy(f, big_one()));  // kept: room is being made
  f.advance(1000ms);
  const auto after = f.status();
  std::map<std::string, std::set<std::uint32_t>> nodes_of;
  std::map<std::string, std::size_t> ready;
  for (const auto& r : after.replicas) {
    nodes_of[r.deployment].insert(r.node);
    ready[r.deployment] += r.state == "ready";
  }
  CHECK(ready["a"] == 2);
  CHECK(ready["b"] == 1);
  REQUIRE(nodes_of["a"].size() == 1);  // both a's packed on one node
  REQUIRE(nodes_of["b"].size() == 1);
  CHECK(*nodes_of["a"].begin() != *nodes_of["b"].begin());
  auto k = f.generate(request("to-b"));
  k = f.generate([] {
    auto r = request("to-b");
    r.model = "b";
    return r;
  }());
  f.advance(200ms);
  REQUIRE(k->result.has_value());
  CHECK_FALSE(k->result->err.has_value());
}

TEST_CASE("a new deployment of a file already loaded on a node goes to that node", "[actors][cache]") {
  auto o = test::cluster_fixture::defaults(1);
  o.nodes = 3;
  o.devices_per_node = 1;
  test::cluster_fixture f(o);
  f.advance(200ms);
  const auto before = f.status();
  REQUIRE(before.replicas.size() == 1);
  const auto home = before.replicas[0].node;
  api::deploy_request twin;
  twin.name = "twin";  // the same model file (the default)
  twin.replicas = 1;
  REQUIRE(deploy(f, twin));
  f.advance(200ms);
  std::uint32_t twin_node = 99;
  for (const auto& r : f.status().replicas)
    if (r.deployment == "twin") twin_node = r.node;
  // Least loaded would be another node; the cache that holds the file wins.
  CHECK(twin_node == home);
}
