#pragma once
// Defragmentation, as pure logic: a replica that fits nowhere although the
// cluster has enough free memory in total gets room by moving a few others
// (hot migrations: the mover's replacement is created and warmed at its new
// place before it stops at the old one -- a drain). This planner picks the
// fewest such moves.
//
// For each node that could take the replica (not excluded, tp devices or
// more): each device's shortfall is covered by moving its largest movable
// single-device replicas first (the fewest moves that free enough), the tp
// cheapest devices are its target, and every mover needs a destination on
// another node -- a device with room, best fit (the smallest hole that
// holds it, keeping large holes whole), on a node it may live on. (Movers
// are drained off the target node and placed again by placement's own
// rules; a destination here proves one exists.) The node
// with the fewest moves wins; ties: fewer bytes moved, then the lower node
// id. Deterministic. Cost: O(nodes × replicas log replicas + moves × devices).

#include <cstdint>
#include <functional>
#include <set>
#include <vector>

#include "cluster/placement.hpp"
#include "common/error.hpp"

namespace exa::cluster {

struct defrag_move {
  replica_id replica = 0;
  slot_ref slot;
  node_id from_node = 0;
  std::uint32_t from_device = 0;
  node_id to_node = 0;
  std::uint32_t to_device = 0;
  std::uint64_t bytes = 0;
};

struct defrag_plan {
  node_id node = 0;                    // where the replica that did not fit goes
  std::vector<std::uint32_t> devices;  // its tp devices there, ascending
  std::vector<defrag_move> moves;      // what moves out of them first (none: it fits already)
  std::uint64_t bytes_moved = 0;
};

struct defrag_request {
  std::uint64_t bytes_per_device = 0;  // one shard of the replica to place
  std::uint32_t tensor_parallel = 1;
  std::uint32_t max_moves = 4;         // the migration limit
  std::set<node_id> excluded;          // down, cordoned or draining nodes: neither target nor destination
  std::set<replica_id> pinned;         // replicas not to move (loading, draining, degraded...)
  /// Whether a moved replica may live on `node` (anti-affinity); null: anywhere.
  std::function<bool(const placed_slot& replica, node_id node)> may_host;
  /// Whether the replica to place may go to `node` (its own anti-affinity); null: anywhere.
  std::function<bool(node_id node)> may_target;
};

/// The plan with the fewest moves, or not_found naming why there is none
/// (not enough free memory in total, or more moves than max_moves needed,
/// or no destination for the movers); invalid_argument for a request of 0
/// bytes or a tensor_parallel outside 1..max_tensor_parallel.
expected<defrag_plan> plan_defrag(const cluster_state& state, const defrag_request& request);

}  // namespace exa::cluster
