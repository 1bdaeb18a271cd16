// Failure handling on the deterministic scheduler, in virtual time: suspect
// then confirm, fencing and migration, self-fencing under a partition,
// jitter that must not move anything, node loss, device hangs, and a
// deployment that loses every replica and comes back.

#include <catch2/catch.hpp>

#include <caf/actor_system.hpp>
#include <caf/send.hpp>

#include <map>
#include <set>

#include "actors/messages.hpp"
#include "chaos/event_log.hpp"
#include "cluster/fault_injector.hpp"
#include "cluster_fixture.hpp"

using namespace exa;
using namespace std::chrono_literals;

namespace {

// Tight timings: heartbeat every 100 ms, suspect after 5 missed (500 ms),
// confirm after a further 1 s window.
actors::cluster_options tight(std::uint32_t nodes, std::uint32_t replicas, std::shared_ptr<cluster::fault_injector> inj,
                              std::shared_ptr<chaos::event_log> log) {
  auto o = test::cluster_fixture::defaults(replicas);
  o.nodes = nodes;
  o.heartbeat_interval_ms = 100;
  o.suspect_after_missed = 5;
  o.observation_window_ms = 1000;
  o.device_check_interval_ms = 200;
  o.device_check_timeout_ms = 100;
  o.step_timeout_ms = 300;
  o.request_deadline_ms = 5000;
  o.fault_injector = std::move(inj);
  o.event_log = std::move(log);
  return o;
}

std::int64_t now_ns(test::cluster_fixture& f) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(f.system().clock().now().time_since_epoch()).count();
}

// A counter's value in the metrics text, 0 when its series is absent.
std::uint64_t counter_value(test::cluster_fixture& f, const std::string& series) {
  std::string text;
  f.backend().metrics([&](std::string t) { text = std::move(t); });
  f.run();
  const auto at = text.find("\n" + series + " ");
  if (at == std::string::npos) return 0;
  return std::stoull(text.substr(at + series.size() + 2));
}

std::map<std::uint32_t, api::replica_status> by_slot(const api::cluster_status& s) {
  std::map<std::uint32_t, api::replica_status> out;
  for (const auto& r : s.replicas) out[r.slot] = r;
  return out;
}

api::generate_request request(std::string id, std::uint32_t max_tokens = 6) {
  api::generate_request r;
  r.request_id = std::move(id);
  r.model = "tiny";
  r.prompt_text = "failure";
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

// At no point do two replicas of one slot both accept requests.
void check_one_serving_per_slot(const std::vector<chaos::event>& log) {
  std::map<std::int64_t, std::set<std::uint64_t>> live;  // slot -> replicas ready/serving
  for (const auto& e : log) {
    if (e.kind != chaos::event_kind::replica_state) continue;
    auto& s = live[e.slot];
    if (e.detail == "ready" || e.detail == "serving") s.insert(e.replica);
    else s.erase(e.replica);
    INFO("slot " << e.slot << " at " << e.t_ns / 1000000 << " ms");
    CHECK(s.size() <= 1);
  }
}

}  // namespace

