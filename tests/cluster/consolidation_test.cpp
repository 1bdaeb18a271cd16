// Consolidation (deployment_spec::pack_nodes): an autoscaled deployment
// spreads over devices and packs over nodes, so the slots a scale-down
// stops (the highest) are on the nodes it filled last, and whole nodes
// empty at night. The control: the default spreading leaves every node
// with a replica.

#include <catch2/catch.hpp>

#include <map>
#include <set>

#include "cluster/hardware.hpp"
#include "cluster/placement.hpp"

// GCC 12 warns -Wrestrict inside std::string's inlined assignment of a
// literal (GCC bug 105651, a false positive): silenced in this file only.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

using namespace exa;
using namespace exa::cluster;

namespace {

const std::uint64_t h100_bytes = 81559 * mib_bytes;

cluster_state make_state(std::uint32_t nodes, std::uint32_t devices, std::uint32_t racks = 1) {
  std::vector<node_info> info;
  for (node_id n = 0; n < nodes; ++n) info.push_back({n, n % racks, devices, h100_bytes});
  auto s = cluster_state::create(info, gpu_device_reserved_bytes);
  REQUIRE(s);
  return std::move(*s);
}

// Replicas of `gib` GiB each on one device.
deployment_spec sized(std::uint32_t replicas, std::uint64_t gib, bool pack) {
  deployment_spec d;
  d.name = "m";
  d.model = *model_shape_preset("tiny", precision::fp16);
  d.replicas = replicas;
  d.replica.kv_tokens = 0;
  d.replica.replica_overhead_bytes = gib * gib_bytes - estimate(d.model, d.replica)->total_bytes();
  d.pack_nodes = pack;
  return d;
}

std::map<node_id, std::uint32_t> per_node(const cluster_state& s) {
  std::map<node_id, std::uint32_t> out;
  for (const auto& [id, r] : s.replicas()) ++out[r.node];
  return out;
}

std::size_t nodes_in_use(const cluster_state& s) { return per_node(s).size(); }

// Stops the slots from `from` up, as a scale-down does.
void scale_down(cluster_state& s, std::uint32_t from) {
  std::vector<replica_id> gone;
  for (const auto& [id, r] : s.replicas())
    if (r.slot.index >= from) gone.push_back(id);
  for (const auto id : gone) REQUIRE(s.release(id));
}

}  // namespace

TEST_CASE("packing fills nodes one after another, a device of its own for each replica", "[consolidation]") {
  auto s = make_state(4, 4);
  auto plan = place(s, {sized(6, 30, true)});
  REQUIRE(plan);
  REQUIRE(plan->unplaced.empty());
  CHECK(per_node(s) == std::map<node_id, std::uint32_t>{{0, 4}, {1, 2}});
  std::set<std::pair<node_id, std::uint32_t>> devices;
  for (const auto& p : plan->placed) devices.insert({p.node, p.devices.front()});
  CHECK(devices.size() == 6);  // no device shared while empty ones are left
  // The control: spreading puts replicas on every node.
  auto spread = make_state(4, 4);
  REQUIRE(place(spread, {sized(6, 30, false)}));
  CHECK(nodes_in_use(spread) == 4);
}

TEST_CASE("a packed deployment that grew and shrinks again empties the nodes it filled last", "[consolidation]") {
  for (const bool pack : {true, false}) {
    INFO("pack_nodes " << pack);
    auto s = make_state(4, 4);
    REQUIRE(place(s, {sized(6, 30, pack)}));  // the night
    const auto night = nodes_in_use(s);
    REQUIRE(place(s, {sized(14, 30, pack)}));  // noon: the autoscaler added 8
    CHECK(s.replicas().size() == 14);
    CHECK(nodes_in_use(s) == 4);
    scale_down(s, 6);  // evening: back to 6, the highest slots stop
    CHECK(s.replicas().size() == 6);
    if (pack) {
      CHECK(nodes_in_use(s) == 2);  // two whole nodes idle again
      CHECK(nodes_in_use(s) == night);
    } else {
      CHECK(nodes_in_use(s) == 4);  // spread: every node keeps one
    }
  }
}

TEST_CASE("packing keeps the rack rule and shares devices only when none is empty", "[consolidation]") {
  // Two racks of two nodes: each rack gets half, on one node of it.
  auto racks = make_state(4, 4, 2);
  REQUIRE(place(racks, {sized(4, 30, true)}));
  CHECK(per_node(racks) == std::map<node_id, std::uint32_t>{{0, 2}, {1, 2}});
  // Two nodes of two devices, replicas small enough for two per device:
  // four take a device each, the next two share the fuller node's.
  auto small = make_state(2, 2);
  auto plan = place(small, {sized(6, 30, true)});
  REQUIRE(plan);
  REQUIRE(plan->unplaced.empty());
  std::map<std::pair<node_id, std::uint32_t>, int> per_device;
  for (std::size_t i = 0; i < plan->placed.size(); ++i) {
    const auto& p = plan->placed[i];
    ++per_device[{p.node, p.devices.front()}];
    if (i < 4) CHECK(per_device[{p.node, p.devices.front()}] == 1);
  }
  CHECK(per_device.size() == 4);
  // No even share per node limits packing (only memory does).
  auto one = make_state(3, 8);
  REQUIRE(place(one, {sized(8, 30, true)}));
  CHECK(per_node(one) == std::map<node_id, std::uint32_t>{{0, 8}});
}
