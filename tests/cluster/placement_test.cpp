// Placement: first-fit-decreasing with spreading, TP groups on one node,
// anti-affinity per node and per rack, reasons for what does not fit,
// incremental placement and replacement after a failure, and the reference
// scale (3072 replicas on 256 nodes × 8 GPUs).

#include <catch2/catch.hpp>

#include <chrono>
#include <map>
#include <set>

#include "cluster/hardware.hpp"
#include "cluster/placement.hpp"

using namespace exa;
using namespace exa::cluster;
using Catch::Matchers::Contains;

namespace {

const std::uint64_t h100_bytes = 81559 * mib_bytes;

std::vector<node_info> topology(std::uint32_t nodes, std::uint32_t devices, std::uint32_t nodes_per_rack,
                                std::uint64_t memory_bytes = h100_bytes) {
  std::vector<node_info> out;
  for (std::uint32_t n = 0; n < nodes; ++n) out.push_back({n, n / nodes_per_rack, devices, memory_bytes});
  return out;
}

cluster_state make_state(const std::vector<node_info>& nodes, std::uint64_t reserve = gpu_device_reserved_bytes) {
  auto s = cluster_state::create(nodes, reserve);
  REQUIRE(s.has_value());
  return std::move(*s);
}

model_shape preset(const char* name, precision p = precision::fp16) {
  auto s = model_shape_preset(name, p);
  REQUIRE(s.has_value());
  return *s;
}

deployment_spec deployment(std::string name, const char* model, std::uint32_t replicas, std::uint32_t tp = 1,
                           std::uint64_t kv_tokens = 4096) {
  deployment_spec d;
  d.name = std::move(name);
  d.version = "v1";
  d.model = preset(model);
  d.replicas = replicas;
  d.replica.tensor_parallel = tp;
  d.replica.kv_tokens = kv_tokens;
  d.replica.replica_overhead_bytes = gpu_replica_overhead_bytes;
  return d;
}

// A deployment whose replicas take exactly `gib` GiB on one device.
deployment_spec sized(std::string name, std::uint32_t replicas, std::uint64_t gib) {
  deployment_spec d = deployment(std::move(name), "tiny", replicas, 1, 0);
  const memory_breakdown base = *estimate(d.model, d.replica);
  d.replica.replica_overhead_bytes = gib * gib_bytes - base.total_bytes();
  return d;
}

placement_plan place_ok(cluster_state& s, const std::vector<deployment_spec>& d) {
  auto plan = place(s, d);
  REQUIRE(plan.has_value());
  return std::move(*plan);
}

// Cross-checks a plan against the state's ledgers: every placed replica is on
// distinct devices of one node, each holding exactly its share.
void check_consistent(const cluster_state& s, const placement_plan& plan) {
  for (const placed_slot& p : plan.placed) {
    REQUIRE(s.replicas().count(p.replica) == 1);
    std::set<std::uint32_t> distinct(p.devices.begin(), p.devices.end());
    CHECK(distinct.size() == p.devices.size());
    for (std::uint32_t d : p.devices) {
      const device_ledger* l = s.ledger({p.node, d});
      REQUIRE(l != nullptr);
      REQUIRE(l->holds(p.replica));
      CHECK(l->entries().at(p.replica) == p.per_device);
    }
  }
}

std::map<node_id, std::uint32_t> per_node(const placement_plan& plan) {
  std::map<node_id, std::uint32_t> out;
  for (const placed_slot& p : plan.placed) ++out[p.node];
  return out;
}

}  // namespace

TEST_CASE("reference scale: 3072 replicas on 256 nodes x 8 H100s", "[placement]") {
  cluster_state s = make_state(topology(256, 8, 16));
  const deployment_spec d = deployment("llama-7b", "llama-2-7b", 3072);
  const auto t0 = std::chrono::steady_clock::now();
  const placement_plan plan = place_ok(s, {d});
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  WARN("placed 3072 replicas on 256 nodes x 8 devices in " << ms << " ms");
  REQUIRE(plan.unplaced.empty());
  REQUIRE(plan.placed.size() == 3072);
  const auto counts = per_node(plan);
  REQUIRE(counts.size() == 256);
  for (const auto& [node, n] : counts) CHECK(n == 12);
  // Spread within nodes too: 12 replicas over 8 devices is 2,2,2,2,1,1,1,1.
  for (const node_info& n : s.nodes()) {
    std::uint32_t twos = 0;
    for (std::uint32_t dev = 0; dev < n.devices; ++dev) {
      const std::size_t held = s.ledger({n.id, dev})->replica_count();
      CHECK((held == 1 || held == 2));
      twos += held == 2;
    }
    CHECK(twos == 4);
  }
  check_consistent(s, plan);
  std::set<replica_id> ids;
  for (const placed_slot& p : plan.placed) ids.insert(p.replica);
  CHECK(ids.size() == 3072);
}

