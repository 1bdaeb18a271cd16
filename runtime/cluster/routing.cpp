// Routing: the candidate pool's indexes, the five policies, and the replica
// table. The pool is implemented here as well: the policies are its only
// readers, and the build registers one source file for routing.

#include "cluster/routing.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "common/assert.hpp"

namespace exa::cluster {

namespace {

constexpr candidate_pool::position npos = std::numeric_limits<candidate_pool::position>::max();
constexpr std::uint64_t key_max = std::numeric_limits<std::uint64_t>::max();
constexpr double infinity = std::numeric_limits<double>::infinity();

std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) noexcept {
  return a > key_max - b ? key_max : a + b;
}

// A speed observation folded into a smoothed speed; 0 means "no observation".
double smooth(double old_speed, double sample, double alpha) noexcept {
  if (sample <= 0) return old_speed;
  if (old_speed <= 0) return sample;
  return old_speed + alpha * (sample - old_speed);
}

double inverse_or_unknown(double tokens_per_s) noexcept {
  return tokens_per_s > 0 ? 1.0 / tokens_per_s : 0.0;
}

std::string describe(const slot_ref& slot) {
  return slot.deployment + "#" + std::to_string(slot.index);
}

}  // namespace

// ---- candidate_pool --------------------------------------------------------

candidate_pool candidate_pool::from(std::span<const routing_candidate> candidates) {
  std::map<slot_ref, epoch_t> newest;
  for (const auto& c : candidates) {
    auto& e = newest[c.slot];
    e = std::max(e, c.epoch);
  }
  candidate_pool pool;
  for (const auto& c : candidates) pool.insert(c, c.epoch < newest[c.slot]);
  pool.reindex();
  return pool;
}

std::optional<candidate_pool::position> candidate_pool::find(replica_id id) const noexcept {
  EXA_ASSERT(indexed_);
  const auto it = std::lower_bound(ids_.begin(), ids_.end(), id);
  if (it == ids_.end() || *it != id) return std::nullopt;
  return static_cast<position>(it - ids_.begin());
}

candidate_pool::position candidate_pool::position_after(replica_id id) const noexcept {
  EXA_ASSERT(indexed_);
  return static_cast<position>(std::upper_bound(ids_.begin(), ids_.end(), id) - ids_.begin());
}

std::optional<candidate_pool::position> candidate_pool::next_eligible(position start) const noexcept {
  EXA_ASSERT(indexed_);
  if (eligible_list_.empty()) return std::nullopt;
  if (start >= size()) start = 0;
  const std::size_t words = eligible_bits_.size();
  std::size_t w = start / 64;
  std::uint64_t word = eligible_bits_[w] & (~std::uint64_t{0} << (start % 64));
  // words + 1 steps: the start word is visited again, whole, after wrapping.
  for (std::size_t step = 0; step <= words; ++step) {
    if (word != 0) return static_cast<position>(w * 64 + static_cast<std::size_t>(std::countr_zero(word)));
    w = (w + 1) % words;
    word = eligible_bits_[w];
  }
  EXA_ASSERT_MSG(false, "eligible list and bitset disagree");
  return std::nullopt;
}

std::optional<candidate_pool::position> candidate_pool::least_loaded() const noexcept {
  EXA_ASSERT(indexed_);
  if (eligible_list_.empty()) return std::nullopt;
  const position p = tree_[1].pos;
  EXA_ASSERT(p < size() && eligible(p));
  return p;
}

std::optional<candidate_pool::position> candidate_pool::least_loaded_from(position start) const noexcept {
  const auto least = least_loaded();
  // The root holds the lowest tied position: at or after `start`, it is the answer.
  if (!least || !least_tied() || *least >= start || start >= size()) return least;
  const position at_or_after = first_least_from(start);
  if (at_or_after == npos) return least;  // every tied member lies before `start`: wrap
  EXA_ASSERT(at_or_after >= start && eligible(at_or_after) &&
             records_[at_or_after].outstanding_tokens == records_[*least].outstanding_tokens);
  return at_or_after;
}

// The first position at or after `start` whose key is the tree's minimum, or
// npos. Walks the subtrees that cover [start, leaves) left to right, bottom
// up (O(log n), no recursion); the first whose minimum is the tree's holds
// the answer as its winner, the lowest tied position in it.
candidate_pool::position candidate_pool::first_least_from(position start) const noexcept {
  const std::uint64_t key = tree_[1].key;
  std::size_t i = tree_leaves_ + start;
  while (tree_[i].key != key) {
    while (i & 1) {  // a right child: its right neighbour is up the tree
      i >>= 1;
      if (i <= 1) return npos;
    }
    ++i;  // the left child's right sibling: the next range to the right
  }
  return tree_[i].pos;
}

candidate_pool::prediction_columns candidate_pool::prediction() const noexcept {
  EXA_ASSERT(indexed_);
  return {queue_s_, queued_tokens_, decode_s_per_token_, prefill_s_per_token_, penalty_};
}

double candidate_pool::median_of(bool decode) const {
  scratch_.clear();
  for (const auto& c : records_) {
    const double speed = decode ? c.decode_tokens_per_s : c.prefill_tokens_per_s;
    if (speed > 0) scratch_.push_back(speed);
  }
  if (scratch_.empty()) return 0;
  const std::size_t mid = scratch_.size() / 2;
  std::nth_element(scratch_.begin(), scratch_.begin() + static_cast<std::ptrdiff_t>(mid), scratch_.end());
  const double upper = scratch_[mid];
  if (scratch_.size() % 2 == 1) return upper;
  const double lower =
      *std::max_element(scratch_.begin(), scratch_.begin() + static_cast<std::ptrdiff_t>(mid));
  return (lower + upper) / 2;
}

