// The controller's slot state machine: epochs only move forward, a lost
// replica's slot is fenced and queued, the pump places a few at a time and
// never on cordoned or down nodes, superseded and scaled-away slots are
// dropped, and a slot that keeps failing is given up until retried.

#include <catch2/catch.hpp>

#include <chrono>

#include "cluster/hardware.hpp"
#include "cluster/slot_scheduler.hpp"

// GCC 12 warns -Wrestrict inside std::string's inlined assignment of a
// literal (GCC bug 105651, a false positive): silenced in this file only.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

using namespace exa;
using namespace exa::cluster;
using namespace std::chrono_literals;

namespace {

cluster_state three_nodes() {
  std::vector<node_info> nodes;
  for (node_id n = 0; n < 3; ++n) nodes.push_back({n, n, 2, 80 * gib_bytes});
  auto s = cluster_state::create(nodes, 0);
  REQUIRE(s);
  return std::move(*s);
}

deployment_spec spec(std::uint32_t replicas) {
  deployment_spec d;
  d.name = "d";
  d.model = *model_shape_preset("tiny", precision::fp16);
  d.replicas = replicas;
  d.replica.kv_tokens = 1024;
  return d;
}

struct fixture {
  cluster_state placement = three_nodes();
  deployment_spec d = spec(4);
  bool deployed = true;
  std::set<node_id> down;
  slot_scheduler slots{slot_scheduler_config{2, 3, std::chrono::minutes(1)}};

  slot_scheduler::pump_result pump() {
    return slots.pump(placement, [&](const std::string& name) { return deployed && name == "d" ? &d : nullptr; }, down);
  }
};

const slot_ref s0{"d", 0}, s1{"d", 1}, s2{"d", 2}, s3{"d", 3};

}  // namespace

TEST_CASE("slot epochs only move forward", "[cluster][slots]") {
  slot_scheduler s({});
  CHECK(s.epoch(s0) == 0);
  CHECK(s.raise_epoch(s0, 3));
  CHECK_FALSE(s.raise_epoch(s0, 3));  // no change: nothing to persist
  CHECK_FALSE(s.raise_epoch(s0, 2));
  CHECK(s.epoch(s0) == 3);
  CHECK(s.stale(s0, 2));
  CHECK_FALSE(s.stale(s0, 3));
  CHECK(s.epochs().size() == 1);
}

TEST_CASE("a lost replica's slot is fenced and placed again away from where it failed", "[cluster][slots]") {
  fixture f;
  f.slots.raise_epoch(s0, 1);
  const auto r = f.slots.replace(s0, {0}, 0ns);
  CHECK(r.fenced);
  CHECK(r.epoch == 2);
  CHECK(f.slots.epoch(s0) == 2);
  CHECK(f.slots.queued(s0));
  const auto p = f.pump();
  REQUIRE(p.started.size() == 1);
  CHECK(p.started[0].epoch == 2);
  CHECK(p.started[0].placed.slot == s0);
  CHECK(p.started[0].placed.node != 0);  // excluded
  CHECK(f.placement.replicas().count(p.started[0].placed.replica) == 1);  // committed
  CHECK(f.slots.warming() == 1);
  CHECK(f.slots.queue_length() == 0);
  CHECK(f.slots.settled(p.started[0].placed.replica));
  CHECK_FALSE(f.slots.settled(p.started[0].placed.replica));  // only once
  CHECK(f.slots.warming() == 0);
}

TEST_CASE("the pump keeps at most migration_parallelism replacements warming", "[cluster][slots]") {
  fixture f;
  for (const auto& s : {s0, s1, s2, s3}) CHECK(f.slots.replace(s, {}, 0ns).fenced);
  auto first = f.pump();
  CHECK(first.started.size() == 2);
  CHECK(f.slots.queue_length() == 2);
  CHECK(f.pump().started.empty());  // both still warming
  f.slots.settled(first.started[0].placed.replica);
  auto second = f.pump();
  REQUIRE(second.started.size() == 1);
  CHECK(second.started[0].placed.slot == s2);  // in queue order
}

