#pragma once
// Request routing: which replica of a model gets the next request.
//
// A routing_policy chooses among a candidate_pool's eligible members
// (ready/serving, not suspect, current epoch, queue not full). The
// replica_table keeps one pool per (model, version) and one policy per model,
// so a decision never looks at another model's replicas, and it is the
// router actor's single source of routing truth: it takes upserts, removals,
// load reports, state and suspicion changes, and epoch fences.
//
// Cost of one decision, n = replicas of the routed model version:
//   round_robin         O(log n + n/64)   (binary search for the cursor, bitset scan)
//   least_outstanding   O(log n) query (tournament tree, ties from a cursor) + O(log n) charge
//   power_of_two        O(1) sampling + O(log n) charge
//   predictive          O(n) branch-free scan of three double columns (five while an
//                       eligible replica has no observed speed) + O(log n) charge; the
//                       estimate depends on the request, so no one order serves every request
//   prefix_aware        O(log n) least-loaded, then O(n) scan of the eligible replicas within
//                       the load bound, each costing (matched blocks + 1) hash lookups
// Measured (bench/routing_bench.cpp, see docs/PERFORMANCE.md): tens of ns for
// the first three, about half a nanosecond per replica for predictive.
// Load updates are O(log n); membership changes cost one O(n log n) reindex,
// deferred to the next use of the pool.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cluster/candidate_pool.hpp"
#include "cluster/prefix_index.hpp"
#include "common/error.hpp"

namespace exa::cluster {

/// Chooses one replica for a request. Policies may keep state (a
/// round-robin cursor), so each model gets its own instance.
class routing_policy {
 public:
  virtual ~routing_policy() = default;

  /// The name the factory knows this policy by.
  virtual std::string_view name() const noexcept = 0;

  /// An eligible position of `pool` (which must be indexed), or nullopt when
  /// none is eligible.
  std::optional<candidate_pool::position> choose(const request_cost& cost,
                                                 const candidate_pool& pool, rng_state& rng);

  /// Convenience over a hand-built candidate set (indexes it first, O(n log n)):
  /// the chosen replica, or nullopt when no candidate is eligible.
  std::optional<replica_id> choose(const request_cost& cost,
                                   std::span<const routing_candidate> candidates, rng_state& rng);

  // What the table tells every policy beyond the pool's columns; only
  // prefix_aware keeps state from them.
  /// A load report of replica `id` (after the pool applied it).
  virtual void observe_load(replica_id id, const load_report& report) { (void)id, (void)report; }
  /// The table charged `cost` to replica `id` (the policy's choice or a last resort).
  virtual void observe_routed(replica_id id, const request_cost& cost) { (void)id, (void)cost; }
  /// The replica left the table.
  virtual void forget(replica_id id) { (void)id; }

 private:
  virtual std::optional<candidate_pool::position> choose_in(const request_cost& cost,
                                                            const candidate_pool& pool,
                                                            rng_state& rng) = 0;
};

/// Where a policy breaks ties: just after the replica it chose last, in id
/// order, wrapping around (round robin among the tied).
class tie_cursor {
 public:
  /// The position to start from in `pool`: 0 before any choice.
  candidate_pool::position start(const candidate_pool& pool) const noexcept {
    return last_ ? pool.position_after(*last_, position_) : 0;
  }
  void chose(const candidate_pool& pool, candidate_pool::position p) noexcept {
    last_ = pool.at(p).id;
    position_ = p;
  }

 private:
  std::optional<replica_id> last_;
  candidate_pool::position position_ = 0;  // last_'s position when chosen: a hint, checked
};

/// Cycles through eligible replicas in id order, resuming after the last
/// one chosen (deterministic, no randomness).
class round_robin_policy final : public routing_policy {
 public:
  std::string_view name() const noexcept override { return "round_robin"; }

 private:
  std::optional<candidate_pool::position> choose_in(const request_cost&, const candidate_pool& pool,
                                                    rng_state&) override;
  std::optional<replica_id> last_;
};

/// Fewest outstanding tokens; among equal loads, the first in id order after
/// the replica this policy chose last, wrapping around. At light load every
/// replica is idle between requests, so a fixed tie-break (lowest id) would
/// hand nearly every request to one replica; the cursor turns idle ties into
/// round robin. Deterministic: it depends only on the sequence of decisions.
class least_outstanding_policy final : public routing_policy {
 public:
  std::string_view name() const noexcept override { return "least_outstanding"; }