TEST_CASE("the same input gives the same plan", "[placement]") {
  const auto nodes = topology(12, 8, 4);
  const std::vector<deployment_spec> d = {deployment("a", "llama-2-7b", 30), deployment("b", "llama-2-70b", 7, 2),
                                          deployment("c", "llama-3-8b", 19)};
  cluster_state s1 = make_state(nodes), s2 = make_state(nodes);
  const placement_plan p1 = place_ok(s1, d), p2 = place_ok(s2, d);
  REQUIRE(p1.placed.size() == p2.placed.size());
  for (std::size_t i = 0; i < p1.placed.size(); ++i) {
    CHECK(p1.placed[i].slot == p2.placed[i].slot);
    CHECK(p1.placed[i].node == p2.placed[i].node);
    CHECK(p1.placed[i].devices == p2.placed[i].devices);
    CHECK(p1.placed[i].replica == p2.placed[i].replica);
  }
  // Largest first: the 70B TP groups lead the plan.
  CHECK(p1.placed.front().slot.deployment == "b");
  check_consistent(s1, p1);
}

TEST_CASE("a TP group takes distinct devices of one node", "[placement]") {
  cluster_state s = make_state(topology(4, 8, 2));
  const placement_plan plan = place_ok(s, {deployment("big", "llama-2-70b", 8, 2)});
  REQUIRE(plan.unplaced.empty());
  for (const placed_slot& p : plan.placed) {
    CHECK(p.devices.size() == 2);
    CHECK(p.per_device.weights_bytes == preset("llama-2-70b").weight_bytes / 2);
  }
  for (const auto& [node, n] : per_node(plan)) CHECK(n == 2);  // default: spread 8 over 4 nodes
  check_consistent(s, plan);
}

TEST_CASE("placement agrees with the replicas-per-node formula", "[placement]") {
  // Two paths to one number: the formula the plan command prints, and what
  // placement actually packs onto one node.
  struct row { const char* model; std::uint32_t tp; std::uint32_t devices; std::uint64_t kv_tokens; };
  const row rows[] = {{"llama-2-7b", 1, 8, 4096}, {"llama-2-7b", 2, 8, 65536}, {"llama-2-70b", 2, 8, 4096},
                      {"llama-3-8b", 4, 6, 400000}, {"llama-2-13b", 8, 8, 8192}};
  for (const row& r : rows) {
    cluster_state s = make_state(topology(1, r.devices, 1));
    deployment_spec d = deployment("m", r.model, 200, r.tp, r.kv_tokens);
    d.max_replicas_per_node = 200;
    const memory_breakdown m = *estimate(d.model, d.replica);
    const device_spec dev = *device_preset("h100-80gb");
    const std::uint64_t expect = replicas_per_node(shards_per_device(m, dev), r.devices, r.tp);
    INFO(r.model << " tp " << r.tp << " devices " << r.devices);
    REQUIRE(expect > 0);
    CHECK(place_ok(s, {d}).placed.size() == expect);
  }
}

TEST_CASE("first-fit-decreasing places the big replica before small ones spread", "[placement]") {
  // Two nodes with one 100 GiB device each. Placed in input order with
  // spreading, the two small replicas would take 30 GiB on both nodes and
  // leave no room for the 80 GiB one.
  cluster_state s = make_state(topology(2, 1, 1, 100 * gib_bytes), 0);
  deployment_spec small = sized("small", 2, 30);
  small.max_replicas_per_node = 2;
  const placement_plan plan = place_ok(s, {small, sized("big", 1, 80)});
  REQUIRE(plan.unplaced.empty());
  REQUIRE(plan.placed.size() == 3);
  CHECK(plan.placed[0].slot.deployment == "big");
  const node_id big_node = plan.placed[0].node;
  CHECK(plan.placed[1].node != big_node);
  CHECK(plan.placed[2].node != big_node);
}