double candidate_pool::median_decode_tokens_per_s() const {
  if (median_version_ != speeds_version_) {
    median_decode_ = median_of(true);
    median_prefill_ = median_of(false);
    median_version_ = speeds_version_;
  }
  return median_decode_;
}

double candidate_pool::median_prefill_tokens_per_s() const {
  median_decode_tokens_per_s();  // refreshes both caches
  return median_prefill_;
}

void candidate_pool::insert(routing_candidate candidate, bool stale) {
  records_.push_back(std::move(candidate));
  stale_.push_back(stale ? 1 : 0);
  indexed_ = false;
}

bool candidate_pool::erase(replica_id id) {
  const auto it = std::find_if(records_.begin(), records_.end(),
                               [id](const routing_candidate& c) { return c.id == id; });
  if (it == records_.end()) return false;
  const auto index = it - records_.begin();
  records_.erase(it);
  stale_.erase(stale_.begin() + index);
  indexed_ = false;
  return true;
}

void candidate_pool::reindex() {
  const std::size_t n = records_.size();
  EXA_ASSERT(n < npos);
  // Sort records and stale flags together by id.
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(),
            [this](std::size_t a, std::size_t b) { return records_[a].id < records_[b].id; });
  std::vector<routing_candidate> records;
  std::vector<std::uint8_t> stale;
  records.reserve(n);
  stale.reserve(n);
  for (const std::size_t i : order) {
    records.push_back(std::move(records_[i]));
    stale.push_back(stale_[i]);
  }
  records_ = std::move(records);
  stale_ = std::move(stale);

  ids_.resize(n);
  for (std::size_t p = 0; p < n; ++p) ids_[p] = records_[p].id;
  EXA_ASSERT_MSG(std::adjacent_find(ids_.begin(), ids_.end()) == ids_.end(),
                 "a candidate pool holds one record per replica id");

  // Start from "nothing eligible, every speed unknown" and let sync() move
  // each member to its real state, so there is one code path for both.
  full_.assign(n, 0);
  full_count_ = 0;
  eligible_bits_.assign((n + 63) / 64, 0);
  eligible_list_.clear();
  list_index_.assign(n, npos);
  tree_leaves_ = std::bit_ceil(std::max<std::size_t>(n, 1));
  tree_.assign(2 * tree_leaves_, tree_node{});
  queue_s_.assign(n, infinity);
  queued_tokens_.assign(n, 0);
  decode_s_per_token_.assign(n, 0);
  prefill_s_per_token_.assign(n, 0);
  penalty_.assign(n, infinity);
  unknown_.assign(n, 0);
  unknown_decode_count_ = 0;
  unknown_prefill_count_ = 0;
  ++speeds_version_;
  indexed_ = true;
  for (position p = 0; p < n; ++p) sync(p);
}

void candidate_pool::replace(position p, routing_candidate candidate, bool stale) {
  EXA_ASSERT(indexed_ && p < size() && records_[p].id == candidate.id);
  records_[p] = std::move(candidate);
  stale_[p] = stale ? 1 : 0;
  sync(p);
}

void candidate_pool::apply_load(position p, const load_report& report, double alpha) {
  EXA_ASSERT(indexed_ && p < size());
  auto& c = records_[p];
  c.outstanding_requests = report.outstanding_requests;
  c.outstanding_tokens = report.outstanding_tokens;
  c.queue_capacity_left = report.queue_capacity_left;
  c.decode_tokens_per_s = smooth(c.decode_tokens_per_s, report.decode_tokens_per_s, alpha);
  c.prefill_tokens_per_s = smooth(c.prefill_tokens_per_s, report.prefill_tokens_per_s, alpha);
  sync(p);
}

void candidate_pool::charge(position p, const request_cost& cost) {
  EXA_ASSERT(indexed_ && p < size());
  auto& c = records_[p];
  c.outstanding_tokens =
      saturating_add(c.outstanding_tokens, std::uint64_t{cost.prompt_tokens} + cost.max_tokens);
  if (c.outstanding_requests < std::numeric_limits<std::uint32_t>::max()) ++c.outstanding_requests;
  if (c.queue_capacity_left != queue_capacity_unbounded && c.queue_capacity_left > 0) {
    --c.queue_capacity_left;
  }
  sync(p);
}

void candidate_pool::set_state(position p, replica_state state) {
  EXA_ASSERT(indexed_ && p < size());
  records_[p].state = state;
  sync(p);
}

void candidate_pool::set_suspect(position p, bool suspect) {
  EXA_ASSERT(indexed_ && p < size());
  records_[p].suspect = suspect;
  sync(p);
}

void candidate_pool::set_stale(position p, bool stale) {
  EXA_ASSERT(indexed_ && p < size());
  stale_[p] = stale ? 1 : 0;
  sync(p);
}

// Brings every index up to date with records_[p] and stale_[p].
void candidate_pool::sync(position p) {
  const auto& c = records_[p];
  const bool routable = is_routable(c, stale_[p] != 0);
  const bool full =
      accepts_requests(c.state) && !c.suspect && stale_[p] == 0 && c.queue_capacity_left == 0;
  if (full != (full_[p] != 0)) {
    full_[p] = full ? 1 : 0;
    if (full) {
      ++full_count_;
    } else {
      EXA_ASSERT(full_count_ > 0);
      --full_count_;
    }
  }
  set_eligible(p, routable);
  queued_tokens_[p] = static_cast<double>(c.outstanding_tokens);
  penalty_[p] = routable ? 0.0 : infinity;
  update_speeds(p, routable);
  queue_s_[p] = queued_tokens_[p] * decode_s_per_token_[p] + penalty_[p];
  update_tree(p);
}

