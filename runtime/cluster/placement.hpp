#pragma once
// Placement: which node and devices each replica slot of each deployment gets.
//
// First-fit-decreasing with spreading. All missing slots of all deployments
// are sorted by the memory one replica takes (per-device share × TP degree),
// largest first, so big TP groups claim whole devices before small replicas
// scatter over them. Each slot then goes to the best node among those that
// (a) have `tp` devices with room in their ledgers, and (b) keep the
// deployment within its anti-affinity limits per node and per rack. "Best"
// spreads: fewest replicas of this deployment in the node's region (so each
// region's gateways have replicas near them), then in its rack, then on the
// node, then a node whose cache holds the model file (cached_on), then the
// least-loaded node (smallest used fraction of its memory),
// then the lowest node id. A deployment with pack_nodes (consolidation)
// keeps the region and rack rules and then packs instead: a node with an
// empty device first, then the fuller node. Within the node the TP group takes the devices with
// the most free memory (ties: lowest index). Spreading keeps a node or rack
// failure from taking many replicas of one deployment and evens out memory
// bandwidth; a deployment that wants packing sets max_replicas_per_node.
//
// Deterministic: the same state and deployments give the same plan (ordered
// containers only; every tie broken by an id). Cost: O(slots × nodes) cheap
// comparisons plus a device scan only for nodes that beat the current best.

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cluster/ledger.hpp"
#include "cluster/model_shape.hpp"
#include "cluster/types.hpp"
#include "common/error.hpp"

namespace exa::cluster {

/// Limits that keep placement inputs sane.
constexpr std::uint32_t max_devices_per_node = 64;
constexpr std::uint32_t max_replicas_per_deployment = 1u << 20;
constexpr std::size_t max_deployment_name_bytes = 256;

/// A deployment as placement sees it: a model, how many replicas, how each runs.
struct deployment_spec {
  std::string name;
  std::string version;
  model_shape model;
  std::uint32_t replicas = 1;
  /// tensor_parallel (a TP group lives on `tp` distinct devices of ONE node),
  /// kv_tokens per replica, batch sizes, per-replica overhead.
  replica_config replica;
  /// Anti-affinity: at most this many replicas of the deployment on one node.
  /// Default: spread evenly, ceil(replicas / nodes that could hold one).
  std::optional<std::uint32_t> max_replicas_per_node;
  /// At most this many replicas of the deployment in one rack. Default: no limit.
  std::optional<std::uint32_t> max_replicas_per_rack;
  /// Nodes whose model cache holds its file already (a load there reads no
  /// store and, while another replica maps it, no disk): preferred after the
  /// spreading rules, before the least-loaded node.
  std::set<node_id> cached_on;
  /// Consolidation (an autoscaled deployment's night): spread over devices,
  /// pack over nodes. After the region and rack rules, a node with a device
  /// that holds no replica wins over one without, then the fuller node
  /// (more memory used), instead of the node with fewer of its replicas and
  /// the least-loaded one. So a deployment that grows fills nodes one after
  /// another, each replica on a device of its own while there are any, and
  /// its highest slots (the ones a scale-down stops) are on the nodes it
  /// filled last: they empty whole.
  bool pack_nodes = false;
};

/// A slot with a home: the replica that fills it, on `devices` of `node`.
struct placed_slot {
  slot_ref slot;
  std::string version;
  replica_id replica = 0;
  node_id node = 0;
  /// Device indices on `node`, ascending; one per TP shard.
  std::vector<std::uint32_t> devices;
  /// What each of those devices' ledgers holds for this replica.
  memory_breakdown per_device;
};

/// A slot placement could not fill, and why, in words an operator can act on.
struct unplaced_slot {
  slot_ref slot;
  std::string reason;
};

struct placement_plan {
  /// In placement order (largest replicas first).
  std::vector<placed_slot> placed;
  std::vector<unplaced_slot> unplaced;
};

/// The cluster as placement sees it: its nodes, one ledger per device, and the
/// replicas already placed. Placement commits into it, so placing again later
/// (a new deployment, a scale-up, a replacement) sees everything placed before.
class cluster_state {
 public:
  /// Every device of every node starts with `device_reserved_bytes` taken
  /// (device_spec::device_reserved_bytes). Errors (invalid_argument): no
  /// nodes, a node id given twice, devices outside 1..max_devices_per_node,
  /// device memory not above the reserve.
  static expected<cluster_state> create(std::vector<node_info> nodes, std::uint64_t device_reserved_bytes);
  /// A cluster with no nodes yet: the distributed controller's starting
  /// point, filled by add_node() as nodes join.
  static cluster_state empty(std::uint64_t device_reserved_bytes);