TEST_CASE("anti-affinity per node: the default spreads evenly", "[placement]") {
  cluster_state s = make_state(topology(3, 8, 3));
  const placement_plan plan = place_ok(s, {deployment("a", "llama-2-7b", 7)});
  REQUIRE(plan.unplaced.empty());
  std::multiset<std::uint32_t> counts;
  for (const auto& [node, n] : per_node(plan)) counts.insert(n);
  CHECK(counts == std::multiset<std::uint32_t>{2, 2, 3});  // limit ceil(7 / 3) = 3
}

TEST_CASE("anti-affinity per node: an explicit limit leaves the rest unplaced", "[placement]") {
  cluster_state s = make_state(topology(2, 8, 2));
  deployment_spec d = deployment("a", "llama-2-7b", 3);
  d.max_replicas_per_node = 1;
  const placement_plan plan = place_ok(s, {d});
  CHECK(plan.placed.size() == 2);
  REQUIRE(plan.unplaced.size() == 1);
  CHECK(plan.unplaced[0].slot == slot_ref{"a", 2});
  CHECK_THAT(plan.unplaced[0].reason,
             Contains("deployment 'a' replica 2") && Contains("anti-affinity: all 2 nodes already hold 1"));
}

TEST_CASE("anti-affinity per rack", "[placement]") {
  cluster_state s = make_state(topology(8, 8, 2));  // 4 racks of 2 nodes
  deployment_spec d = deployment("a", "llama-2-7b", 10);
  d.max_replicas_per_rack = 2;
  d.max_replicas_per_node = 10;
  const placement_plan plan = place_ok(s, {d});
  CHECK(plan.placed.size() == 8);
  std::map<rack_id, std::uint32_t> racks;
  for (const placed_slot& p : plan.placed) ++racks[p.node / 2];
  CHECK(racks.size() == 4);
  for (const auto& [rack, n] : racks) CHECK(n == 2);
  // Rack spreading first, then node: both replicas of a rack on distinct nodes.
  for (const auto& [node, n] : per_node(plan)) CHECK(n == 1);
  REQUIRE(plan.unplaced.size() == 2);
  CHECK_THAT(plan.unplaced[0].reason, Contains("anti-affinity: all 4 racks already hold 2 replicas"));
}

TEST_CASE("a deployment spreads over racks before nodes", "[placement]") {
  // Two racks of two nodes: two replicas land in different racks, so losing
  // a rack (its switch, its power) loses at most one.
  cluster_state s = make_state(topology(4, 8, 2));
  const placement_plan plan = place_ok(s, {deployment("a", "llama-2-7b", 2)});
  REQUIRE(plan.placed.size() == 2);
  CHECK(plan.placed[0].node / 2 != plan.placed[1].node / 2);
}

TEST_CASE("a new deployment prefers the least-loaded node", "[placement]") {
  cluster_state s = make_state(topology(3, 8, 3));
  deployment_spec heavy = deployment("heavy", "llama-2-7b", 2);
  heavy.max_replicas_per_node = 2;
  const placement_plan first = place_ok(s, {heavy});
  REQUIRE(first.placed.size() == 2);
  const placement_plan second = place_ok(s, {deployment("light", "llama-3-8b", 1)});
  REQUIRE(second.placed.size() == 1);
  // "heavy" took nodes 0 and 1 (spread); node 2 is the emptiest.
  CHECK(second.placed[0].node == 2);
}

TEST_CASE("reasons name what does not fit", "[placement]") {
  SECTION("memory") {
    cluster_state s = make_state(topology(2, 2, 1));
    const placement_plan plan = place_ok(s, {deployment("big", "llama-2-70b", 1, 1)});
    REQUIRE(plan.unplaced.size() == 1);
    CHECK_THAT(plan.unplaced[0].reason, Contains("deployment 'big' replica 0: needs 130.67 GiB on one device; "
                                                 "largest free device has 79.15 GiB"));
    const placement_plan tp2 = place_ok(s, {deployment("big2", "llama-2-70b", 1, 2, 2'000'000)});
    REQUIRE(tp2.unplaced.size() == 1);
    CHECK_THAT(tp2.unplaced[0].reason, Contains("on each of 2 devices of one node"));
  }
  SECTION("a TP group larger than any node") {
    cluster_state s = make_state(topology(2, 4, 1));
    const placement_plan plan = place_ok(s, {deployment("big", "llama-2-70b", 1, 8)});
    REQUIRE(plan.unplaced.size() == 1);
    CHECK_THAT(plan.unplaced[0].reason, Contains("needs a TP group of 8 devices on one node; the largest node has 4"));
  }
  SECTION("enough devices with room, but not on one node") {
    // Each node has one device with room left: a TP 2 group cannot form.
    cluster_state s = make_state(topology(2, 2, 1, 100 * gib_bytes), 0);
    deployment_spec filler = sized("filler", 2, 90);
    filler.max_replicas_per_node = 1;
    REQUIRE(place_ok(s, {filler}).unplaced.empty());
    deployment_spec pair = sized("pair", 1, 15);
    pair.replica.tensor_parallel = 2;
    const placement_plan plan = place_ok(s, {pair});
    REQUIRE(plan.unplaced.size() == 1);
    CHECK_THAT(plan.unplaced[0].reason, Contains("but no node has 2 such devices (best: 1)"));
  }
}