 private:
  std::optional<candidate_pool::position> choose_in(const request_cost&, const candidate_pool& pool,
                                                    rng_state&) override;
  tie_cursor cursor_;
};

/// Two distinct eligible replicas drawn uniformly; the one with fewer
/// outstanding tokens wins, the first drawn on ties (uniform, where "the
/// lower id" would favour low ids whenever replicas are idle). Near
/// least-outstanding quality without every router herding onto the same minimum.
class power_of_two_policy final : public routing_policy {
 public:
  std::string_view name() const noexcept override { return "power_of_two"; }

 private:
  std::optional<candidate_pool::position> choose_in(const request_cost&, const candidate_pool& pool,
                                                    rng_state& rng) override;
};

/// Fallback speeds for replicas that have not been observed yet, used only
/// when no replica of the pool has a known speed either.
struct predictive_config {
  double default_decode_tokens_per_s = 1000;
  double default_prefill_tokens_per_s = 10000;
};

/// Minimum estimated finish time:
///   outstanding_tokens / decode speed      (work queued ahead of the request)
/// + prompt_tokens / prefill speed          (this request's prefill)
/// + max_tokens / decode speed              (this request's decode, worst case)
/// Replicas report one outstanding-token count mixing prefill and decode
/// work; dividing it all by the decode speed overestimates prefill-heavy
/// queues, which errs toward spreading load.
/// An unknown speed is the median of the pool's known ones, else the default.
class predictive_policy final : public routing_policy {
 public:
  explicit predictive_policy(predictive_config config = {});
  std::string_view name() const noexcept override { return "predictive"; }

  /// The estimate for one member, in seconds (what the scan minimizes).
  double estimate_s(const request_cost& cost, const candidate_pool& pool,
                    candidate_pool::position p) const;

 private:
  std::optional<candidate_pool::position> choose_in(const request_cost& cost,
                                                    const candidate_pool& pool, rng_state&) override;
  std::pair<double, double> fallback_s_per_token(const candidate_pool& pool) const;
  predictive_config config_;
};

struct prefix_aware_config {
  /// A replica is "near the least loaded" while its outstanding tokens are
  /// at most min + max(slack, load_slack_ratio * min), min being the least
  /// loaded eligible replica's and slack load_slack_tokens, lowered by
  /// load_slack_s (below): among those the longest cached prefix wins. Past the bound a cached prefix is not worth the queue, so
  /// a hot prefix spreads to other replicas instead of piling onto one.
  std::uint64_t load_slack_tokens = 2048;
  double load_slack_ratio = 0.25;
  /// The same slack in time: a replica's token slack is at most what it
  /// prefills in this many seconds (its smoothed prefill speed, else the
  /// median of its pool's -- the model version's replicas -- known ones), so
  /// the wait a cached prefix may cost at light load is about the same on a
  /// GPU as on a CPU replica 30x slower. It is an estimate: outstanding tokens
  /// also count decode budgets, and the speed is measured over steps that mix
  /// prefill with decode. load_slack_tokens stays the cap, and the whole of
  /// it while no replica of the pool has reported a prefill speed; 0 turns
  /// the time bound off. The ratio's part is not bounded in time: under
  /// heavy load (min x ratio above the slack) it decides, as before; on CPU
  /// replicas ratio 0 reused less and made the tail worse, not better
  /// (docs/PERFORMANCE.md, "The ratio's part"). The default came from one fleet
  /// each way: 2,048 tokens (~50 ms of prefill) kept TTFT level on simulated
  /// H100 replicas, 256 (~0.2 s) on CPU replicas where 2,048 (~1.6 s) made
  /// the p99 20 % worse (docs/PERFORMANCE.md, "Prefix caching").
  double load_slack_s = 0.2;
  /// Matched prefixes shorter than this (tokens) count as none (a match is
  /// at least one block in any case).
  std::uint32_t min_match_tokens = 1;
  prefix_index_config index;
};

/// Bounds of a deployment's prefix_aware slack: tokens up to 2^32 (a queue
/// far past any replica's), the ratio up to 100 (a bound of 101x the least
/// loaded replica's queue already ignores load), seconds up to an hour.
inline constexpr std::uint64_t prefix_slack_tokens_max = std::uint64_t{1} << 32;
inline constexpr double prefix_slack_ratio_max = 100;
inline constexpr double prefix_slack_s_max = 3600;

/// A deployment's prefix_slack_tokens / prefix_slack_ratio / prefix_slack_s
/// (prefix_aware_config's load_slack_tokens / load_slack_ratio / load_slack_s):
/// invalid_argument naming the key and the accepted range when out of bounds
/// or not finite.
expected<void> check_prefix_slack(std::uint64_t tokens, double ratio, double seconds);

/// Longest cached prefix among the replicas near the least loaded (see
/// prefix_aware_config; each replica's bound from its own prefill speed), ties to the lower load, then to the first in id
/// order after the replica this policy chose last (as least_outstanding's
/// cursor, so idle replicas share the requests that match nothing); the
/// least loaded replica when no replica within the bound holds any of the
/// prompt's blocks. Replicas report their prefix cache's block hashes with
/// their load (load_report::prefix_hashes); the policy also records the
/// blocks of each request it routes, so the next turn of a conversation
/// follows before the next report (prefix_index).
class prefix_aware_policy final : public routing_policy {
 public:
  explicit prefix_aware_policy(prefix_aware_config config = {});
  std::string_view name() const noexcept override { return "prefix_aware"; }