TEST_CASE("a partition longer than the window: suspect, self-fence, confirm, migrate, rejoin", "[actors][failure]") {
  auto inj = std::make_shared<cluster::fault_injector>(1);
  auto log = std::make_shared<chaos::event_log>();
  test::cluster_fixture f(tight(3, 2, inj, log));
  f.advance(300ms);
  auto before = by_slot(f.status());
  REQUIRE(before.size() == 2);
  const auto lost_node = before.at(0).node;
  inj->arm(lost_node, cluster::channel_fault::partition, now_ns(f) + 3'000'000'000);

  const std::string misses = "exaserve_heartbeat_misses_total{node=\"" + std::to_string(lost_node) + "\"}";
  const auto misses_before = counter_value(f, misses);
  f.advance(700ms);  // 500 ms of silence: suspect
  auto s = f.status();
  for (const auto& n : s.nodes)
    if (n.id == lost_node) CHECK(n.state == "suspect");
  // Each silent 100 ms interval counted once: 5 to suspect, at most 7 in 700 ms.
  const auto misses_suspect = counter_value(f, misses) - misses_before;
  CHECK(misses_suspect >= 5);
  CHECK(misses_suspect <= 7);
  // New requests avoid the suspect node's replica.
  std::vector<std::shared_ptr<test::recording_sink>> sinks;
  for (int i = 0; i < 4; ++i) sinks.push_back(f.generate(request("p" + std::to_string(i))));
  f.run();
  for (const auto& k : sinks) {
    REQUIRE(k->result.has_value());
    CHECK(k->result->replica == before.at(1).id);
  }

  f.advance(1200ms);  // window over: confirmed, slot 0 fenced and placed elsewhere
  auto after = by_slot(f.status());
  REQUIRE(after.size() == 2);
  CHECK(after.at(0).node != lost_node);
  CHECK(after.at(0).epoch == before.at(0).epoch + 1);
  CHECK(after.at(0).state == "ready");
  CHECK(after.at(1).id == before.at(1).id);  // the healthy slot did not move
  CHECK(counter_value(f, "exaserve_migrations_total{reason=\"node_lost\"}") == 1);
  CHECK(counter_value(f, misses) - misses_before >= misses_suspect + 10);  // still silent, still counted

  f.advance(1500ms);  // the partition heals; the node rejoins
  s = f.status();
  for (const auto& n : s.nodes)
    if (n.id == lost_node) CHECK(n.state == "healthy");
  // The partitioned replica fenced itself before the replacement existed.
  bool self_fenced = false;
  for (const auto& e : log->events())
    self_fenced |= e.kind == chaos::event_kind::node_state && e.detail == "self_fenced" && e.node == lost_node;
  CHECK(self_fenced);
  check_one_serving_per_slot(log->events());
}

TEST_CASE("heartbeat jitter and a short partition raise at most suspicion, and nothing moves", "[actors][failure]") {
  auto inj = std::make_shared<cluster::fault_injector>(2);
  auto log = std::make_shared<chaos::event_log>();
  test::cluster_fixture f(tight(3, 2, inj, log));
  f.advance(300ms);
  const auto before = by_slot(f.status());
  // Heartbeats 300 ms late for 2 s: below the 500 ms suspicion threshold.
  inj->arm(before.at(0).node, cluster::channel_fault::jitter, now_ns(f) + 2'000'000'000, 1.0, 300'000'000);
  f.advance(2500ms);
  // A 700 ms partition: suspect at 500 ms, healthy again well inside the window.
  inj->arm(before.at(1).node, cluster::channel_fault::partition, now_ns(f) + 700'000'000);
  f.advance(2000ms);
  const auto after = by_slot(f.status());
  for (const auto& [slot, r] : after) {
    CHECK(r.id == before.at(slot).id);
    CHECK(r.epoch == before.at(slot).epoch);
    CHECK(r.state == "ready");
  }
  std::size_t suspects = 0, confirms = 0;
  for (const auto& e : log->events()) {
    if (e.kind != chaos::event_kind::node_state) continue;
    suspects += e.detail == "suspect";
    confirms += e.detail == "confirmed" || e.detail == "self_fenced";
  }
  CHECK(suspects == 1);  // only the partitioned node, and only suspected
  CHECK(confirms == 0);
}

TEST_CASE("a killed node's replicas are placed elsewhere at once", "[actors][failure]") {
  auto log = std::make_shared<chaos::event_log>();
  test::cluster_fixture f(tight(3, 2, nullptr, log));
  f.advance(200ms);
  const auto before = by_slot(f.status());
  const auto node = f.node(before.at(0).node);
  caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
  f.run();
  f.advance(100ms);
  const auto after = by_slot(f.status());
  REQUIRE(after.size() == 2);
  CHECK(after.at(0).node != before.at(0).node);
  CHECK(after.at(0).epoch == before.at(0).epoch + 1);
  CHECK(after.at(0).state == "ready");
  check_one_serving_per_slot(log->events());
}

TEST_CASE("a replica stopped without draining says so: ready to draining to stopped", "[actors][failure]") {
  // What a controller sends a node for a replica it will not adopt. ready ->
  // stopped is no lifecycle step: the stop used to happen unannounced, and
  // the replica looked as if it still served.
  auto log = std::make_shared<chaos::event_log>();
  test::cluster_fixture f(tight(2, 2, nullptr, log));
  f.advance(200ms);
  const auto before = by_slot(f.status());
  const auto& victim = before.at(0);
  REQUIRE(victim.state == "ready");
  caf::anon_send(f.node(victim.node), actors::stop_replica{std::stoull(victim.id), false});
  f.run();
  std::vector<std::string> states;
  for (const auto& e : log->events())
    if (e.kind == chaos::event_kind::replica_state && e.replica == std::stoull(victim.id)) states.push_back(e.detail);
  REQUIRE(states.size() >= 2);
  CHECK(states[states.size() - 2] == "draining");
  CHECK(states.back() == "stopped");
  check_one_serving_per_slot(log->events());
}

TEST_CASE("a hung device is found by its health check and its replica serves again", "[actors][failure]") {
  auto log = std::make_shared<chaos::event_log>();
  test::cluster_fixture f(tight(2, 1, nullptr, log));
  f.advance(200ms);
  const auto before = by_slot(f.status());
  auto sink = f.generate(request("during-hang", 40));
  f.run_some(30);
  caf::anon_send(f.node(before.at(0).node), actors::inject_fault{"hang", before.at(0).device, 5000, 0});
  f.advance(2000ms);
  REQUIRE(sink->result.has_value());  // resumed on the restarted replica, or elsewhere
  CHECK_FALSE(sink->result->err.has_value());
  CHECK(sink->result->usage.completion_tokens == 40);
  bool detected = false;
  for (const auto& e : log->events()) detected |= e.kind == chaos::event_kind::fault_detected && e.detail == "device_check";
  CHECK(detected);
  f.advance(500ms);
  CHECK(by_slot(f.status()).at(0).state == "ready");
}

TEST_CASE("losing every replica gives clear errors, and serving resumes when capacity returns", "[actors][failure]") {
  auto inj = std::make_shared<cluster::fault_injector>(3);
  test::cluster_fixture f(tight(2, 2, inj, nullptr));
  f.advance(200ms);
  // Both nodes cut off for 6 s: both self-fence, both are confirmed failed,
  // and there is nowhere to place the slots.
  for (cluster::node_id n = 0; n < 2; ++n)
    inj->arm(n, cluster::channel_fault::partition, now_ns(f) + 6'000'000'000);
  f.advance(2000ms);
  auto refused = f.generate(request("nowhere"));
  f.advance(5500ms);  // past the 5 s request deadline
  REQUIRE(refused->result.has_value());
  REQUIRE(refused->result->err.has_value());
  CHECK(refused->result->err->code == errc::deadline_exceeded);
  CHECK_THAT(refused->result->err->message, Catch::Contains("no ready replica"));
  f.advance(1000ms);  // partitions healed at 6 s: nodes rejoin, slots are placed again
  const auto s = f.status();
  std::size_t ready = 0;
  for (const auto& r : s.replicas) ready += r.state == "ready";
  CHECK(ready == 2);
  auto ok = f.generate(request("back"));
  f.run();
  REQUIRE(ok->result.has_value());
  CHECK_FALSE(ok->result->err.has_value());
}
