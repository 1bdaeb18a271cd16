// The defragmentation planner: the fewest moves that make room for a
// replica that fits nowhere, with a destination for every mover.

#include <catch2/catch.hpp>

#include "cluster/defrag.hpp"

using namespace exa;
using namespace exa::cluster;

namespace {

constexpr std::uint64_t gib = 1ull << 30;

void put(cluster_state& s, replica_id id, node_id node, std::uint32_t device, std::uint64_t gibs,
         std::string deployment = "small") {
  placed_slot p;
  p.slot = {std::move(deployment), static_cast<std::uint32_t>(id)};
  p.replica = id;
  p.node = node;
  p.devices = {device};
  p.per_device.weights_bytes = gibs * gib;
  REQUIRE(s.commit(p).has_value());
}

defrag_request need(std::uint64_t gibs, std::uint32_t tp = 1) {
  defrag_request r;
  r.bytes_per_device = gibs * gib;
  r.tensor_parallel = tp;
  return r;
}

// Node 0 -- device 0: 4 + 4 (2 free); device 1: 7 (3 free); device 2: 6
// (4 free). Node 1, one device: 6 (4 free). A 5 GiB replica fits nowhere
// though 13 GiB are free.
cluster_state fragmented() {
  std::vector<node_info> v = {{0, 0, 3, 10 * gib}, {1, 0, 1, 10 * gib}};
  auto s = cluster_state::create(v, 0);
  REQUIRE(s.has_value());
  put(*s, 1, 0, 0, 4);
  put(*s, 2, 0, 0, 4);
  put(*s, 3, 0, 1, 7);
  put(*s, 4, 0, 2, 6);
  put(*s, 5, 1, 0, 6);
  return *s;
}

}  // namespace

TEST_CASE("one move makes room: the device whose largest replica has somewhere to go", "[defrag]") {
  const auto plan = plan_defrag(fragmented(), need(5));
  REQUIRE(plan.has_value());
  // The 7 and 6 GiB replicas fit no other node's hole; device 0's 4 GiB
  // replica fits node 1's 4 GiB hole (movers leave the target node).
  CHECK(plan->node == 0);
  CHECK(plan->devices == std::vector<std::uint32_t>{0});
  REQUIRE(plan->moves.size() == 1);
  CHECK(plan->moves[0].replica == 1);
  CHECK(plan->moves[0].from_device == 0);
  CHECK(plan->moves[0].to_node == 1);
  CHECK(plan->moves[0].to_device == 0);
  CHECK(plan->bytes_moved == 4 * gib);
}

TEST_CASE("a pinned replica stays and its neighbour moves instead", "[defrag]") {
  auto r = need(5);
  r.pinned = {1};
  const auto plan = plan_defrag(fragmented(), r);
  REQUIRE(plan.has_value());
  REQUIRE(plan->moves.size() == 1);
  CHECK(plan->moves[0].replica == 2);
}

TEST_CASE("a node the replica may not use is no target", "[defrag]") {
  auto r = need(5);
  r.may_target = [](node_id n) { return n != 0; };
  // Node 1 would need its 6 GiB moved, and no other node has such a hole.
  CHECK_FALSE(plan_defrag(fragmented(), r).has_value());
}

TEST_CASE("a replica that already fits needs no move", "[defrag]") {
  const auto plan = plan_defrag(fragmented(), need(4));
  REQUIRE(plan.has_value());
  CHECK(plan->moves.empty());
  CHECK(plan->devices == std::vector<std::uint32_t>{2});
}