TEST_CASE("placement is incremental and idempotent", "[placement]") {
  cluster_state s = make_state(topology(4, 8, 2));
  deployment_spec a = deployment("a", "llama-2-7b", 4);
  const placement_plan first = place_ok(s, {a});
  REQUIRE(first.placed.size() == 4);
  CHECK(place_ok(s, {a}).placed.empty());  // nothing missing: nothing placed
  a.replicas = 8;
  const placement_plan more = place_ok(s, {a, deployment("b", "llama-3-8b", 4)});
  CHECK(more.placed.size() == 8);
  std::set<std::uint32_t> new_a;
  for (const placed_slot& p : more.placed) {
    if (p.slot.deployment == "a") new_a.insert(p.slot.index);
  }
  CHECK(new_a == std::set<std::uint32_t>{4, 5, 6, 7});
  CHECK(s.replicas().size() == 12);
  // Existing replicas count toward anti-affinity: still 2 of "a" per node.
  std::map<node_id, std::uint32_t> a_per_node;
  for (const auto& [id, r] : s.replicas()) {
    if (r.slot.deployment == "a") ++a_per_node[r.node];
  }
  for (const auto& [node, n] : a_per_node) CHECK(n == 2);
}

TEST_CASE("place_one replaces a slot on another node", "[placement]") {
  cluster_state s = make_state(topology(4, 8, 4));
  const deployment_spec d = deployment("a", "llama-2-7b", 8);
  const placement_plan plan = place_ok(s, {d});
  REQUIRE(plan.placed.size() == 8);
  // Node 0 dies: release its replicas and re-place their slots elsewhere.
  std::vector<placed_slot> lost;
  for (const placed_slot& p : plan.placed) {
    if (p.node == 0) lost.push_back(p);
  }
  REQUIRE(lost.size() == 2);
  for (const placed_slot& p : lost) REQUIRE(s.release(p.replica).has_value());
  for (const placed_slot& p : lost) {
    auto r = place_one(s, d, p.slot.index, {0});
    REQUIRE(r.has_value());
    CHECK(r->node != 0);
    CHECK(r->slot == p.slot);
    CHECK(r->replica > plan.placed.back().replica);  // ids are never reused
  }
  // The default limit spreads over the 3 surviving nodes: ceil(8 / 3) = 3.
  std::map<node_id, std::uint32_t> counts;
  for (const auto& [id, r] : s.replicas()) ++counts[r.node];
  CHECK(counts.count(0) == 0);
  for (const auto& [node, n] : counts) CHECK(n <= 3);
  CHECK(s.replicas().size() == 8);
}

TEST_CASE("place_one: the replaced replica does not count against anti-affinity", "[placement]") {
  cluster_state s = make_state(topology(2, 8, 2));  // one rack
  deployment_spec d = deployment("a", "llama-2-7b", 1);
  d.max_replicas_per_rack = 1;
  d.max_replicas_per_node = 5;
  const placement_plan plan = place_ok(s, {d});
  REQUIRE(plan.placed.size() == 1);
  const node_id old_node = plan.placed[0].node;
  // The old replica is still in the books (unreachable, not yet destroyed).
  auto r = place_one(s, d, 0, {old_node});
  REQUIRE(r.has_value());
  CHECK(r->node != old_node);
  // A different slot would still be refused by the rack limit.
  d.replicas = 2;
  auto other = place_one(s, d, 1, {});
  REQUIRE_FALSE(other.has_value());
  CHECK(other.error().code == errc::unavailable);
  CHECK_THAT(other.error().message, Contains("max_replicas_per_rack"));
}

TEST_CASE("place_one refuses when no node is left", "[placement]") {
  cluster_state s = make_state(topology(2, 8, 2));
  const deployment_spec d = deployment("a", "llama-2-7b", 2);
  auto r = place_one(s, d, 1, {0, 1});
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == errc::unavailable);
  CHECK_THAT(r.error().message, Contains("all 2 nodes are excluded"));
  CHECK(place_one(s, d, 2, {}).error().code == errc::invalid_argument);
  CHECK(s.replicas().empty());
}