  void observe_load(replica_id id, const load_report& report) override;
  void observe_routed(replica_id id, const request_cost& cost) override;
  void forget(replica_id id) override { index_.forget(id); }

  const prefix_index& index() const noexcept { return index_; }

 private:
  std::optional<candidate_pool::position> choose_in(const request_cost& cost,
                                                    const candidate_pool& pool, rng_state&) override;
  candidate_pool::position choose_near_least(const request_cost& cost, const candidate_pool& pool,
                                             candidate_pool::position least,
                                             candidate_pool::position start) const;
  prefix_aware_config config_;
  prefix_index index_;
  tie_cursor cursor_;
};

/// A region name: "" (none), or 1..64 letters, digits, '-', '_' or '.';
/// invalid_argument naming it otherwise.
expected<void> check_region(std::string_view region);

/// Geographic affinity: the replicas (of `members`, each with its node) a
/// gateway of `region` passes over while one of its own region can serve
/// -- those on nodes of another region or of none. replica_table::route()
/// takes them as its `exclude`, which already means "only when nothing
/// else can": saturated or down local replicas spill over to the others.
/// A gateway of no region prefers none.
std::vector<replica_id> outside_region(std::string_view region,
                                       std::span<const std::pair<replica_id, node_id>> members,
                                       const std::map<node_id, std::string>& node_regions);

/// Names the factory accepts, in a stable order.
std::span<const std::string_view> routing_policy_names() noexcept;

/// "round_robin", "least_outstanding", "power_of_two", "predictive" or
/// "prefix_aware"; invalid_argument listing the valid names otherwise.
expected<std::unique_ptr<routing_policy>> make_routing_policy(std::string_view name,
                                                              const predictive_config& config = {},
                                                              const prefix_aware_config& prefix = {});

struct replica_table_config {
  /// Policy of a model until set_policy names another.
  std::string default_policy = "least_outstanding";
  predictive_config predictive;
  prefix_aware_config prefix_aware;
  /// Weight of a new speed observation in the smoothed speed.
  double speed_ewma_alpha = 0.2;
  /// Seed of the table's routing randomness (power_of_two).
  std::uint64_t seed = 0x5eed;
  // Bounds: hitting one is an `overloaded` error, never growth.
  std::uint32_t replicas_max = 1u << 16;
  std::uint32_t models_max = 1024;
  std::uint32_t versions_per_model_max = 16;
  std::uint32_t slots_max = 1u << 17;
};

/// Every replica the router knows, indexed by model and version (see the
/// file comment). One owner (the router actor); not thread-safe.
class replica_table {
 public:
  /// Checks the configuration: a bad default policy name or alpha is invalid_argument.
  static expected<replica_table> create(replica_table_config config = {});