void candidate_pool::set_eligible(position p, bool eligible_now) {
  if (eligible_now == eligible(p)) return;
  if (eligible_now) {
    eligible_bits_[p / 64] |= std::uint64_t{1} << (p % 64);
    list_index_[p] = static_cast<position>(eligible_list_.size());
    eligible_list_.push_back(p);
    return;
  }
  eligible_bits_[p / 64] &= ~(std::uint64_t{1} << (p % 64));
  const position index = list_index_[p];
  EXA_ASSERT(index < eligible_list_.size() && eligible_list_[index] == p);
  const position last = eligible_list_.back();
  eligible_list_[index] = last;
  list_index_[last] = index;
  eligible_list_.pop_back();
  list_index_[p] = npos;
}

void candidate_pool::update_speeds(position p, bool routable) {
  const auto& c = records_[p];
  const double decode = inverse_or_unknown(c.decode_tokens_per_s);
  const double prefill = inverse_or_unknown(c.prefill_tokens_per_s);
  if (decode != decode_s_per_token_[p] || prefill != prefill_s_per_token_[p]) {
    decode_s_per_token_[p] = decode;
    prefill_s_per_token_[p] = prefill;
    ++speeds_version_;  // invalidates the cached medians
  }
  // Only eligible members count: a replica still warming up has no speed
  // yet, and must not push every decision onto the fallback path.
  const std::uint8_t unknown =
      routable ? static_cast<std::uint8_t>((decode == 0 ? 1 : 0) | (prefill == 0 ? 2 : 0)) : 0;
  const std::uint8_t before = unknown_[p];
  unknown_decode_count_ = unknown_decode_count_ - (before & 1) + (unknown & 1);
  unknown_prefill_count_ = unknown_prefill_count_ - ((before >> 1) & 1) + ((unknown >> 1) & 1);
  unknown_[p] = unknown;
  EXA_ASSERT(unknown_decode_count_ <= eligible_count() && unknown_prefill_count_ <= eligible_count());
}

// Tournament tree: each inner node holds the smaller (key, position) of its
// children, so the root is the least-loaded eligible member, and whether its
// subtree holds another eligible member with the same key (a tie for the
// minimum: both children have it, or the winning child has a tie). Ineligible
// members carry key_max; eligible keys are capped one below it.
void candidate_pool::update_tree(position p) {
  const auto less = [](const tree_node& a, const tree_node& b) {
    return a.key < b.key || (a.key == b.key && a.pos < b.pos);
  };
  std::size_t i = tree_leaves_ + p;
  tree_[i] = tree_node{eligible(p) ? std::min(records_[p].outstanding_tokens, key_max - 1) : key_max, p, false};
  while (i > 1) {
    i /= 2;
    const tree_node& l = tree_[2 * i];
    const tree_node& r = tree_[2 * i + 1];
    tree_node winner = less(r, l) ? r : l;
    winner.tied = (l.key == r.key && l.key != key_max) || winner.tied;
    // Above an unchanged node nothing can change.
    if (winner.key == tree_[i].key && winner.pos == tree_[i].pos && winner.tied == tree_[i].tied) break;
    tree_[i] = winner;
  }
}

// ---- policies ----------------------------------------------------------------

std::optional<candidate_pool::position> routing_policy::choose(const request_cost& cost,
                                                               const candidate_pool& pool,
                                                               rng_state& rng) {
  EXA_ASSERT(pool.indexed());
  const auto chosen = choose_in(cost, pool, rng);
  // Every policy, built in or not, is held to "only eligible members".
  EXA_ASSERT(!chosen || (*chosen < pool.size() && pool.eligible(*chosen)));
  return chosen;
}

std::optional<replica_id> routing_policy::choose(const request_cost& cost,
                                                 std::span<const routing_candidate> candidates,
                                                 rng_state& rng) {
  const candidate_pool pool = candidate_pool::from(candidates);
  const auto chosen = choose(cost, pool, rng);
  if (!chosen) return std::nullopt;
  return pool.at(*chosen).id;
}

std::optional<candidate_pool::position> round_robin_policy::choose_in(const request_cost&,
                                                                      const candidate_pool& pool,
                                                                      rng_state&) {
  const candidate_pool::position start = last_ ? pool.position_after(*last_) : 0;
  const auto chosen = pool.next_eligible(start);
  if (chosen) last_ = pool.at(*chosen).id;
  return chosen;
}

std::optional<candidate_pool::position> least_outstanding_policy::choose_in(const request_cost&,
                                                                            const candidate_pool& pool,
                                                                            rng_state&) {
  auto chosen = pool.least_loaded();
  if (chosen && pool.least_tied()) chosen = pool.least_loaded_from(cursor_.start(pool));
  if (chosen) cursor_.chose(pool, *chosen);
  return chosen;
}

std::optional<candidate_pool::position> power_of_two_policy::choose_in(const request_cost&,
                                                                       const candidate_pool& pool,
                                                                       rng_state& rng) {
  const auto eligible = pool.eligible_positions();
  const auto n = static_cast<std::uint32_t>(eligible.size());
  if (n == 0) return std::nullopt;
  if (n == 1) return eligible[0];
  // Two distinct draws: the second skips over the first's index.
  const std::uint32_t i = rng.below(n);
  std::uint32_t j = rng.below(n - 1);
  if (j >= i) ++j;
  const candidate_pool::position a = eligible[i];
  const candidate_pool::position b = eligible[j];
  const std::uint64_t load_a = pool.at(a).outstanding_tokens;
  const std::uint64_t load_b = pool.at(b).outstanding_tokens;
  return load_b < load_a ? b : a;
}

predictive_policy::predictive_policy(predictive_config config) : config_(config) {
  EXA_ASSERT(config_.default_decode_tokens_per_s > 0 && config_.default_prefill_tokens_per_s > 0);
}