TEST_CASE("bad specs are refused and change nothing", "[placement]") {
  cluster_state s = make_state(topology(2, 8, 2));
  deployment_spec ok = deployment("a", "llama-2-7b", 2);
  deployment_spec bad_tp = deployment("b", "llama-2-7b", 2, 3);
  CHECK_THAT(place(s, {ok, bad_tp}).error().message, Contains("deployment 'b'") && Contains("tensor_parallel = 3"));
  CHECK_THAT(place(s, {ok, ok}).error().message, Contains("listed twice"));
  deployment_spec zero = deployment("z", "llama-2-7b", 0);
  CHECK(place(s, {zero}).error().code == errc::invalid_argument);
  deployment_spec no_room = ok;
  no_room.max_replicas_per_node = 0;
  CHECK_THAT(place(s, {no_room}).error().message, Contains("max_replicas_per_node"));
  CHECK(s.replicas().empty());
  for (const node_info& n : s.nodes()) CHECK(s.ledger({n.id, 0})->replica_count() == 0);
}

TEST_CASE("cluster_state validates topology and commits atomically", "[placement]") {
  CHECK(cluster_state::create({}, 0).error().code == errc::invalid_argument);
  CHECK_THAT(cluster_state::create({{1, 0, 8, h100_bytes}, {1, 0, 8, h100_bytes}}, 0).error().message,
             Contains("node 1 twice"));
  CHECK_THAT(cluster_state::create({{1, 0, 0, h100_bytes}}, 0).error().message, Contains("devices = 0"));
  CHECK_THAT(cluster_state::create({{1, 0, 8, 100}}, 512).error().message, Contains("not above"));

  cluster_state s = make_state({{7, 0, 2, 10 * gib_bytes}, {3, 0, 2, 10 * gib_bytes}}, 0);
  CHECK(s.nodes().front().id == 3);  // sorted by id
  placed_slot p;
  p.slot = {"x", 0};
  p.replica = 1;
  p.node = 7;
  p.devices = {0, 1};
  p.per_device.weights_bytes = 6 * gib_bytes;
  REQUIRE(s.commit(p).has_value());
  CHECK(s.next_replica_id() == 2);
  p.replica = 2;
  p.devices = {1, 0};
  auto oom = s.commit(p);
  REQUIRE_FALSE(oom.has_value());
  CHECK(oom.error().code == errc::out_of_memory);
  CHECK_THAT(oom.error().message, Contains("node 7 device 1 needs 6.00 GiB, 4.00 GiB free of 10.00 GiB"));
  p.node = 3;
  p.devices = {0, 0};
  CHECK_THAT(s.commit(p).error().message, Contains("listed twice"));
  p.devices = {0, 2};
  CHECK(s.commit(p).error().code == errc::invalid_argument);
  p.replica = 1;
  p.devices = {0};
  CHECK_THAT(s.commit(p).error().message, Contains("already placed"));
  CHECK(s.ledger({3, 0})->replica_count() == 0);  // nothing half-admitted
  REQUIRE(s.release(1).has_value());
  CHECK(s.release(1).error().code == errc::not_found);
  CHECK(s.ledger({7, 0})->used_bytes() == 0);
  CHECK(s.ledger({7, 1})->used_bytes() == 0);
  CHECK(s.ledger({7, 2}) == nullptr);
  CHECK(s.ledger({5, 0}) == nullptr);
}