namespace {

// Three one-device nodes. Node 0: 2+2+2+2 (2 free); node 1: 5+2 (3 free);
// node 2: 5 (5 free). A 6 GiB replica fits nowhere; 10 GiB are free.
cluster_state three_nodes() {
  std::vector<node_info> v = {{0, 0, 1, 10 * gib}, {1, 0, 1, 10 * gib}, {2, 0, 1, 10 * gib}};
  auto s = cluster_state::create(v, 0);
  REQUIRE(s.has_value());
  put(*s, 1, 0, 0, 2);
  put(*s, 2, 0, 0, 2);
  put(*s, 3, 0, 0, 2);
  put(*s, 4, 0, 0, 2);
  put(*s, 5, 1, 0, 5);
  put(*s, 6, 1, 0, 2);
  put(*s, 7, 2, 0, 5);
  return *s;
}

}  // namespace

TEST_CASE("the node with the fewest moves wins", "[defrag]") {
  // Node 0 needs two 2 GiB moves, node 1 one 5 GiB move (to node 2's hole);
  // node 2's own 5 GiB has nowhere to go.
  const auto plan = plan_defrag(three_nodes(), need(6));
  REQUIRE(plan.has_value());
  CHECK(plan->node == 1);
  REQUIRE(plan->moves.size() == 1);
  CHECK(plan->moves[0].replica == 5);
  CHECK(plan->moves[0].to_node == 2);
  CHECK(plan->moves[0].from_node == 1);
}

TEST_CASE("more moves than the migration limit is no plan, within it one", "[defrag]") {
  auto r = need(6);
  r.pinned = {5};  // node 1 cannot free enough without it
  r.max_moves = 1;
  const auto none = plan_defrag(three_nodes(), r);
  REQUIRE_FALSE(none.has_value());
  CHECK(none.error().code == errc::not_found);
  CHECK_THAT(none.error().message, Catch::Contains("more than the limit of 1"));
  r.max_moves = 2;
  const auto two = plan_defrag(three_nodes(), r);
  REQUIRE(two.has_value());
  CHECK(two->node == 0);
  CHECK(two->moves.size() == 2);
  for (const auto& m : two->moves) CHECK(m.to_node != 0);
}

TEST_CASE("a mover goes only where it may live", "[defrag]") {
  auto r = need(6);
  r.may_host = [](const placed_slot&, node_id node) { return node != 2; };
  const auto plan = plan_defrag(three_nodes(), r);
  REQUIRE_FALSE(plan.has_value());
  CHECK_THAT(plan.error().message, Catch::Contains("no room elsewhere"));
}

TEST_CASE("without enough free memory in total there is no plan, and bad requests are refused", "[defrag]") {
  const auto plan = plan_defrag(three_nodes(), need(11));
  REQUIRE_FALSE(plan.has_value());
  CHECK_THAT(plan.error().message, Catch::Contains("free in total"));
  CHECK(plan_defrag(three_nodes(), need(0)).error().code == errc::invalid_argument);
  CHECK(plan_defrag(three_nodes(), need(1, 3)).error().code == errc::invalid_argument);
}

TEST_CASE("a tensor-parallel group gets its cheapest devices and its movers go off them", "[defrag]") {
  // Node 0: device 0 empty, 6 / 8 / 9 GiB on devices 1-3; node 1: one empty device.
  std::vector<node_info> v = {{0, 0, 4, 10 * gib}, {1, 0, 1, 10 * gib}};
  auto s = cluster_state::create(v, 0);
  REQUIRE(s.has_value());
  put(*s, 1, 0, 1, 6);
  put(*s, 2, 0, 2, 8);
  put(*s, 3, 0, 3, 9);
  const auto plan = plan_defrag(*s, need(5, 2));
  REQUIRE(plan.has_value());
  CHECK(plan->node == 0);
  CHECK(plan->devices == std::vector<std::uint32_t>{0, 1});
  REQUIRE(plan->moves.size() == 1);
  CHECK(plan->moves[0].replica == 1);
  CHECK(plan->moves[0].to_node == 1);
  // An excluded node is no destination either.
  auto r = need(5, 2);
  r.excluded = {1};
  CHECK_FALSE(plan_defrag(*s, r).has_value());
}