// Seconds per token to assume for members whose speed is unknown; only
// computed (median, O(n) when speeds changed) while such members exist.
std::pair<double, double> predictive_policy::fallback_s_per_token(const candidate_pool& pool) const {
  double decode = 0;
  double prefill = 0;
  if (pool.unknown_decode_count() > 0) {
    const double median = pool.median_decode_tokens_per_s();
    decode = 1.0 / (median > 0 ? median : config_.default_decode_tokens_per_s);
  }
  if (pool.unknown_prefill_count() > 0) {
    const double median = pool.median_prefill_tokens_per_s();
    prefill = 1.0 / (median > 0 ? median : config_.default_prefill_tokens_per_s);
  }
  return {decode, prefill};
}

// The estimate, association included, is the same on every path (here, the
// known-speed scan and the fallback scan), so a test can predict choices exactly:
//   queued_tokens * s_decode + max_tokens * s_decode + prompt_tokens * s_prefill
double predictive_policy::estimate_s(const request_cost& cost, const candidate_pool& pool,
                                     candidate_pool::position p) const {
  const auto [fallback_decode, fallback_prefill] = fallback_s_per_token(pool);
  const auto cols = pool.prediction();
  const double decode = cols.decode_s_per_token[p] > 0 ? cols.decode_s_per_token[p] : fallback_decode;
  const double prefill = cols.prefill_s_per_token[p] > 0 ? cols.prefill_s_per_token[p] : fallback_prefill;
  return cols.queued_tokens[p] * decode + double(cost.max_tokens) * decode +
         double(cost.prompt_tokens) * prefill;
}

namespace {

// Running minimum of one scan lane; the strict < keeps the lowest position
// (lowest id) among equal estimates.
struct scan_lane {
  double best = infinity;
  std::size_t pos = npos;

  void offer(double estimate, std::size_t p) noexcept {
    const bool better = estimate < best;
    best = better ? estimate : best;
    pos = better ? p : pos;
  }
  void merge(const scan_lane& other) noexcept {
    if (other.best < best || (other.best == best && other.pos < pos)) *this = other;
  }
};

// Every eligible member's speeds are known: three columns, no selects, and
// four independent lanes so the compare chain does not serialize the loop
// (about 2x faster than one lane at 3072 members).
std::size_t scan_known(const candidate_pool::prediction_columns& cols, double max_tokens,
                       double prompt_tokens) noexcept {
  const double* queue_s = cols.queue_s.data();
  const double* decode = cols.decode_s_per_token.data();
  const double* prefill = cols.prefill_s_per_token.data();
  const std::size_t n = cols.queue_s.size();
  const auto estimate = [&](std::size_t p) {
    return queue_s[p] + max_tokens * decode[p] + prompt_tokens * prefill[p];
  };
  scan_lane lanes[4];
  std::size_t p = 0;
  for (; p + 4 <= n; p += 4) {
    lanes[0].offer(estimate(p), p);
    lanes[1].offer(estimate(p + 1), p + 1);
    lanes[2].offer(estimate(p + 2), p + 2);
    lanes[3].offer(estimate(p + 3), p + 3);
  }
  for (; p < n; ++p) lanes[0].offer(estimate(p), p);
  for (int i = 1; i < 4; ++i) lanes[0].merge(lanes[i]);
  return lanes[0].pos;
}

// Some eligible member has not reported a speed: substitute the fallback.
// Transient (replicas that just became ready), so one plain lane.
std::size_t scan_with_fallback(const candidate_pool::prediction_columns& cols, double max_tokens,
                               double prompt_tokens, double fallback_decode,
                               double fallback_prefill) noexcept {
  scan_lane lane;
  for (std::size_t p = 0; p < cols.penalty.size(); ++p) {
    const double d = cols.decode_s_per_token[p] > 0 ? cols.decode_s_per_token[p] : fallback_decode;
    const double f = cols.prefill_s_per_token[p] > 0 ? cols.prefill_s_per_token[p] : fallback_prefill;
    lane.offer((cols.queued_tokens[p] * d + cols.penalty[p]) + max_tokens * d + prompt_tokens * f, p);
  }
  return lane.pos;
}

}  // namespace

std::optional<candidate_pool::position> predictive_policy::choose_in(const request_cost& cost,
                                                                     const candidate_pool& pool,
                                                                     rng_state&) {
  if (pool.eligible_count() == 0) return std::nullopt;
  const auto cols = pool.prediction();
  const double max_tokens = cost.max_tokens;
  const double prompt_tokens = cost.prompt_tokens;
  std::size_t best = npos;
  if (pool.unknown_decode_count() == 0 && pool.unknown_prefill_count() == 0) {
    best = scan_known(cols, max_tokens, prompt_tokens);
  } else {
    const auto [fallback_decode, fallback_prefill] = fallback_s_per_token(pool);
    best = scan_with_fallback(cols, max_tokens, prompt_tokens, fallback_decode, fallback_prefill);
  }
  // Only absurd speeds (estimates overflowing to +inf) leave no winner;
  // fall back to queue length rather than refuse a servable request.
  if (best == npos) return pool.least_loaded();
  return static_cast<candidate_pool::position>(best);
}

prefix_aware_policy::prefix_aware_policy(prefix_aware_config config)
    : config_(config), index_(config.index) {
  EXA_ASSERT(config_.load_slack_ratio >= 0 && std::isfinite(config_.load_slack_ratio));
  EXA_ASSERT(config_.load_slack_s >= 0 && std::isfinite(config_.load_slack_s));
}

void prefix_aware_policy::observe_load(replica_id id, const load_report& report) {
  index_.replace(id, report.prefix_block_tokens, report.prefix_hashes);
}

void prefix_aware_policy::observe_routed(replica_id id, const request_cost& cost) {
  index_.note_routed(id, cost.prefix_block_tokens, cost.prefix_hashes);
}

