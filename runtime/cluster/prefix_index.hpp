#pragma once
// The router's view of which replica holds which prompt prefixes in its KV
// prefix cache, for prefix-aware routing.
//
// A replica reports, with its load, the chained block hashes
// (model/prefix_hash.hpp) of its prefix cache, most recently used first and
// at most `reported_max` of them (replica_config::prefix_hashes_reported);
// the index keeps them per replica as a hash set. Since the hashes are
// chained, a request's prompt matches a replica for as many leading blocks as
// the replica holds in a row: equal hash k means equal tokens 0..k.
//
// A report is the replica's truth and replaces what the index held, except
// for the blocks the router itself sent there since the previous report
// (note_routed): a request routed just before a report has often not reached
// the engine yet, and forgetting its blocks would split a burst of one
// conversation. Those pending blocks survive exactly one report.
//
// Bounds: per replica at most reported_max reported plus pending_max pending
// hashes; replicas at most the routing table's replicas_max. One owner (the
// routing policy of one model); not thread-safe.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <unordered_set>

#include "cluster/types.hpp"

namespace exa::cluster {

struct prefix_index_config {
  /// Hashes kept from one report (more are ignored, most recent kept).
  std::uint32_t reported_max = 1024;
  /// Hashes the router adds on its own between two reports.
  std::uint32_t pending_max = 1024;
};

class prefix_index {
 public:
  explicit prefix_index(prefix_index_config config = {});

  /// Replaces the replica's reported summary; `block_tokens` 0 (no prefix
  /// cache) forgets the replica. Pending blocks added before this report are
  /// kept through it, then dropped at the next one.
  void replace(replica_id id, std::uint32_t block_tokens, std::span<const std::uint64_t> hashes_mru_first);
  /// The router sent a request with these prompt block hashes to `id`: it
  /// will hold them once the request is prefilled. Ignored unless the
  /// replica reported the same block size.
  void note_routed(replica_id id, std::uint32_t block_tokens, std::span<const std::uint64_t> hashes);
  void forget(replica_id id);

  /// Leading hashes of `hashes` the replica holds in a row (0 when its
  /// block size differs or it is unknown). O(result + 1) lookups.
  std::size_t matched_blocks(replica_id id, std::uint32_t block_tokens,
                             std::span<const std::uint64_t> hashes) const;
  /// Block size the replicas last reported (0 when none has a prefix cache).
  std::uint32_t block_tokens() const noexcept { return block_tokens_; }
  std::size_t replicas() const noexcept { return replicas_.size(); }
  /// Hashes held for one replica, reported and pending (for tests and bounds).
  std::size_t held(replica_id id) const;

 private:
  struct entry {
    std::uint32_t block_tokens = 0;
    std::unordered_set<std::uint64_t> reported;
    std::unordered_set<std::uint64_t> pending;  // routed here since the last report
    std::deque<std::uint64_t> pending_order;    // oldest first, to bound `pending`
    std::unordered_set<std::uint64_t> carried;  // pending at the last report: kept until the next
  };

  bool holds(const entry& e, std::uint64_t h) const {
    return e.reported.count(h) > 0 || e.pending.count(h) > 0 || e.carried.count(h) > 0;
  }

  prefix_index_config config_;
  std::unordered_map<replica_id, entry> replicas_;
  std::uint32_t block_tokens_ = 0;
};

}  // namespace exa::cluster
