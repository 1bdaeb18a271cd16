#pragma once
// Staggered loads as pure logic: how many replicas may be loading their
// model at once, cluster-wide and per node. Every start goes through it --
// initial deploys, scale-ups, replacements and drains alike -- so a deploy
// of thousands of replicas of a large model does not read the model store
// thousands of times at once.
//
// The controller asks enqueue() for each placed replica, starts the ones
// admit() returns, and calls finished() when one is ready (or ended):
// admit() then lets the next ones through, first come first served, except
// that a replica whose node is at its limit waits without holding up the
// ones behind it on other nodes. A replica counts from its start until
// finished(). Deterministic: no clock, no randomness.
//
// The cluster-wide limit is there for the model store. A replica whose node's
// cache already holds its file (the caller says which: admit's from_cache)
// reads no store, so it counts against its node's limit only: with a warm
// cache (or once a node has fetched the file for its first replica) a node's
// loads go at its own pace while the store serves the nodes that need it.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <vector>

#include "cluster/types.hpp"
#include "common/error.hpp"

namespace exa::cluster {

struct load_limits {
  /// Replicas loading at once in the whole cluster (0 counts as 1).
  std::uint32_t cluster_max = 32;
  /// Replicas loading at once on one node (0 counts as 1).
  std::uint32_t per_node_max = 4;
  /// Starts waiting at most (a bound like any other queue's).
  std::uint32_t waiting_max = 1u << 20;
};

class load_gate {
 public:
  explicit load_gate(load_limits limits = {}) : limits_(limits) {}

  /// Queues a replica to start on `node`. A replica queued or loading
  /// already is not queued twice (false). overloaded when waiting_max wait.
  expected<bool> enqueue(replica_id replica, node_id node);
  /// The queued replicas that may start now, in queue order; each counts as
  /// loading from here on. `from_cache(replica, node)`, when given, says a
  /// replica loads from its node's cache: it needs no cluster-wide turn.
  std::vector<replica_id> admit(const std::function<bool(replica_id, node_id)>& from_cache = {});
  /// The replica is ready, or ended, or was never started (dropped): it no
  /// longer counts, and leaves the queue if it was waiting. True if known.
  bool finished(replica_id replica);
  /// `node` has the file now (its fetch from the store is done): the loads
  /// there for which `from_cache` says so give their cluster-wide turns back
  /// (they still count on the node). Returns how many did.
  std::size_t fetched(node_id node, const std::function<bool(replica_id)>& from_cache);

  bool loading(replica_id replica) const { return loading_.count(replica) != 0; }
  bool waiting(replica_id replica) const;
  std::size_t loading_count() const noexcept { return loading_.size(); }
  /// Those of them that read the store (hold a cluster-wide turn).
  std::size_t loading_from_store() const noexcept { return from_store_; }
  std::size_t loading_on(node_id node) const;
  std::size_t waiting_count() const noexcept { return queue_.size(); }
  /// How many wait behind node `node`'s limit (for logs: why a start waits).
  std::size_t waiting_on(node_id node) const;

 private:
  struct entry {
    replica_id replica;
    node_id node;
  };
  struct loading_entry {
    node_id node;
    bool from_store;
  };
  std::uint32_t cluster_max() const noexcept { return limits_.cluster_max ? limits_.cluster_max : 1; }
  std::uint32_t per_node_max() const noexcept { return limits_.per_node_max ? limits_.per_node_max : 1; }

  load_limits limits_;
  std::deque<entry> queue_;
  std::map<replica_id, loading_entry> loading_;
  std::map<node_id, std::uint32_t> per_node_;
  std::size_t from_store_ = 0;
};

}  // namespace exa::cluster