std::optional<candidate_pool::position> prefix_aware_policy::choose_in(const request_cost& cost,
                                                                       const candidate_pool& pool,
                                                                       rng_state&) {
  auto least = pool.least_loaded();
  if (!least) return least;
  // The cursor matters only where a tie can use it.
  const bool scans = !cost.prefix_hashes.empty() && cost.prefix_block_tokens != 0 && index_.replicas() != 0;
  const candidate_pool::position start = scans || pool.least_tied() ? cursor_.start(pool) : 0;
  if (pool.least_tied()) least = pool.least_loaded_from(start);
  const candidate_pool::position chosen = scans ? choose_near_least(cost, pool, *least, start) : *least;
  cursor_.chose(pool, chosen);
  return chosen;
}

candidate_pool::position prefix_aware_policy::choose_near_least(const request_cost& cost,
                                                                const candidate_pool& pool,
                                                                candidate_pool::position least,
                                                                candidate_pool::position start) const {
  // Distance from the cursor in position order, wrapping: the tie-break.
  const auto after_cursor = [&](candidate_pool::position p) {
    return p >= start ? p - start : p + pool.size() - start;
  };
  const std::uint64_t min_load = pool.at(least).outstanding_tokens;
  // Products of checked, finite, non-negative values; a NaN would take the cap.
  const auto clamp_tokens = [](double t) {
    return !(t < static_cast<double>(key_max)) ? key_max : static_cast<std::uint64_t>(t);
  };
  const std::uint64_t relative = clamp_tokens(config_.load_slack_ratio * static_cast<double>(min_load));
  // The token slack, capped by what the replica prefills in load_slack_s;
  // an unknown speed is the pool's median known one (computed only when needed).
  const bool timed = config_.load_slack_s > 0;
  double median_prefill = -1;
  const auto bound_of = [&](const routing_candidate& c) {
    std::uint64_t fixed = config_.load_slack_tokens;
    if (timed) {
      double speed = c.prefill_tokens_per_s;
      if (!(speed > 0)) {
        if (median_prefill < 0) median_prefill = pool.median_prefill_tokens_per_s();
        speed = median_prefill;
      }
      if (speed > 0) fixed = std::min(fixed, clamp_tokens(config_.load_slack_s * speed));
    }
    return saturating_add(min_load, std::max(fixed, relative));
  };
  candidate_pool::position best = least;
  std::uint64_t best_tokens = 0;
  for (const candidate_pool::position p : pool.eligible_positions()) {
    const routing_candidate& c = pool.at(p);
    if (c.outstanding_tokens > bound_of(c)) continue;
    const std::uint64_t tokens =
        std::uint64_t{cost.prefix_block_tokens} * index_.matched_blocks(c.id, cost.prefix_block_tokens, cost.prefix_hashes);
    if (tokens == 0 || tokens < config_.min_match_tokens || tokens < best_tokens) continue;
    const routing_candidate& b = pool.at(best);
    // Longer match; on equal match, less load; then the first after the cursor.
    const bool better = tokens > best_tokens || c.outstanding_tokens < b.outstanding_tokens ||
                        (c.outstanding_tokens == b.outstanding_tokens && after_cursor(p) < after_cursor(best));
    if (best_tokens == 0 || better) {
      best = p;
      best_tokens = tokens;
    }
  }
  return best;
}

namespace {
constexpr std::array<std::string_view, 5> policy_names = {"round_robin", "least_outstanding", "power_of_two",
                                                          "predictive", "prefix_aware"};
}  // namespace

std::span<const std::string_view> routing_policy_names() noexcept { return policy_names; }

expected<void> check_prefix_slack(std::uint64_t tokens, double ratio, double seconds) {
  if (tokens > prefix_slack_tokens_max)
    return make_error(errc::invalid_argument, "prefix_slack_tokens must be in [0, " +
                                                  std::to_string(prefix_slack_tokens_max) + "], got " +
                                                  std::to_string(tokens));
  if (!std::isfinite(ratio) || ratio < 0 || ratio > prefix_slack_ratio_max)
    return make_error(errc::invalid_argument, fmt::format("prefix_slack_ratio must be a number in [0, {}], got {}",
                                                          prefix_slack_ratio_max, ratio));
  if (!std::isfinite(seconds) || seconds < 0 || seconds > prefix_slack_s_max)
    return make_error(errc::invalid_argument, fmt::format("prefix_slack_s must be a number of seconds in [0, {}], got {}",
                                                          prefix_slack_s_max, seconds));
  return {};
}

expected<void> check_region(std::string_view region) {
  if (region.size() > 64) return make_error(errc::invalid_argument, "a region name has at most 64 characters");
  for (const char c : region)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.')
      return make_error(errc::invalid_argument,
                        "region '" + std::string(region) + "' may use only letters, digits, '-', '_' and '.'");
  return {};
}

std::vector<replica_id> outside_region(std::string_view region, std::span<const std::pair<replica_id, node_id>> members,
                                       const std::map<node_id, std::string>& node_regions) {
  std::vector<replica_id> out;
  if (region.empty()) return out;
  for (const auto& [id, node] : members) {
    const auto r = node_regions.find(node);
    if (r == node_regions.end() || r->second != region) out.push_back(id);
  }
  return out;
}