TEST_CASE("nodes join an empty cluster and keep placed replicas where they are", "[placement]") {
  auto s = cluster_state::empty(gpu_device_reserved_bytes);
  CHECK(s.nodes().empty());
  // Nothing to place on yet: every slot comes back unplaced, nothing breaks.
  auto none = place(s, {sized("a", 2, 10)});
  REQUIRE(none.has_value());
  CHECK(none->placed.empty());
  CHECK(none->unplaced.size() == 2);

  REQUIRE(s.add_node({7, 0, 2, h100_bytes}).has_value());
  auto first = place(s, {sized("a", 2, 10)});
  REQUIRE(first.has_value());
  REQUIRE(first->placed.size() == 2);
  const auto used_before = s.ledger({7, 0})->used_bytes() + s.ledger({7, 1})->used_bytes();

  // A lower id joins later: the ledgers are rebuilt in id order, and the
  // replicas already placed on node 7 keep their bytes there.
  REQUIRE(s.add_node({3, 1, 1, h100_bytes}).has_value());
  REQUIRE(s.nodes().size() == 2);
  CHECK(s.nodes().front().id == 3);
  CHECK(s.ledger({7, 0})->used_bytes() + s.ledger({7, 1})->used_bytes() == used_before);
  CHECK(s.ledger({3, 0})->used_bytes() == gpu_device_reserved_bytes);
  CHECK(s.replicas().size() == 2);
  // Ids are never reused across a join.
  auto more = place(s, {sized("b", 1, 10)});
  REQUIRE(more.has_value());
  REQUIRE(more->placed.size() == 1);
  CHECK(more->placed.front().replica > first->placed.back().replica);

  SECTION("a node id joins once") {
    auto again = s.add_node({7, 0, 2, h100_bytes});
    REQUIRE_FALSE(again.has_value());
    CHECK_THAT(again.error().message, Contains("node 7 is already known"));
    CHECK(s.nodes().size() == 2);
  }
  SECTION("a node's devices are validated as at create") {
    auto bad = s.add_node({9, 0, 0, h100_bytes});
    REQUIRE_FALSE(bad.has_value());
    CHECK(bad.error().code == errc::invalid_argument);
    CHECK(s.nodes().size() == 2);
  }
}

TEST_CASE("excluded (drained) nodes get nothing, and the rest spread as without them", "[placement]") {
  cluster_state s = make_state(topology(3, 8, 3));
  auto plan = place(s, {deployment("a", "llama-2-7b", 6)}, {1});
  REQUIRE(plan);
  REQUIRE(plan->unplaced.empty());
  const auto counts = per_node(*plan);
  CHECK(counts.count(1) == 0);
  CHECK(counts.at(0) == 3);
  CHECK(counts.at(2) == 3);
  cluster_state all_out = make_state(topology(2, 8, 2));
  auto none = place(all_out, {deployment("b", "llama-2-7b", 2)}, {0, 1});
  REQUIRE(none);
  CHECK(none->placed.empty());
  REQUIRE(none->unplaced.size() == 2);
  CHECK_THAT(none->unplaced.front().reason, Catch::Contains("excluded"));
}

TEST_CASE("a node whose cache holds the file is preferred, after spreading and before load", "[placement]") {
  auto s = make_state(topology(4, 1, 4));
  // Node 0 is busy with another deployment; nodes 1-3 are alike, and node 3
  // holds the file.
  place_ok(s, {sized("other", 1, 10)});  // lands on node 0 (all equal, lowest id)
  auto d = sized("m", 1, 5);
  d.cached_on = {3};
  auto plan = place_ok(s, {d});
  REQUIRE(plan.placed.size() == 1);
  CHECK(plan.placed[0].node == 3);
  // Without it, the least-loaded node with the lowest id: node 1.
  auto s2 = make_state(topology(4, 1, 4));
  place_ok(s2, {sized("other", 1, 10)});
  auto plain = place_ok(s2, {sized("m", 1, 5)});
  CHECK(plain.placed[0].node == 1);
  // Spreading still comes first: a second replica goes to another node.
  auto s3 = make_state(topology(4, 1, 4));
  auto two = sized("m", 2, 5);
  two.cached_on = {3};
  const auto spread = per_node(place_ok(s3, {two}));
  CHECK(spread.size() == 2);
  CHECK(spread.count(3) == 1);
}

TEST_CASE("replicas spread over regions before racks and nodes", "[placement]") {
  auto s = make_state(topology(4, 1, 1));  // a rack per node
  for (node_id n = 0; n < 4; ++n) REQUIRE(s.set_region(n, n < 2 ? "east" : "west"));
  const auto plan = place_ok(s, {sized("m", 2, 5)});
  std::set<std::string> regions;
  for (const auto& p : plan.placed) regions.insert(s.region_of(p.node));
  CHECK(regions.size() == 2);
  // Without regions the same two replicas take nodes 0 and 1 (by id).
  auto plain = make_state(topology(4, 1, 1));
  const auto p2 = per_node(place_ok(plain, {sized("m", 2, 5)}));
  CHECK(p2.count(0) == 1);
  CHECK(p2.count(1) == 1);
  CHECK(per_node(plan).count(0) == 1);
  CHECK(per_node(plan).count(2) == 1);
  CHECK(s.set_region(9, "x").error().code == errc::not_found);
  CHECK(s.region_of(9).empty());
}