TEST_CASE("nothing is placed on a cordoned node or one that is down", "[cluster][slots]") {
  fixture f;
  f.slots.cordon(1);
  f.down = {2};
  f.slots.replace(s0, {}, 0ns);
  auto p = f.pump();
  REQUIRE(p.started.size() == 1);
  CHECK(p.started[0].placed.node == 0);
  // Only node 0 is left, and the slot excluded it: it waits, queued, with the reason.
  f.slots.replace(s1, {0}, 0ns);
  auto w = f.pump();
  CHECK(w.started.empty());
  REQUIRE(w.waiting);
  CHECK(w.waiting->first == s1);
  CHECK_FALSE(w.waiting->second.empty());
  CHECK(f.slots.queued(s1));
  // Node 1 is healthy again: the slot goes there.
  f.slots.uncordon(1);
  auto later = f.pump();
  REQUIRE(later.started.size() == 1);
  CHECK(later.started[0].placed.node == 1);
}

TEST_CASE("a rejoined node may take back the slots that excluded it", "[cluster][slots]") {
  fixture f;
  f.down = {1, 2};
  f.slots.replace(s0, {0}, 0ns);
  CHECK(f.pump().waiting);
  f.slots.node_rejoined(0);
  auto p = f.pump();
  REQUIRE(p.started.size() == 1);
  CHECK(p.started[0].placed.node == 0);
}

TEST_CASE("superseded, scaled-away and undeployed slots are dropped from the queue", "[cluster][slots]") {
  fixture f;
  f.slots.replace(s0, {}, 0ns);
  f.slots.replace(s0, {}, 0ns);  // a second loss before the first was placed: epoch 2 queued twice
  f.slots.replace(s3, {}, 0ns);
  f.d.replicas = 3;  // scaled down: slot 3 is not wanted any more
  auto p = f.pump();
  REQUIRE(p.started.size() == 1);
  CHECK(p.started[0].placed.slot == s0);
  CHECK(p.started[0].epoch == 2);
  CHECK(f.slots.queue_length() == 0);
  f.slots.replace(s1, {}, 0ns);
  f.deployed = false;
  CHECK(f.pump().started.empty());
  CHECK(f.slots.queue_length() == 0);
}

TEST_CASE("a slot that keeps failing is given up until retried", "[cluster][slots]") {
  fixture f;  // 3 replacements per minute
  for (int i = 0; i < 3; ++i) CHECK(f.slots.replace(s0, {}, std::chrono::seconds(i)).fenced);
  const auto epoch = f.slots.epoch(s0);
  const auto spent = f.slots.replace(s0, {}, 3s);
  CHECK_FALSE(spent.fenced);
  CHECK(f.slots.epoch(s0) == epoch);  // no new epoch for a slot given up
  CHECK_FALSE(f.slots.retry(s0));     // still queued from before: nothing to retry
  f.pump();
  f.pump();
  while (f.slots.queue_length() > 0) {
    for (const auto& [id, p] : f.placement.replicas()) f.slots.settled(id);
    f.pump();
  }
  CHECK(f.slots.retry(s0));  // the budget starts afresh
  CHECK(f.slots.replace(s0, {}, 4s).fenced);
  // Outside the window the budget refills by itself.
  slot_scheduler s({1, 1, std::chrono::seconds(10)});
  CHECK(s.replace(s0, {}, 0s).fenced);
  CHECK_FALSE(s.replace(s0, {}, 5s).fenced);
  CHECK(s.replace(s0, {}, 11s).fenced);
}

TEST_CASE("a planned move is queued like a replacement but never spends the budget", "[cluster][slots]") {
  slot_scheduler s({1, 1, std::chrono::seconds(60)});  // one replacement a minute
  CHECK(s.replace(s0, {}, 0s).fenced);
  const epoch_t e = s.epoch(s0);
  // Drains move the slot again and again within the window.
  CHECK(s.move(s0, {0}) == e + 1);
  CHECK(s.move(s0, {}) == e + 2);
  CHECK(s.epoch(s0) == e + 2);
  CHECK(s.queued(s0));
  CHECK_FALSE(s.replace(s0, {}, 1s).fenced);  // the crash budget is still the only one spent
}