expected<std::unique_ptr<routing_policy>> make_routing_policy(std::string_view name,
                                                              const predictive_config& config,
                                                              const prefix_aware_config& prefix) {
  if (name == "round_robin") return std::make_unique<round_robin_policy>();
  if (name == "least_outstanding") return std::make_unique<least_outstanding_policy>();
  if (name == "power_of_two") return std::make_unique<power_of_two_policy>();
  if (name == "predictive") {
    if (!(config.default_decode_tokens_per_s > 0) || !(config.default_prefill_tokens_per_s > 0) ||
        !std::isfinite(config.default_decode_tokens_per_s) ||
        !std::isfinite(config.default_prefill_tokens_per_s)) {
      return make_error(errc::invalid_argument,
                        "predictive routing needs finite positive default speeds");
    }
    return std::make_unique<predictive_policy>(config);
  }
  if (name == "prefix_aware") {
    if (!(prefix.load_slack_ratio >= 0) || !std::isfinite(prefix.load_slack_ratio) || !(prefix.load_slack_s >= 0) ||
        !std::isfinite(prefix.load_slack_s) || prefix.index.reported_max == 0)
      return make_error(errc::invalid_argument,
                        "prefix_aware routing needs finite load_slack_ratio and load_slack_s >= 0 and reported_max > 0");
    return std::make_unique<prefix_aware_policy>(prefix);
  }
  std::string message = "unknown routing policy '" + std::string(name) + "'; valid policies: ";
  for (std::size_t i = 0; i < policy_names.size(); ++i)
    message += (i > 0 ? ", " : "") + std::string(policy_names[i]);
  return make_error(errc::invalid_argument, std::move(message));
}

// ---- replica_table -------------------------------------------------------------

namespace {

expected<void> check_speeds(double decode_tokens_per_s, double prefill_tokens_per_s, replica_id id) {
  const auto ok = [](double v) { return std::isfinite(v) && v >= 0; };
  if (ok(decode_tokens_per_s) && ok(prefill_tokens_per_s)) return {};
  return make_error(errc::invalid_argument, "replica " + std::to_string(id) +
                                                " reported a negative or non-finite speed");
}

}  // namespace

expected<replica_table> replica_table::create(replica_table_config config) {
  auto policy = make_routing_policy(config.default_policy, config.predictive, config.prefix_aware);
  if (!policy) return std::unexpected(policy.error());
  if (!(config.speed_ewma_alpha > 0 && config.speed_ewma_alpha <= 1)) {
    return make_error(errc::invalid_argument, "speed_ewma_alpha must be in (0, 1]");
  }
  if (config.replicas_max == 0 || config.models_max == 0 || config.versions_per_model_max == 0 ||
      config.slots_max == 0) {
    return make_error(errc::invalid_argument, "replica table bounds must be positive");
  }
  return replica_table(std::move(config));
}

replica_table::replica_table(replica_table_config config)
    : config_(std::move(config)), rng_(config_.seed) {}

expected<replica_table::located> replica_table::locate(replica_id id) {
  const auto it = where_.find(id);
  if (it == where_.end()) return make_error(errc::not_found, "unknown replica " + std::to_string(id));
  candidate_pool* pool = it->second;
  if (!pool->indexed()) pool->reindex();
  const auto pos = pool->find(id);
  EXA_ASSERT_MSG(pos.has_value(), "where_ points at a pool that holds the replica");
  return located{pool, *pos};
}

expected<replica_table::model_entry*> replica_table::model_for_insert(const std::string& model) {
  if (auto it = models_.find(model); it != models_.end()) return &it->second;
  if (models_.size() >= config_.models_max) {
    return make_error(errc::overloaded, "cannot add model '" + model + "': the routing table holds " +
                                            std::to_string(config_.models_max) + " models (limit)");
  }
  auto policy = make_routing_policy(config_.default_policy, config_.predictive, config_.prefix_aware);
  EXA_ASSERT_MSG(policy.has_value(), "the default policy was validated by create()");
  auto& entry = models_[model];
  entry.policy = std::move(*policy);
  return &entry;
}

// The version's pool, created if new (check_room() has checked the bound).
candidate_pool& replica_table::pool_for_insert(model_entry& model, const std::string& version) {
  for (auto& v : model.versions) {
    if (v.version == version) return *v.pool;
  }
  EXA_ASSERT(model.versions.size() < config_.versions_per_model_max);
  model.versions.push_back(version_entry{version, std::make_unique<candidate_pool>()});
  return *model.versions.back().pool;
}

// Whether adding a replica of (model, version) stays within the bounds,
// checked before anything changes so a refused upsert changes nothing.
expected<void> replica_table::check_room(const std::string& model, const std::string& version) const {
  const auto it = models_.find(model);
  if (it == models_.end()) {
    if (models_.size() < config_.models_max) return {};
    return make_error(errc::overloaded, "cannot add model '" + model + "': the routing table holds " +
                                            std::to_string(config_.models_max) + " models (limit)");
  }
  const auto& versions = it->second.versions;
  const bool known = std::any_of(versions.begin(), versions.end(),
                                 [&](const version_entry& v) { return v.version == version; });
  if (known || versions.size() < config_.versions_per_model_max) return {};
  return make_error(errc::overloaded, "cannot add version '" + version + "' of model '" + model +
                                          "': it serves " + std::to_string(config_.versions_per_model_max) +
                                          " versions (limit)");
}

void replica_table::note_degraded(replica_id id, replica_state state) {
  if (state == replica_state::degraded) degraded_.insert(id);
  else degraded_.erase(id);
}

expected<void> replica_table::upsert(routing_candidate candidate) {
  const replica_id id = candidate.id;
  const replica_state state = candidate.state;
  auto ok = upsert_record(std::move(candidate));
  if (ok) note_degraded(id, state);
  return ok;
}

