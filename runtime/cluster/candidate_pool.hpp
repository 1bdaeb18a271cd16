#pragma once
// What the router knows about each replica, and the indexed pool of one model
// version's replicas that routing policies choose from.
//
// A decision must not scan cold data: with 3072 replicas a full
// routing_candidate (three strings) per replica is half a megabyte, while the
// numbers a policy compares fit in a few kilobytes. The pool therefore keeps,
// beside the records, compact columns and small indexes that it updates on
// every change (implemented in routing.cpp, next to the policies that use them):
//
//   eligibility bitset + dense list   O(1) count and uniform sampling; round-robin successor in O(n/64)
//   tournament tree over load          O(1) least-loaded, O(log n) per load change
//   prediction columns                 contiguous doubles for the predictive scan
//
// Positions are dense and ordered by replica id, so "lowest id wins a tie" is
// "lowest position wins"; least_loaded_from() breaks ties from a cursor instead. Inserting or erasing a member only marks the index
// stale; reindex() rebuilds it in O(n log n), so a burst of membership changes
// costs one rebuild. A pool has one owner and is not thread-safe.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cluster/lifecycle.hpp"
#include "common/splitmix64.hpp"
#include "cluster/types.hpp"

namespace exa::cluster {

/// What one request will cost a replica, in tokens.
struct request_cost {
  // Constructors, not an aggregate, so that {prompt, max} stays the short
  // form without the prefix fields (and without missing-initializer warnings).
  request_cost() = default;
  request_cost(std::uint32_t prompt, std::uint32_t max, std::uint32_t block_tokens = 0,
               std::span<const std::uint64_t> hashes = {})
      : prompt_tokens(prompt), max_tokens(max), prefix_block_tokens(block_tokens), prefix_hashes(hashes) {}

  std::uint32_t prompt_tokens = 0;
  std::uint32_t max_tokens = 0;
  /// The prompt's chained block hashes (model/prefix_hash.hpp) at
  /// `prefix_block_tokens` per block, for prefix_aware routing; empty when
  /// the caller did not compute them (every other policy ignores them).
  /// Borrowed for the one decision.
  std::uint32_t prefix_block_tokens = 0;
  std::span<const std::uint64_t> prefix_hashes;
};

/// queue_capacity_left value meaning "this replica reports no queue bound".
inline constexpr std::uint32_t queue_capacity_unbounded = std::numeric_limits<std::uint32_t>::max();

/// The router's view of one replica.
struct routing_candidate {
  replica_id id = 0;
  slot_ref slot;
  epoch_t epoch = 0;
  std::string model;
  std::string version;
  replica_state state = replica_state::creating;
  /// Missed heartbeats: in-flight work continues, nothing new is sent.
  bool suspect = false;
  std::uint32_t outstanding_requests = 0;
  /// Prompt tokens not yet prefilled plus tokens still to generate.
  std::uint64_t outstanding_tokens = 0;
  /// Observed throughput, smoothed (EWMA); 0 = not observed yet.
  double decode_tokens_per_s = 0;
  double prefill_tokens_per_s = 0;
  /// Requests the replica can still queue; 0 = full (not routable).
  std::uint32_t queue_capacity_left = queue_capacity_unbounded;
};

/// A replica's periodic load report. Speeds are raw observations (0 = none
/// this period); the table smooths them.
struct load_report {
  // Constructors for the same reason as request_cost's: {requests, tokens,
  // decode, prefill, queue} without the prefix summary.
  load_report() = default;
  load_report(std::uint32_t requests, std::uint64_t tokens, double decode = 0, double prefill = 0,
              std::uint32_t queue_left = queue_capacity_unbounded)
      : outstanding_requests(requests),
        outstanding_tokens(tokens),
        decode_tokens_per_s(decode),
        prefill_tokens_per_s(prefill),
        queue_capacity_left(queue_left) {}

  std::uint32_t outstanding_requests = 0;
  std::uint64_t outstanding_tokens = 0;
  double decode_tokens_per_s = 0;
  double prefill_tokens_per_s = 0;
  std::uint32_t queue_capacity_left = queue_capacity_unbounded;
  /// The replica's prefix cache summary (engine::prefix_summary): block size
  /// (0: no prefix cache) and block hashes, most recently used first,
  /// bounded by the replica. Only prefix_aware routing reads it.
  std::uint32_t prefix_block_tokens = 0;
  std::vector<std::uint64_t> prefix_hashes;
};

/// Seeded pseudo-random state, passed explicitly so a seed replays every
/// routing decision.
using rng_state = splitmix64_stream;

/// Whether a candidate can take a new request, given whether its epoch is
/// the current one for its slot.
constexpr bool is_routable(const routing_candidate& c, bool stale) noexcept {
  return accepts_requests(c.state) && !c.suspect && !stale && c.queue_capacity_left > 0;
}

/// The indexed replicas of one model version (see the file comment).
class candidate_pool {
 public:
  using position = std::uint32_t;

  /// Columns the predictive policy scans; index = position. Speeds are
  /// stored inverted (seconds per token), 0 where unknown. `penalty` is +inf
  /// for members that are not eligible and 0 otherwise; `queue_s` is
  /// queued_tokens * decode_s_per_token + penalty, the queue ahead in seconds,
  /// so with every speed known a scan needs three columns and no branches.
  struct prediction_columns {
    std::span<const double> queue_s;
    std::span<const double> queued_tokens;
    std::span<const double> decode_s_per_token;
    std::span<const double> prefill_s_per_token;
    std::span<const double> penalty;
  };

  candidate_pool() = default;