  /// Adds a node that joined, keeping every placed replica where it is.
  /// Errors (state unchanged): invalid_argument for a node id already known,
  /// or devices or memory out of range as in create().
  expected<void> add_node(const node_info& node);
  /// The region a node is in (learned when it joins); not_found for an unknown node.
  expected<void> set_region(node_id node, std::string region);
  /// "" for a node without one (all such nodes count as one region).
  const std::string& region_of(node_id node) const;

  /// Sorted by node id.
  const std::vector<node_info>& nodes() const noexcept { return nodes_; }
  /// Position of `node` in nodes(); nullopt if unknown.
  std::optional<std::size_t> node_index(node_id node) const;
  /// The ledger of `device`; nullptr if no such device.
  const device_ledger* ledger(device_ref device) const;

  /// Admits `slot.per_device` on each of its devices and records it; nothing
  /// changes on error. Errors: invalid_argument (unknown node or device, a
  /// device listed twice, replica id 0 or in use), out_of_memory naming the
  /// device that lacks room.
  expected<void> commit(const placed_slot& slot);
  /// Releases a replica from all its devices. Errors: not_found.
  expected<void> release(replica_id replica);

  /// Every placed replica, by id.
  const std::map<replica_id, placed_slot>& replicas() const noexcept { return replicas_; }
  /// The id the next placed replica gets: ids are never reused.
  replica_id next_replica_id() const noexcept { return next_replica_id_; }
  /// Ids below `next` are taken (by a previous controller): never hand them out.
  void reserve_replica_ids(replica_id next) noexcept { next_replica_id_ = std::max(next_replica_id_, next); }

 private:
  cluster_state() = default;
  device_ledger* mutable_ledger(device_ref device);

  std::vector<node_info> nodes_;
  std::vector<std::size_t> first_ledger_;  // per node: its device 0 in ledgers_
  std::vector<device_ledger> ledgers_;
  std::map<node_id, std::size_t> index_;
  std::map<replica_id, placed_slot> replicas_;
  std::map<node_id, std::string> regions_;
  replica_id next_replica_id_ = 1;
  std::uint64_t device_reserved_bytes_ = 0;
};

/// Places every slot [0, replicas) of every deployment that no replica in
/// `state` fills yet, committing each placed one into `state`. Slots that do
/// not fit come back in `unplaced` with a reason. Errors (state unchanged):
/// invalid_argument for a bad spec (empty or duplicate name, replicas out of
/// range, a zero anti-affinity limit, anything estimate() rejects). Nodes in
/// `excluded` (drained, cordoned) get nothing.
expected<placement_plan> place(cluster_state& state, const std::vector<deployment_spec>& deployments,
                               const std::vector<node_id>& excluded = {});

/// Places slot `index` of `deployment` anew (a replacement after a failure)
/// on a node not in `excluded`, within the ledgers and anti-affinity limits,
/// and commits it. Replicas already filling this same slot (the one being
/// replaced) do not count against anti-affinity, and the default per-node
/// limit spreads over the nodes not excluded. Errors: invalid_argument as for
/// place() or for index >= replicas; unavailable with the reason no node fits.
expected<placed_slot> place_one(cluster_state& state, const deployment_spec& deployment, std::uint32_t index,
                                const std::vector<node_id>& excluded);

}  // namespace exa::cluster