expected<void> replica_table::upsert_record(routing_candidate candidate) {
  if (candidate.model.empty()) {
    return make_error(errc::invalid_argument, "replica " + std::to_string(candidate.id) + " names no model");
  }
  if (auto ok = check_speeds(candidate.decode_tokens_per_s, candidate.prefill_tokens_per_s, candidate.id);
      !ok) {
    return ok;
  }
  auto slot_it = slots_.find(candidate.slot);
  if (slot_it != slots_.end() && candidate.epoch < slot_it->second.epoch) {
    return make_error(errc::stale_epoch, "replica " + std::to_string(candidate.id) + " of slot " +
                                             describe(candidate.slot) + " has epoch " +
                                             std::to_string(candidate.epoch) + " but the slot is at epoch " +
                                             std::to_string(slot_it->second.epoch));
  }
  if (slot_it == slots_.end() && slots_.size() >= config_.slots_max) {
    return make_error(errc::overloaded, "the routing table tracks " + std::to_string(config_.slots_max) +
                                            " slots (limit)");
  }
  const auto existing = where_.find(candidate.id);
  if (existing == where_.end() && where_.size() >= config_.replicas_max) {
    return make_error(errc::overloaded, "the routing table holds " + std::to_string(config_.replicas_max) +
                                            " replicas (limit)");
  }
  if (existing != where_.end()) {
    auto at = locate(candidate.id);
    EXA_ASSERT(at.has_value());
    const routing_candidate& old = at->pool->at(at->pos);
    if (old.model == candidate.model && old.version == candidate.version && old.slot == candidate.slot) {
      const slot_ref slot = candidate.slot;
      const epoch_t epoch = candidate.epoch;
      at->pool->replace(at->pos, std::move(candidate), false);
      auto& entry = slots_.at(slot);
      for (auto& member : entry.members) {
        if (member.id == at->pool->at(at->pos).id) member.epoch = epoch;
      }
      if (epoch > entry.epoch) mark_older_stale(slot, epoch);
      return {};
    }
  }
  if (auto room = check_room(candidate.model, candidate.version); !room) return room;
  if (existing != where_.end()) {
    // Moved to another model, version or slot: rare, so remove and re-add.
    const routing_candidate old = *find(candidate.id);
    erase_existing(old);
  }
  auto model = model_for_insert(candidate.model);
  EXA_ASSERT(model.has_value());
  candidate_pool& pool = pool_for_insert(**model, candidate.version);
  const slot_ref slot = candidate.slot;
  const epoch_t epoch = candidate.epoch;
  const replica_id id = candidate.id;
  pool.insert(std::move(candidate), false);
  where_[id] = &pool;
  auto& entry = slots_[slot];
  entry.members.push_back(slot_member{id, epoch});
  if (epoch > entry.epoch) mark_older_stale(slot, epoch);
  return {};
}

// Raises the slot's epoch and marks its replicas with older epochs stale.
// Members at the new epoch are not even located: a bulk load of new
// replicas must not reindex their pool once per replica.
void replica_table::mark_older_stale(const slot_ref& slot, epoch_t epoch) {
  auto& entry = slots_[slot];
  EXA_ASSERT_MSG(epoch >= entry.epoch, "epochs only grow");
  entry.epoch = epoch;
  for (const auto& member : entry.members) {
    if (member.epoch >= epoch) continue;
    auto at = locate(member.id);
    EXA_ASSERT(at.has_value() && at->pool->at(at->pos).epoch == member.epoch);
    at->pool->set_stale(at->pos, true);
  }
}

void replica_table::erase_existing(const routing_candidate& old) {
  if (const auto model = models_.find(old.model); model != models_.end()) model->second.policy->forget(old.id);
  candidate_pool* pool = where_.at(old.id);
  const bool erased = pool->erase(old.id);
  EXA_ASSERT(erased);
  where_.erase(old.id);
  std::erase_if(slots_.at(old.slot).members, [&](const slot_member& m) { return m.id == old.id; });
  // An emptied version disappears so that "the model's only version" stays
  // meaningful once a rollout's old version is gone. The slot keeps its epoch.
  if (pool->size() == 0) {
    const auto model = models_.find(old.model);
    EXA_ASSERT(model != models_.end());
    auto& versions = model->second.versions;
    std::erase_if(versions, [pool](const version_entry& v) { return v.pool.get() == pool; });
  }
}

expected<void> replica_table::remove(replica_id id) {
  const routing_candidate* record = find(id);
  if (record == nullptr) return make_error(errc::not_found, "unknown replica " + std::to_string(id));
  const routing_candidate old = *record;
  erase_existing(old);
  degraded_.erase(id);
  return {};
}

expected<void> replica_table::update_load(replica_id id, const load_report& report) {
  if (auto ok = check_speeds(report.decode_tokens_per_s, report.prefill_tokens_per_s, id); !ok) return ok;
  auto at = locate(id);
  if (!at) return std::unexpected(at.error());
  at->pool->apply_load(at->pos, report, config_.speed_ewma_alpha);
  if (const auto model = models_.find(at->pool->at(at->pos).model); model != models_.end())
    model->second.policy->observe_load(id, report);
  return {};
}

expected<void> replica_table::set_state(replica_id id, replica_state state) {
  auto at = locate(id);
  if (!at) return std::unexpected(at.error());
  at->pool->set_state(at->pos, state);
  note_degraded(id, state);
  return {};
}

expected<void> replica_table::set_suspect(replica_id id, bool suspect) {
  auto at = locate(id);
  if (!at) return std::unexpected(at.error());
  at->pool->set_suspect(at->pos, suspect);
  return {};
}

expected<void> replica_table::fence(const slot_ref& slot, epoch_t epoch) {
  const auto it = slots_.find(slot);
  if (it == slots_.end() && slots_.size() >= config_.slots_max) {
    return make_error(errc::overloaded, "the routing table tracks " + std::to_string(config_.slots_max) +
                                            " slots (limit)");
  }
  if (it != slots_.end() && epoch < it->second.epoch) {
    return make_error(errc::stale_epoch, "fence of slot " + describe(slot) + " to epoch " +
                                             std::to_string(epoch) + " is below its current epoch " +
                                             std::to_string(it->second.epoch));
  }
  mark_older_stale(slot, epoch);
  return {};
}