  /// Adds or replaces a replica. stale_epoch if its epoch is below its
  /// slot's; a higher epoch raises the slot's and makes the slot's older
  /// replicas stale (they stay listed, never routed to).
  expected<void> upsert(routing_candidate candidate);
  /// not_found for an unknown replica.
  expected<void> remove(replica_id id);
  /// Replaces the replica's load (authoritative over what route() charged)
  /// and folds its speed observations into the smoothed speeds.
  expected<void> update_load(replica_id id, const load_report& report);
  /// Records the replica's state as it reports it (the replica validated the move).
  expected<void> set_state(replica_id id, replica_state state);
  expected<void> set_suspect(replica_id id, bool suspect);
  /// Raises a slot's epoch: its replicas with older epochs become stale.
  /// stale_epoch for an epoch below the current one (epochs only grow).
  expected<void> fence(const slot_ref& slot, epoch_t epoch);
  /// Sets a model's policy by name (declaring the model if new).
  expected<void> set_policy(std::string_view model, std::string_view policy_name);
  /// The same with the model's own prefix_aware slack (the deployment's
  /// prefix_slack_tokens / prefix_slack_ratio / prefix_slack_s) over the
  /// table's configuration; invalid_argument (check_prefix_slack) for bad values.
  expected<void> set_policy(std::string_view model, std::string_view policy_name, std::uint64_t prefix_slack_tokens,
                            double prefix_slack_ratio, double prefix_slack_s);

  /// Chooses a replica of `model` (`version`, or the model's only version
  /// when empty) and charges the request to it until its next load report,
  /// so back-to-back decisions spread instead of piling onto one replica.
  /// Errors: not_found (unknown model or version), invalid_argument (empty
  /// version while several are served), unavailable (no ready replica),
  /// overloaded (every ready replica's queue is full). The pointer stays
  /// valid until the table is next changed. Replicas in `exclude` (the ones
  /// a retried request already failed on) are passed over while any other
  /// can serve; when only they can, one of them is chosen after all, since a
  /// retry there beats no answer. Degraded replicas are chosen the same way:
  /// only when no healthy replica can take the request.
  expected<const routing_candidate*> route(std::string_view model, std::string_view version,
                                           const request_cost& cost, const std::vector<replica_id>& exclude = {});

  /// The replica's record, or nullptr.
  const routing_candidate* find(replica_id id);
  std::size_t size() const noexcept { return where_.size(); }
  /// Name of the model's policy; not_found for an unknown model.
  expected<std::string_view> policy_name(std::string_view model) const;
  /// Current epoch of a slot (0 if never seen).
  epoch_t slot_epoch(const slot_ref& slot) const;
  /// Block size of the model's replicas' prefix caches as its policy knows
  /// it: what a caller hashes a prompt with (request_cost::prefix_hashes).
  /// 0 when the policy is not prefix_aware, no replica has reported a prefix
  /// cache, or the model is unknown.
  std::uint32_t prefix_block_tokens(std::string_view model) const;

 private:
  struct string_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  struct version_entry {
    std::string version;
    std::unique_ptr<candidate_pool> pool;
  };
  struct model_entry {
    std::unique_ptr<routing_policy> policy;
    std::vector<version_entry> versions;
  };
  struct slot_member {
    replica_id id;
    epoch_t epoch;
  };
  struct slot_entry {
    epoch_t epoch = 0;
    std::vector<slot_member> members;  // replicas listed for the slot, usually one or two
  };
  struct located {
    candidate_pool* pool;
    candidate_pool::position pos;
  };
  struct route_target {
    model_entry* model;
    candidate_pool* pool;  // nullptr while the model has no replica
  };

  explicit replica_table(replica_table_config config);
  expected<located> locate(replica_id id);
  expected<model_entry*> model_for_insert(const std::string& model);
  candidate_pool& pool_for_insert(model_entry& model, const std::string& version);
  expected<void> check_room(const std::string& model, const std::string& version) const;
  expected<route_target> target_for_route(std::string_view model, std::string_view version);
  void erase_existing(const routing_candidate& old);
  expected<void> upsert_record(routing_candidate candidate);
  void note_degraded(replica_id id, replica_state state);
  void mark_older_stale(const slot_ref& slot, epoch_t epoch);
  error no_replica_error(std::string_view model, const candidate_pool* pool) const;

  replica_table_config config_;
  rng_state rng_;
  std::unordered_map<std::string, model_entry, string_hash, std::equal_to<>> models_;
  std::unordered_map<replica_id, candidate_pool*> where_;
  std::map<slot_ref, slot_entry> slots_;
  std::set<replica_id> degraded_;  // usually empty: scanned only when no healthy replica can serve
};

}  // namespace exa::cluster
