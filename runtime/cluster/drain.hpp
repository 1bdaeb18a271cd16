#pragma once
// Drains as pure logic: which replicas are draining, why, and until when;
// which nodes are drained (nothing new is placed there until undrained).
//
// A drained replica takes no new requests. Its in-flight ones finish, or,
// past the drain's deadline, the replica is stopped and they resume
// elsewhere from the tokens they have (token-exact, as after a crash). Its
// slot is placed elsewhere as soon as the replica says it is draining (make
// before break: the replacement loads while the old one finishes), or as
// soon as memory frees where the cluster has no room to spare. The slot's
// new epoch waits for that word: raised earlier, it would fence the replica
// before it knew to drain, and its requests would move at once.
//
// The controller actor wires it: it asks begin() for each replica it
// drains, stops the ones expire() returns, tells ended() when a replica is
// gone, and persists operator node drains (a restarted controller keeps the
// node drained). Time is a parameter (the actor's clock), so tests replay.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <vector>

#include "cluster/types.hpp"
#include "common/error.hpp"

namespace exa::cluster {

/// Why a replica or node drains.
enum class drain_cause : std::uint8_t {
  replica,   // an operator drained the replica
  node,      // an operator drained its node
  shutdown,  // its node process is stopping (SIGTERM)
  degraded,  // it stayed degraded past its limit and is replaced
  defrag,    // it moves to make room for a replica that fits nowhere (runtime/cluster/defrag)
};

std::string_view to_string(drain_cause cause) noexcept;

struct drain_config {
  /// Used when a drain names no deadline.
  std::chrono::milliseconds default_deadline = std::chrono::seconds(60);
  /// No drain waits longer (a typo of an extra zero must not pin a replica for a day).
  std::chrono::milliseconds max_deadline = std::chrono::hours(1);
  /// Replicas draining at once, cluster-wide (a bound like any other).
  std::size_t draining_max = 1u << 16;
};

/// One replica being drained.
struct draining_replica {
  replica_id id = 0;
  node_id node = 0;
  slot_ref slot;
  drain_cause cause = drain_cause::replica;
  std::int64_t started_ns = 0;
  std::int64_t deadline_ns = 0;
  /// Past its deadline: told to stop, its in-flight requests resume elsewhere.
  bool forced = false;
  /// Nodes its slot's new replica must avoid.
  std::vector<node_id> avoid;
  /// Its slot was queued for placement elsewhere (once the replica said it
  /// drains: a new epoch before that would fence it mid-request).
  bool slot_moved = false;
};

class drain_tracker {
 public:
  explicit drain_tracker(drain_config config = {}) : config_(config) {}

  /// The deadline a drain asked for, checked: 0 means the default;
  /// invalid_argument (naming both) above max_deadline.
  expected<std::chrono::milliseconds> deadline_for(std::chrono::milliseconds asked) const;

  /// Starts draining a replica. A replica already draining keeps its first
  /// record (and deadline): draining twice is not an error, and returns
  /// false. overloaded when draining_max replicas drain already.
  expected<bool> begin(replica_id id, node_id node, slot_ref slot, drain_cause cause, std::int64_t now_ns,
                       std::chrono::milliseconds deadline, std::vector<node_id> avoid = {});
  /// The replica's slot is being placed elsewhere: true the first time only.
  bool mark_slot_moved(replica_id id);
  bool draining(replica_id id) const { return replicas_.count(id) != 0; }
  const draining_replica* find(replica_id id) const;
  /// The replica is gone (stopped, failed or lost): its record, if it was draining.
  std::optional<draining_replica> ended(replica_id id);

  /// Replicas whose deadline has passed and that were not forced yet, in
  /// id order; each is marked forced (returned once).
  std::vector<replica_id> expire(std::int64_t now_ns);
  /// The earliest deadline of a replica not forced yet (when to call expire).
  std::optional<std::int64_t> next_deadline_ns() const;
  std::size_t draining_count() const noexcept { return replicas_.size(); }
  std::size_t draining_on(node_id node) const;

  /// Marks a node drained (nothing new is placed on it). True when it was
  /// not already; a drain for shutdown does not downgrade an operator's.
  bool drain_node(node_id node, drain_cause cause);
  /// Lifts a node's drain; false when it was not drained.
  bool undrain_node(node_id node);
  /// The node restarted: a drain for its shutdown is over (the new process
  /// may take slots); an operator's stays. True when the drain was lifted.
  bool node_restarted(node_id node);
  bool node_drained(node_id node) const { return nodes_.count(node) != 0; }
  std::optional<drain_cause> node_cause(node_id node) const;
  const std::map<node_id, drain_cause>& drained_nodes() const noexcept { return nodes_; }

 private:
  drain_config config_;
  std::map<replica_id, draining_replica> replicas_;
  std::map<node_id, drain_cause> nodes_;
};

}  // namespace exa::cluster