expected<void> replica_table::set_policy(std::string_view model, std::string_view policy_name,
                                         std::uint64_t prefix_slack_tokens, double prefix_slack_ratio,
                                         double prefix_slack_s) {
  if (auto ok = check_prefix_slack(prefix_slack_tokens, prefix_slack_ratio, prefix_slack_s); !ok) return ok;
  prefix_aware_config prefix = config_.prefix_aware;
  prefix.load_slack_tokens = prefix_slack_tokens;
  prefix.load_slack_ratio = prefix_slack_ratio;
  prefix.load_slack_s = prefix_slack_s;
  auto policy = make_routing_policy(policy_name, config_.predictive, prefix);
  if (!policy) return std::unexpected(policy.error());
  auto entry = model_for_insert(std::string(model));
  if (!entry) return std::unexpected(entry.error());
  (*entry)->policy = std::move(*policy);
  return {};
}

expected<void> replica_table::set_policy(std::string_view model, std::string_view policy_name) {
  auto policy = make_routing_policy(policy_name, config_.predictive, config_.prefix_aware);
  if (!policy) return std::unexpected(policy.error());
  auto entry = model_for_insert(std::string(model));
  if (!entry) return std::unexpected(entry.error());
  (*entry)->policy = std::move(*policy);
  return {};
}

expected<replica_table::route_target> replica_table::target_for_route(std::string_view model,
                                                                      std::string_view version) {
  const auto it = models_.find(model);
  if (it == models_.end()) return make_error(errc::not_found, "unknown model '" + std::string(model) + "'");
  model_entry& entry = it->second;
  if (version.empty()) {
    if (entry.versions.size() > 1) {
      std::string message = "model '" + std::string(model) + "' serves " +
                            std::to_string(entry.versions.size()) + " versions (";
      for (std::size_t i = 0; i < entry.versions.size(); ++i) {
        message += (i > 0 ? ", '" : "'") + entry.versions[i].version + "'";
      }
      return make_error(errc::invalid_argument, message + "); name one");
    }
    return route_target{&entry, entry.versions.empty() ? nullptr : entry.versions.front().pool.get()};
  }
  for (auto& v : entry.versions) {
    if (v.version == version) return route_target{&entry, v.pool.get()};
  }
  return make_error(errc::not_found, "unknown version '" + std::string(version) + "' of model '" +
                                         std::string(model) + "'");
}

error replica_table::no_replica_error(std::string_view model, const candidate_pool* pool) const {
  if (pool != nullptr && pool->full_count() > 0) {
    return error{errc::overloaded, "all " + std::to_string(pool->full_count()) +
                                       " ready replicas of model '" + std::string(model) +
                                       "' have full queues"};
  }
  return error{errc::unavailable, "no ready replica of model '" + std::string(model) + "' (" +
                                      std::to_string(pool ? pool->size() : 0) +
                                      " known, none ready, unsuspected and current)"};
}

expected<const routing_candidate*> replica_table::route(std::string_view model, std::string_view version,
                                                        const request_cost& cost,
                                                        const std::vector<replica_id>& exclude) {
  auto target = target_for_route(model, version);
  if (!target) return std::unexpected(target.error());
  candidate_pool* pool = target->pool;
  if (pool == nullptr) return std::unexpected(no_replica_error(model, nullptr));
  if (!pool->indexed()) pool->reindex();
  // Excluded replicas are hidden from the policy for this one decision (as
  // if suspect), then shown again.
  std::vector<candidate_pool::position> hidden;
  for (const replica_id id : exclude) {
    const auto pos = pool->find(id);
    if (pos && !pool->at(*pos).suspect) {
      pool->set_suspect(*pos, true);
      hidden.push_back(*pos);
    }
  }
  auto chosen = target->model->policy->choose(cost, *pool, rng_);
  for (const auto pos : hidden) pool->set_suspect(pos, false);
  if (!chosen && !hidden.empty()) chosen = target->model->policy->choose(cost, *pool, rng_);
  // Degraded replicas are the last resort: shown to the policy (as if
  // serving) only when no healthy one can take the request.
  // Degraded ones the request already failed on come last of all.
  for (const bool with_excluded : {false, true}) {
    if (chosen || degraded_.empty()) break;
    std::vector<candidate_pool::position> shown;
    for (const replica_id id : degraded_) {
      const bool excluded = std::find(exclude.begin(), exclude.end(), id) != exclude.end();
      if (excluded && !with_excluded) continue;
      const auto pos = pool->find(id);
      if (!pos) continue;
      pool->set_state(*pos, replica_state::serving);
      shown.push_back(*pos);
    }
    if (!shown.empty()) chosen = target->model->policy->choose(cost, *pool, rng_);
    for (const auto pos : shown) pool->set_state(pos, replica_state::degraded);
  }
  if (!chosen) return std::unexpected(no_replica_error(model, pool));
  pool->charge(*chosen, cost);
  target->model->policy->observe_routed(pool->at(*chosen).id, cost);
  return &pool->at(*chosen);
}

const routing_candidate* replica_table::find(replica_id id) {
  auto at = locate(id);
  return at ? &at->pool->at(at->pos) : nullptr;
}

expected<std::string_view> replica_table::policy_name(std::string_view model) const {
  const auto it = models_.find(model);
  if (it == models_.end()) return make_error(errc::not_found, "unknown model '" + std::string(model) + "'");
  return it->second.policy->name();
}

std::uint32_t replica_table::prefix_block_tokens(std::string_view model) const {
  const auto it = models_.find(model);
  if (it == models_.end()) return 0;
  const auto* policy = dynamic_cast<const prefix_aware_policy*>(it->second.policy.get());
  return policy ? policy->index().block_tokens() : 0;
}

epoch_t replica_table::slot_epoch(const slot_ref& slot) const {
  const auto it = slots_.find(slot);
  return it == slots_.end() ? 0 : it->second.epoch;
}

}  // namespace exa::cluster