  /// Indexes a hand-built candidate set (ids must be distinct). Within the
  /// set, a candidate whose epoch is below the highest epoch seen for its
  /// slot is stale.
  static candidate_pool from(std::span<const routing_candidate> candidates);

  // ---- queries (require indexed()) -------------------------------------

  std::uint32_t size() const noexcept { return static_cast<std::uint32_t>(records_.size()); }
  std::uint32_t eligible_count() const noexcept { return static_cast<std::uint32_t>(eligible_list_.size()); }
  /// Members that would be eligible but have no queue capacity left.
  std::uint32_t full_count() const noexcept { return full_count_; }
  bool indexed() const noexcept { return indexed_; }
  bool eligible(position p) const noexcept { return (eligible_bits_[p / 64] >> (p % 64)) & 1u; }
  bool stale(position p) const noexcept { return stale_[p] != 0; }
  const routing_candidate& at(position p) const noexcept { return records_[p]; }
  /// Eligible positions in an order that depends only on the history of
  /// changes (deterministic), for uniform sampling.
  std::span<const position> eligible_positions() const noexcept { return eligible_list_; }
  /// Position of a member, O(log n).
  std::optional<position> find(replica_id id) const noexcept;
  /// First position whose id is greater than `id` (size() if none), O(log n).
  position position_after(replica_id id) const noexcept;
  /// The same, O(1) when `hint` is still `id`'s position (a cursor kept
  /// since the pool was last reindexed).
  position position_after(replica_id id, position hint) const noexcept {
    return hint < ids_.size() && ids_[hint] == id ? hint + 1 : position_after(id);
  }
  /// First eligible position at or after `start`, wrapping around; O(n/64).
  std::optional<position> next_eligible(position start) const noexcept;
  /// Eligible member with the fewest outstanding tokens, lowest id on ties; O(1).
  std::optional<position> least_loaded() const noexcept;
  /// Eligible member with the fewest outstanding tokens; among equal loads the
  /// first at or after `start` in position order, wrapping around. A policy
  /// that passes a moving cursor spreads ties instead of always handing them
  /// to the lowest id. O(log n).
  std::optional<position> least_loaded_from(position start) const noexcept;
  /// Whether two or more eligible members share the fewest outstanding
  /// tokens, O(1): when not, least_loaded() is every cursor's answer and a
  /// policy need not compute its cursor.
  bool least_tied() const noexcept { return tree_[1].tied; }
  prediction_columns prediction() const noexcept;
  /// Eligible members whose decode / prefill speed is unknown (replicas that
  /// have not reported yet); while both are 0 queue_s is complete.
  std::uint32_t unknown_decode_count() const noexcept { return unknown_decode_count_; }
  std::uint32_t unknown_prefill_count() const noexcept { return unknown_prefill_count_; }
  /// Median of the known speeds over all members; 0 when none is known.
  /// Cached until a speed changes; O(n) to recompute.
  double median_decode_tokens_per_s() const;
  double median_prefill_tokens_per_s() const;

  // ---- changes (by the owner) ------------------------------------------

  /// Adds a member (its id must be new); the pool needs reindex() before use.
  void insert(routing_candidate candidate, bool stale);
  /// Removes a member if present; the pool needs reindex() before use.
  bool erase(replica_id id);
  /// Rebuilds positions and indexes: O(n log n).
  void reindex();

  /// Replaces a member's record in place (same id).
  void replace(position p, routing_candidate candidate, bool stale);
  /// Applies a load report; speeds are smoothed with weight `alpha` on the sample.
  void apply_load(position p, const load_report& report, double alpha);
  /// Charges a routed request to a member until its next load report.
  void charge(position p, const request_cost& cost);
  void set_state(position p, replica_state state);
  void set_suspect(position p, bool suspect);
  void set_stale(position p, bool stale);

 private:
  struct tree_node {
    std::uint64_t key = std::numeric_limits<std::uint64_t>::max();
    position pos = std::numeric_limits<position>::max();
    bool tied = false;  // another eligible member of the subtree has `key` too
  };

  void sync(position p);
  void set_eligible(position p, bool eligible);
  void update_tree(position p);
  position first_least_from(position start) const noexcept;
  void update_speeds(position p, bool routable);
  double median_of(bool decode) const;

  std::vector<routing_candidate> records_;
  std::vector<std::uint8_t> stale_;
  std::vector<std::uint8_t> full_;
  std::vector<replica_id> ids_;  // ids_[p] == records_[p].id, for cache-friendly search
  bool indexed_ = true;

  std::vector<std::uint64_t> eligible_bits_;
  std::vector<position> eligible_list_;
  std::vector<position> list_index_;  // position -> index in eligible_list_, or npos
  std::uint32_t full_count_ = 0;

  std::vector<tree_node> tree_;  // tree_[1] is the root; leaves start at tree_leaves_
  std::size_t tree_leaves_ = 1;

  std::vector<double> queue_s_;
  std::vector<double> queued_tokens_;
  std::vector<double> decode_s_per_token_;
  std::vector<double> prefill_s_per_token_;
  std::vector<double> penalty_;
  std::vector<std::uint8_t> unknown_;  // bit 0: eligible, decode unknown; bit 1: prefill
  std::uint32_t unknown_decode_count_ = 0;
  std::uint32_t unknown_prefill_count_ = 0;

  // Median caches: recomputed only when a speed changed since.
  std::uint64_t speeds_version_ = 0;
  mutable std::uint64_t median_version_ = std::numeric_limits<std::uint64_t>::max();
  mutable double median_decode_ = 0;
  mutable double median_prefill_ = 0;
  mutable std::vector<double> scratch_;
};

}  // namespace exa::cluster
