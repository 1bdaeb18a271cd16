#include "engine/sim_engine.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "common/assert.hpp"
#include "engine/fair_stop.hpp"
#include "model/prefix_hash.hpp"

namespace exa::engine {

namespace {

// The zero-cost engine's token function (null_engine::next_token), kept as a
// running FNV-1a hash so that a step costs O(1) per token instead of
// rehashing the whole sequence. A sequence resumed elsewhere with its tokens
// as resume_tokens rebuilds the same hash, so it continues exactly.
constexpr std::uint64_t fnv_offset = 1469598103934665603ull;
constexpr std::uint64_t fnv_prime = 1099511628211ull;

std::uint64_t extend(std::uint64_t h, model::token_id t) noexcept {
  return (h ^ static_cast<std::uint64_t>(t)) * fnv_prime;
}

model::token_id token_of(std::uint64_t h, std::uint32_t vocab) noexcept {
  // Printable ASCII bytes of the byte-level vocabulary when it exists, as
  // null_engine does, so the two engines agree token for token.
  if (vocab >= 259) return static_cast<model::token_id>(3 + 32 + h % 95);
  return static_cast<model::token_id>(h % vocab);
}

std::uint32_t clamp_u32(std::uint64_t v) noexcept {
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(v, std::numeric_limits<std::uint32_t>::max()));
}

}  // namespace

// ---- cost model ------------------------------------------------------------

double sim_cost_model::compute_ops_per_s() const noexcept {
  const double peak = model_.int8_compute ? device_.int8_ops_per_s : device_.flops_per_s;
  return peak * device_.compute_efficiency;
}

double sim_cost_model::prefill_s(std::uint64_t tokens, std::uint64_t context_before) const {
  const double t = static_cast<double>(tokens);
  const double matrices = 2.0 * static_cast<double>(model_.parameters) * t;
  const double attention = 4.0 * static_cast<double>(model_.n_layers) * static_cast<double>(model_.dim) * t *
                           (static_cast<double>(context_before) + t / 2.0);
  return (matrices + attention) / compute_ops_per_s();
}

double sim_cost_model::decode_step_s(std::uint32_t batch, std::uint64_t context_tokens, std::uint32_t sharing) const {
  EXA_ASSERT_MSG(sharing >= 1, "a device is shared by at least the replica asking");
  // Its reads at peak, slowed to the achievable share of the device's share.
  const double memory_s = decode_read_s(context_tokens) * static_cast<double>(sharing) / device_.bandwidth_efficiency;
  const double compute_s = 2.0 * static_cast<double>(model_.parameters) * static_cast<double>(batch) / compute_ops_per_s();
  return std::max(memory_s, compute_s);
}

double sim_cost_model::decode_read_s(std::uint64_t context_tokens) const {
  const double bytes = static_cast<double>(model_.weight_bytes) +
                       static_cast<double>(model_.kv_bytes_per_token) * static_cast<double>(context_tokens);
  return bytes / device_.memory_bandwidth_bytes_per_s;
}

double sim_cost_model::load_s() const {
  return static_cast<double>(model_.weight_bytes) / device_.load_bytes_per_s;
}

// ---- engine: requests ------------------------------------------------------

sim_engine::sim_engine(sim_cost_model cost, sim_engine_config config)
    : cost_(cost),
      config_(config),
      usage_(config.usage),
      prefix_(config.prefix_block_tokens > 0 ? config.kv_capacity_tokens / config.prefix_block_tokens : 0) {
  EXA_ASSERT_MSG(config_.max_running >= 1, "sim_engine needs room for one running sequence");
  EXA_ASSERT_MSG(config_.fair_prefill_chunk >= 1, "sim_engine needs a prefill chunk for scheduling across tenants");
  EXA_ASSERT_MSG(config_.horizon_s > 0, "sim_engine needs a positive horizon");
  EXA_ASSERT_MSG(cost_.model().vocab_size >= 1, "sim_model needs a vocabulary");
  const sim_device& d = cost_.device();
  EXA_ASSERT_MSG(d.memory_bandwidth_bytes_per_s > 0 && d.bandwidth_efficiency > 0 && d.flops_per_s > 0 &&
                     d.int8_ops_per_s > 0 && d.compute_efficiency > 0,
                 "sim_device rates must be positive");
}

expected<void> sim_engine::check(const generation_request& r) const {
  const sim_model& m = cost_.model();
  if (r.prompt.empty()) return make_error(errc::invalid_argument, "prompt is empty: give at least one token");
  // It models time, not text: there are no logits to take probabilities of.
  if (r.logprobs)
    return make_error(errc::unsupported, "logprobs need an engine that computes logits; the simulated engine has none");
  const std::uint64_t total = r.prompt.size() + std::uint64_t{r.max_tokens};
  if (total > m.context_length)
    return make_error(errc::invalid_argument, "prompt (" + std::to_string(r.prompt.size()) + " tokens) + max_tokens (" +
                                                  std::to_string(r.max_tokens) +
                                                  ") exceeds the model's context length " +
                                                  std::to_string(m.context_length));
  if (total > config_.kv_capacity_tokens)
    return make_error(errc::invalid_argument, "prompt + max_tokens (" + std::to_string(total) +
                                                  " tokens) exceeds this replica's KV cache capacity of " +
                                                  std::to_string(config_.kv_capacity_tokens) + " tokens");
  if (r.resume_tokens.size() > r.max_tokens)
    return make_error(errc::invalid_argument, "more resume tokens (" + std::to_string(r.resume_tokens.size()) +
                                                  ") than max_tokens (" + std::to_string(r.max_tokens) + ")");
  for (const auto* list : {&r.prompt, &r.resume_tokens})
    for (std::size_t i = 0; i < list->size(); ++i)
      if ((*list)[i] < 0 || static_cast<std::uint32_t>((*list)[i]) >= m.vocab_size)
        return make_error(errc::invalid_argument, "token id " + std::to_string((*list)[i]) + " at index " +
                                                      std::to_string(i) + " is outside the vocabulary [0, " +
                                                      std::to_string(m.vocab_size) + ")");
  if (auto ok = check_tenant_weight(r.tenant_weight); !ok) return ok;
  return validate(r.sampling);
}

expected<void> sim_engine::submit(generation_request r) {
  if (auto ok = check(r); !ok) return ok;
  if (active_.contains(r.id))
    return make_error(errc::invalid_argument, "request id " + std::to_string(r.id) + " is already active");
  if (waiting_.size() >= config_.max_waiting)
    return make_error(errc::overloaded,
                      "engine queue is full (" + std::to_string(config_.max_waiting) + " waiting)");
  // A new request reusing the id of one the last macro step finished would
  // meet its twin again if that step were rolled back: forbid the rollback.
  if (last_.valid || last_.layer_cuttable)  // a stop at a stage boundary undoes a step too
    for (const seq& f : last_.finished)
      if (f.id == r.id) last_.valid = last_.layer_cuttable = false;

  seq s;
  s.id = r.id;
  s.prompt_tokens = static_cast<std::uint32_t>(r.prompt.size());
  s.max_tokens = r.max_tokens;
  s.generated = static_cast<std::uint32_t>(r.resume_tokens.size());
  s.hash = fnv_offset;
  for (const auto t : r.prompt) s.hash = extend(s.hash, t);
  for (const auto t : r.resume_tokens) s.hash = extend(s.hash, t);
  if (config_.prefix_block_tokens > 0) {
    std::vector<model::token_id> context(r.prompt);
    context.insert(context.end(), r.resume_tokens.begin(), r.resume_tokens.end());
    s.blocks = model::prefix_block_hashes(context, config_.prefix_block_tokens);
  }
  if (s.generated >= s.max_tokens) {  // a resume with nothing left to do
    pending_finished_.push_back({s.id, finish_reason::length, s.generated});
    return {};
  }
  s.stop_tokens = std::move(r.stop_tokens);
  s.tenant = usage_.intern(r.tenant, r.tenant_weight);
  s.priority = r.priority;
  s.arrival = next_arrival_++;
  active_.insert(s.id);
  waiting_.push_back(std::move(s));
  return {};
}

void sim_engine::cancel(seq_id id) {
  if (!active_.contains(id)) return;  // unknown or already finished
  active_.erase(id);
  const auto running = std::find_if(running_.begin(), running_.end(), [id](const seq& s) { return s.id == id; });
  if (running != running_.end()) {
    kv_used_ -= running->kv_tokens();
    pending_finished_.push_back({id, finish_reason::cancelled, running->generated, running->cached_tokens});
    running_.erase(running);
    // It ran in the last macro step; undoing that step would revive it.
    last_.valid = last_.layer_cuttable = false;
    return;
  }
  const auto waiting = std::find_if(waiting_.begin(), waiting_.end(), [id](const seq& s) { return s.id == id; });
  EXA_ASSERT_MSG(waiting != waiting_.end(), "an active id is running or waiting");
  pending_finished_.push_back({id, finish_reason::cancelled, waiting->generated});
  waiting_.erase(waiting);
}

bool sim_engine::idle() const { return running_.empty() && waiting_.empty() && pending_finished_.empty(); }

engine_stats sim_engine::stats() const {
  engine_stats s = stats_;
  s.running = static_cast<std::uint32_t>(running_.size());
  s.waiting = static_cast<std::uint32_t>(waiting_.size());
  s.kv_capacity_tokens = clamp_u32(config_.kv_capacity_tokens);
  s.kv_free_tokens = clamp_u32(config_.kv_capacity_tokens - kv_used_);
  s.prefix_cached_blocks = clamp_u32(prefix_.size());
  s.prefix_evicted_blocks = prefix_.evicted();
  return s;
}

prefix_summary sim_engine::cached_prefixes(std::size_t max_hashes) const {
  if (config_.prefix_block_tokens == 0) return {};
  // The last step's blocks first: they enter the cache when the next step
  // begins (a replay after a cut admits the same ones), and an engine gone
  // idle takes no next step before it reports.
  prefix_summary out{config_.prefix_block_tokens, {}};
  std::unordered_set<std::uint64_t> seen;
  for (const std::uint64_t h : last_.cache_inserts) {
    if (out.hashes.size() >= max_hashes) return out;
    if (seen.insert(h).second) out.hashes.push_back(h);
  }
  for (const std::uint64_t h : prefix_.most_recent(max_hashes)) {
    if (out.hashes.size() >= max_hashes) break;
    if (!seen.contains(h)) out.hashes.push_back(h);
  }
  return out;
}

std::size_t sim_engine::prefix_lru::match(std::span<const std::uint64_t> blocks) const {
  std::size_t n = 0;
  while (n < blocks.size() && where_.contains(blocks[n])) ++n;
  return n;
}

std::size_t sim_engine::prefix_lru::evicted_run(std::span<const std::uint64_t> blocks, std::size_t from) const {
  std::size_t n = 0;
  while (from + n < blocks.size() && evicted_hashes_.contains(blocks[from + n])) ++n;
  return n;
}

void sim_engine::prefix_lru::touch(std::span<const std::uint64_t> blocks) {
  if (capacity_ == 0) return;
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    if (const auto found = where_.find(*it); found != where_.end()) {
      order_.splice(order_.begin(), order_, found->second);
      continue;
    }
    order_.push_front(*it);
    where_.emplace(*it, order_.begin());
    if (where_.size() > capacity_) {
      evicted_hashes_.add(order_.back());
      where_.erase(order_.back());
      order_.pop_back();
      ++evicted_;
    }
  }
  EXA_ASSERT(where_.size() == order_.size() && where_.size() <= capacity_);
}

std::vector<std::uint64_t> sim_engine::prefix_lru::most_recent(std::size_t max) const {
  std::vector<std::uint64_t> out;
  out.reserve(std::min(max, order_.size()));
  for (auto it = order_.begin(); it != order_.end() && out.size() < max; ++it) out.push_back(*it);
  return out;
}

void sim_engine::set_device_sharing(std::uint32_t active_replicas) {
  // Zero would mean "no replica uses the device", yet this one asks: treat
  // it as having the device alone.
  sharing_ = std::max<std::uint32_t>(active_replicas, 1);
}

// ---- engine: macro steps ---------------------------------------------------

step_result sim_engine::step() {
  usage_.adopt_weights();  // not in begin_step: a replay keeps the cut step's
  begin_step(sharing_);
  step_result out;
  out.finished = std::move(pending_finished_);
  pending_finished_.clear();
  last_.pending.assign(out.finished.begin(), out.finished.end());
  {
    const std::lock_guard lock(*offers_mu_);
    offers_.clear();  // offers are for the step in flight
  }
  last_was_remainder_ = false;
  // A stopped decode step none of whose sequences runs any more (cancelled),
  // or a stopped chunk whose sequence was cancelled, is owed to nobody (the
  // chunk stays charged, as the CPU engine keeps a cancelled request's own
  // chunk charged).
  if (owed_ && std::none_of(owed_->ids.begin(), owed_->ids.end(), [&](seq_id id) {
        return std::any_of(running_.begin(), running_.end(), [id](const seq& r) { return r.id == id; });
      }))
    owed_.reset();
  if (owed_) {
    if (!owed_->interlude_ran) {
      owed_->interlude_ran = true;
      owed_->interlude_arrivals = next_arrival_;
      owed_->interlude_admitted = run_interlude(out);
      if (owed_->interlude_admitted) return out;
    }
    // A prompt that arrived while the interlude ran is waiting here now: the
    // rest stops for it at its first boundary, as the CPU engine's does.
    if (owed_->interlude_admitted && owed_->remaining_s > owed_->layer_s * (1 + 1e-9) &&
        waiting_goes_before(members(owed_->ids), owed_->interlude_arrivals)) {
      run_first_stage(out);
      return out;
    }
    run_remainder(out);
    return out;
  }
  run_macro(out, nullptr);
  return out;
}

void sim_engine::offer_arrival(arrival_hint hint) {
  if (!config_.layer_yield) return;
  const std::lock_guard lock(*offers_mu_);
  if (offers_.size() < max_offers) offers_.push_back(std::move(hint));
}

void sim_engine::begin_step(std::uint32_t sharing) {
  // The previous step is final now: what it retired is gone for good, and
  // what it prefilled is in the prefix cache.
  prefix_.touch(last_.cache_inserts);
  last_.cache_inserts.clear();
  last_.finished.clear();
  last_.valid = last_.layer_cuttable = false;
  last_.sharing = sharing;
  last_.kv_used = kv_used_;
  last_.next_admit = next_admit_;
  last_.arrivals = next_arrival_;
  last_.stats = stats_;
  usage_.save(last_.usage);
  for (seq& s : running_) {
    s.generated_before = s.generated;
    s.hash_before = s.hash;
    s.prefilling_before = s.prefilling;
    s.prefilled_before = s.prefilled;
  }
}

void sim_engine::run_macro(step_result& out, const replay* limits) {
  last_.boundaries_s.clear();
  last_.decode_read_s.clear();
  last_.prefill_order.clear();
  last_.prefill_chunked.clear();
  last_.chunk_seq.clear();
  last_.fair = limits != nullptr ? limits->fair : contended();
  bool finished = false;
  const double prefill_s = last_.fair ? prefill_fair(out, limits, finished)
                                      : admit(out, limits != nullptr ? limits->admitted
                                                                     : std::numeric_limits<std::uint32_t>::max());
  if (running_.empty()) {
    // Every queued request fits an empty engine (submit checked it against
    // the whole KV capacity), so an engine with nothing running admits.
    EXA_ASSERT(waiting_.empty() || limits != nullptr);
    return;  // idle, or only finishes to report: no time passes
  }
  ++stats_.steps;
  out.tokens.reserve(out.tokens.size() + token_bound(prefill_s));

  if (!last_.fair && last_.admitted > 0) {
    // Each admitted sequence's first token comes out of its prefill.
    last_.boundaries_s.push_back(prefill_s);
    for (std::size_t i = running_.size() - last_.admitted; i < running_.size(); ++i)
      finished = emit(running_[i], out) || finished;
  }
  last_.prefill_boundaries = last_.boundaries_s.size();
  last_.has_prefill = last_.prefill_boundaries > 0;
  // A step that prefills ends there: its first tokens reach their clients
  // at the exact moment they exist (TTFT is the metric everyone reads), and
  // decoding resumes in the next macro step.
  const std::uint32_t decode_limit = limits != nullptr ? limits->decode_kept : std::numeric_limits<std::uint32_t>::max();
  const bool chunk_stopped = limits != nullptr && limits->partial_prefill;  // the step ends at its stop
  if (!finished && !chunk_stopped && !(last_.has_prefill && config_.prefill_ends_step))
    decode(out, prefill_s, decode_limit, limits != nullptr ? limits->partial_s : 0);
  EXA_ASSERT_MSG(!last_.boundaries_s.empty(), "a macro step with sequences running ends at a boundary");
  close_step(out);
  // Only a step with a boundary before its end can be cut, or one that
  // prefilled first come, which a second tenant's arrival may re-plan.
  last_.valid = last_.boundaries_s.size() >= 2 || (!last_.fair && last_.has_prefill);
  last_.layer_cuttable = config_.layer_yield;
}

void sim_engine::close_step(step_result& out) {
  // Tokens charged, finished sequences retired, the step's time and counts.
  charge_decodes();
  retire();
  out.duration_s = last_.boundaries_s.back();
  out.decode_tokens = static_cast<std::uint32_t>(out.tokens.size());
  stats_.generated_tokens += out.tokens.size();
  stats_.prefill_tokens += out.prefill_tokens;
}

double sim_engine::admit(step_result& out, std::uint32_t admit_limit) {
  // Strict FIFO, the whole prompt + max_tokens reserved at once: an admitted
  // sequence always runs to its end, so nothing is ever preempted and
  // nothing deadlocks. The first admission of a step ignores the token
  // budget, so a prompt longer than it still gets in (alone).
  double prefill_s = 0;
  std::uint64_t tokens = 0;
  std::uint32_t admitted = 0;
  while (!waiting_.empty() && admitted < admit_limit && running_.size() < config_.max_running) {
    const seq& s = waiting_.front();
    const std::uint64_t cached = cached_prefix(s);
    const std::uint64_t prefill_tokens = s.context() - cached;  // prompt + resumed tokens, less the cached
    if (kv_used_ + s.kv_tokens() > config_.kv_capacity_tokens) break;
    if (admitted > 0 && tokens + prefill_tokens > config_.max_batch_tokens) break;
    // Attention is per sequence: each prompt attends only to itself (and
    // its cached prefix).
    prefill_s += cost_.prefill_s(prefill_tokens, cached);
    tokens += prefill_tokens;
    usage_.charge(s.tenant, prefill_tokens);
    take_waiting(waiting_.begin(), cached);
    ++admitted;
  }
  last_.admitted = admitted;
  out.prefill_tokens = clamp_u32(tokens);
  return prefill_s;
}

std::uint64_t sim_engine::cached_prefix(const seq& s) const {
  // Blocks found in the prefix cache are not computed again; the last
  // token always is (its logits give the first token).
  if (s.blocks.empty()) return 0;
  const std::size_t usable = static_cast<std::size_t>((s.context() - 1) / config_.prefix_block_tokens);
  return std::uint64_t{config_.prefix_block_tokens} * std::min(prefix_.match(s.blocks), usable);
}

void sim_engine::take_waiting(std::deque<seq>::iterator it, std::uint64_t cached) {
  // Admits a waiting sequence: its whole prompt + max_tokens reserved at
  // once, the prefix cache's statistics counted.
  seq& s = *it;
  if (config_.prefix_block_tokens > 0) {
    stats_.prefix_lookup_tokens += s.context();
    stats_.prefix_hit_tokens += cached;
    // The missed blocks right after the matched run, if evicted lately, up
    // to the usable ones as the hit is counted (the last token is always
    // computed): what a larger cache would have served too.
    const std::size_t matched = prefix_.match(s.blocks);
    const std::size_t usable = static_cast<std::size_t>((s.context() - 1) / config_.prefix_block_tokens);
    const std::uint64_t reach =
        std::uint64_t{config_.prefix_block_tokens} * std::min(matched + prefix_.evicted_run(s.blocks, matched), usable);
    stats_.prefix_evicted_miss_tokens += reach > cached ? reach - cached : 0;
    last_.cache_inserts.insert(last_.cache_inserts.end(), s.blocks.begin(), s.blocks.end());
  }
  s.cached_tokens = static_cast<std::uint32_t>(cached);
  kv_used_ += s.kv_tokens();
  s.admit_order = next_admit_++;
  s.generated_before = s.generated;
  s.hash_before = s.hash;
  s.prefilling_before = false;  // a rollback puts it back in the queue as it was
  s.prefilled_before = 0;
  running_.push_back(std::move(s));
  waiting_.erase(it);
}

// ---- engine: across tenants ------------------------------------------------

bool sim_engine::contended() const {
  return tenants_contended(usage_, [&](auto&& differs) {
    for (const seq& s : waiting_)
      if (differs(s.tenant, s.priority)) return true;
    for (const seq& s : running_)
      if (differs(s.tenant, s.priority)) return true;
    return false;
  });
}

std::vector<seq_id> sim_engine::fair_order(std::uint64_t arrived_before) const {
  // Sequences part way through their prefill and waiting ones, in fair order.
  // An interlude lists only those that go before the stopped step.
  std::vector<member> stopped;
  if (interlude_) stopped = members(owed_->ids);
  const auto listed = [&](const seq& s) { return !interlude_ || goes_before(stopped, s.tenant, s.priority); };
  std::vector<std::pair<fair_key, seq_id>> candidates;
  for (const seq& s : running_)
    if (s.prefilling && listed(s)) candidates.push_back({{s.priority, usage_.usage(s.tenant), s.arrival}, s.id});
  for (const seq& s : waiting_)
    if (s.arrival < arrived_before && listed(s))
      candidates.push_back({{s.priority, usage_.usage(s.tenant), s.arrival}, s.id});
  std::sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<seq_id> order;
  order.reserve(candidates.size());
  for (const auto& c : candidates) order.push_back(c.second);
  return order;
}

double sim_engine::prefill_fair(step_result& out, const replay* limits, bool& finished) {
  // One sequence after another in fair order (a replay: the order the step
  // had), a chunk at a time, within the step's token budget; each chunk ends
  // at a boundary. With prefill_ends_step the step ends where a prefill
  // completes, so that sequence's first token leaves at once.
  const std::vector<seq_id> order = limits != nullptr ? limits->order : fair_order();
  const std::size_t kept = limits != nullptr ? limits->prefill_kept : std::numeric_limits<std::size_t>::max();
  // layer_yield: after the kept chunks, the next one stops part way.
  bool stop_next = limits != nullptr && limits->partial_prefill;
  const double weights_s = cost_.decode_step_s(0, 0, last_.sharing);  // a chunk reads the weights at least once
  // The tenant served least among those with work here: a tenant over its
  // share beside it is chunked, so that it can cut in.
  std::optional<std::pair<double, tenant_usage::slot>> lightest;
  const auto consider = [&](const seq& s) {
    const std::pair<double, tenant_usage::slot> u{usage_.usage(s.tenant), s.tenant};
    if (!lightest || u < *lightest) lightest = u;
  };
  for (const seq& s : waiting_) consider(s);
  for (const seq& s : running_)
    if (s.prefilling) consider(s);
  // A replay of a step across tenants admits what it admitted (its order);
  // otherwise a tenant over its share joins the running set within the
  // step budget only.
  const bool budgeted = config_.fair_step_budget > 0 && (limits == nullptr || limits->chunked.empty());
  const double budget_s = config_.fair_step_budget * weights_s;
  double prefill_s = 0;
  std::uint64_t tokens = 0;
  std::uint32_t admitted = 0;
  bool admitting = true, done = false;
  for (const seq_id id : order) {
    if (done || (last_.boundaries_s.size() >= kept && !stop_next) || tokens >= config_.max_batch_tokens) break;
    auto run = std::find_if(running_.begin(), running_.end(), [id](const seq& s) { return s.id == id; });
    if (run == running_.end()) {
      const auto wait = std::find_if(waiting_.begin(), waiting_.end(), [id](const seq& s) { return s.id == id; });
      EXA_ASSERT_MSG(wait != waiting_.end(), "a sequence to prefill is running or waiting");
      // One that does not fit now stops admissions (first come within fair
      // order: a large request is not overtaken forever); the sequences
      // already admitted go on with their prefill.
      const bool fits = running_.size() < config_.max_running &&
                        kv_used_ + wait->kv_tokens() <= config_.kv_capacity_tokens;
      EXA_ASSERT_MSG(fits || limits == nullptr, "a replay admits what the step admitted");
      if (!admitting || !fits) {
        admitting = false;
        continue;
      }
      // Over the budget it waits, and lighter tenants after it in fair
      // order may still go.
      if (budgeted && lightest && usage_.over_share(wait->tenant, lightest->second)) {
        const auto mine = static_cast<std::uint32_t>(
            std::count_if(running_.begin(), running_.end(), [&](const seq& r) { return r.tenant == wait->tenant; }));
        const double step_with_s = cost_.decode_step_s(static_cast<std::uint32_t>(running_.size()) + 1,
                                                       kv_used_ + wait->kv_tokens(), last_.sharing);
        if (!over_share_admits(mine, step_with_s, budget_s)) continue;
      }
      const std::uint64_t cached = cached_prefix(*wait);
      take_waiting(wait, cached);
      run = std::prev(running_.end());
      run->prefilling = true;
      run->prefilled = static_cast<std::uint32_t>(cached);
      ++admitted;
    }
    seq& s = *run;
    // Only a tenant over its share is chunked: its prefill is what others
    // cut into. Chunks are even (at most fair_prefill_chunk), so none is a
    // sliver that costs a whole read of the weights for a few tokens. A
    // replay chunks as the step did, whatever arrived since.
    const std::size_t at = last_.prefill_order.size();
    const bool chunked = limits != nullptr && at < limits->chunked.size()
                             ? limits->chunked[at] != 0
                             : lightest && usage_.over_share(s.tenant, lightest->second);
    last_.prefill_order.push_back(id);
    last_.prefill_chunked.push_back(chunked ? 1 : 0);
    while (s.prefilling && tokens < config_.max_batch_tokens) {
      const bool stops = last_.boundaries_s.size() >= kept;
      if (stops && !stop_next) break;
      const std::uint64_t left = s.context() - s.prefilled;
      const std::uint64_t room = tokens == 0 ? left : config_.max_batch_tokens - tokens;
      const std::uint64_t chunks = (left + config_.fair_prefill_chunk - 1) / config_.fair_prefill_chunk;
      const std::uint64_t even = chunked ? (left + chunks - 1) / chunks : left;
      const auto n = static_cast<std::uint32_t>(std::min({even, left, room}));
      const double chunk_s = std::max(cost_.prefill_s(n, s.prefilled), weights_s);
      last_.chunk_seq.push_back(id);
      usage_.charge(s.tenant, n);  // when planned, as the CPU engine charges
      if (stops) {
        // layer_yield: this chunk stops limits->partial_s in; the step ends
        // there, and the chunk's tokens (and a first token, when it
        // completes the prompt) come with the rest of it (run_remainder).
        owed_step owed;
        owed.ids.push_back(id);
        owed.prefill_tokens = n;
        owed.layer_s = chunk_s / stages_per_step();
        owed.remaining_s = std::max(0.0, chunk_s - limits->partial_s);
        owed_ = std::move(owed);
        prefill_s += limits->partial_s;
        last_.boundaries_s.push_back(prefill_s);
        stop_next = false;
        done = true;
        break;
      }
      prefill_s += chunk_s;
      s.prefilled += n;
      tokens += n;
      last_.boundaries_s.push_back(prefill_s);
      if (s.prefilled < s.context()) continue;
      s.prefilling = false;
      finished = emit(s, out) || finished;
      // An interlude prefills every prompt it lists within the budget, as
      // the CPU engine's does in one step: ending it at the first would
      // leave the others behind the stopped step's rest.
      done = config_.prefill_ends_step && !interlude_;
    }
  }
  last_.admitted = admitted;
  out.prefill_tokens = clamp_u32(tokens);
  return prefill_s;
}

void sim_engine::charge_decodes() {
  // Tokens this step generated (a prefill's first one included), per tenant.
  for (const seq& s : running_)
    if (s.generated > s.generated_before) usage_.charge(s.tenant, s.generated - s.generated_before);
}

std::size_t sim_engine::token_bound(double prefill_s) const {
  // Every sequence emits at most one token per boundary, and the macro step
  // ends when the first one runs out (or at the horizon): reserve for that
  // many, so a step allocates its token vector once.
  std::uint64_t remaining = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t context = 0;
  for (const seq& s : running_) {
    remaining = std::min<std::uint64_t>(remaining, s.max_tokens - s.generated);
    context += s.context();
  }
  const auto batch = static_cast<std::uint32_t>(running_.size());
  const double first_step_s = cost_.decode_step_s(batch, context, last_.sharing);
  // Later decode steps read more context, so none is shorter than the first.
  // The bound only sizes a reservation: cap it so that no input overflows it.
  constexpr std::uint64_t steps_max = 1u << 16;
  const double fit = first_step_s > 0 ? std::floor(std::max(0.0, config_.horizon_s - prefill_s) / first_step_s) : 1e18;
  const std::uint64_t by_time = static_cast<std::uint64_t>(std::min(fit, static_cast<double>(steps_max))) + 1;
  const std::uint64_t steps = std::min({remaining, by_time, steps_max});
  return static_cast<std::size_t>(std::uint64_t{batch} * (steps + 1));
}

void sim_engine::decode(step_result& out, double prefill_s, std::uint32_t decode_limit, double partial_s) {
  // Every running sequence is prefilled now; the batch stays fixed until the
  // first one finishes, which ends the macro step.
  // Across tenants, sequences part way through their prefill sit out.
  std::uint32_t batch = 0;
  std::uint64_t context = 0;
  for (const seq& s : running_)
    if (!s.prefilling) {
      ++batch;
      context += s.context();
    }
  if (batch == 0) return;
  double elapsed_s = prefill_s;
  for (std::uint32_t k = 0; k < decode_limit; ++k) {
    const double step_s = cost_.decode_step_s(batch, context, last_.sharing);
    const bool must_progress = last_.boundaries_s.empty();  // a macro step ends at a boundary
    if (!must_progress && elapsed_s + step_s > config_.horizon_s) break;
    elapsed_s += step_s;
    bool finished = false;
    for (seq& s : running_)
      if (!s.prefilling) finished = emit(s, out) || finished;
    last_.boundaries_s.push_back(elapsed_s);
    last_.decode_read_s.push_back(cost_.decode_read_s(context));
    context += batch;
    if (finished) return;
  }
  if (partial_s <= 0) return;
  // layer_yield: the next decode step stops after partial_s, at a layer
  // boundary; its tokens are owed until the rest of it runs.
  const double step_s = cost_.decode_step_s(batch, context, last_.sharing);
  owed_step owed;
  for (const seq& s : running_)
    if (!s.prefilling) owed.ids.push_back(s.id);
  owed.layer_s = step_s / stages_per_step();
  owed.remaining_s = std::max(0.0, step_s - partial_s);
  owed_ = std::move(owed);
  last_.boundaries_s.push_back(elapsed_s + partial_s);
  last_.decode_read_s.push_back(cost_.decode_read_s(context));
}

bool sim_engine::emit(seq& s, step_result& out) {
  EXA_ASSERT(!s.done && s.generated < s.max_tokens);
  const model::token_id t = token_of(s.hash, cost_.model().vocab_size);
  if (std::find(s.stop_tokens.begin(), s.stop_tokens.end(), t) != s.stop_tokens.end()) {
    s.done = true;
    out.finished.push_back({s.id, finish_reason::stop, s.generated, s.cached_tokens});
    return true;
  }
  out.tokens.push_back({s.id, t, s.generated, std::nullopt});
  s.hash = extend(s.hash, t);
  ++s.generated;
  if (s.generated < s.max_tokens) return false;
  s.done = true;
  out.finished.push_back({s.id, finish_reason::length, s.generated, s.cached_tokens});
  return true;
}

void sim_engine::retire() {
  // Finished sequences leave the batch and free their KV, but are kept (in
  // admission order) until the next step in case this one is rolled back.
  auto keep = running_.begin();
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if (it->done) {
      kv_used_ -= it->kv_tokens();
      active_.erase(it->id);
      last_.finished.push_back(std::move(*it));
    } else {
      if (keep != it) *keep = std::move(*it);
      ++keep;
    }
  }
  running_.erase(keep, running_.end());
}

// ---- engine: truncation ----------------------------------------------------

std::optional<step_result> sim_engine::truncate_last_step(double elapsed_s) {
  if (std::isnan(elapsed_s)) return std::nullopt;
  if (last_was_remainder_) return cut_remainder(elapsed_s);
  if (last_.layer_cuttable && !last_.boundaries_s.empty())
    if (auto stopped = cut_at_layer(elapsed_s)) return stopped;
  if (!last_.valid) return std::nullopt;
  const std::vector<double>& b = last_.boundaries_s;
  EXA_ASSERT(!b.empty());
  if (!last_.fair && last_.has_prefill && elapsed_s < b.front() && contended())
    if (auto replanned = replan_fair(elapsed_s)) return replanned;
  const auto cut = static_cast<std::size_t>(std::lower_bound(b.begin(), b.end(), elapsed_s) - b.begin());
  if (cut + 1 >= b.size()) return std::nullopt;  // the first boundary at or after it is the end
  const double cut_s = b[cut];
  // The prefill part is one boundary (across tenants: one per chunk); every
  // decode step is one more.
  replay limits;
  limits.fair = last_.fair;
  limits.admitted = last_.admitted;
  limits.order = std::move(last_.prefill_order);
  limits.chunked = std::move(last_.prefill_chunked);
  const std::size_t prefill = last_.prefill_boundaries;
  limits.prefill_kept = std::min(cut + 1, prefill);
  limits.decode_kept = static_cast<std::uint32_t>(cut + 1 - limits.prefill_kept);
  step_result out = replay_last(limits);
  EXA_ASSERT_MSG(limits.fair || last_.admitted == limits.admitted, "the replay admits what the step admitted");
  EXA_ASSERT_MSG(std::abs(out.duration_s - cut_s) <= 1e-9 * cut_s, "the replay ends at the cut");
  return out;
}

step_result sim_engine::replay_last(const replay& limits) {
  // Undo the whole step, then replay it within `limits`: the replay admits
  // the same sequences (they are back at the head of the queue, later
  // arrivals behind them), runs under the same sharing, reports the same
  // pending finishes and emits the same tokens.
  const std::uint32_t sharing = last_.sharing;
  std::vector<finish_event> pending = std::move(last_.pending);
  rollback();
  begin_step(sharing);
  step_result out;
  out.finished = pending;
  last_.pending = std::move(pending);
  run_macro(out, &limits);
  return out;
}

std::optional<step_result> sim_engine::replan_fair(double elapsed_s) {
  // A request of a second tenant (or class) arrived while the engine, with
  // one tenant, prefilled first come and in one piece. An engine that chunks
  // its prefill (which, with one tenant, changes nothing but the number of
  // boundaries) lets it in at the next chunk boundary: replay the step as a
  // step across tenants -- the sequences waiting when it began, in fair
  // order, in chunks -- up to the first boundary at or after the arrival.
  // When that version of the step has no boundary at or after the arrival
  // within its prefill, or none before the step's end, the step stands as it
  // ran (replayed once more) and nullopt says so.
  const double ran_s = last_.boundaries_s.back();
  const std::uint64_t arrivals = last_.arrivals;
  const std::uint32_t admitted = last_.admitted;
  const std::uint32_t sharing = last_.sharing;
  const std::vector<finish_event> pending = std::move(last_.pending);
  const auto replay_as = [&](replay& limits) {
    rollback();
    begin_step(sharing);
    last_.arrivals = arrivals;
    // The first replay orders what waited when the step began (undone now).
    if (limits.fair && limits.order.empty()) limits.order = fair_order(arrivals);
    step_result out;
    out.finished = pending;
    last_.pending = pending;
    run_macro(out, &limits);
    return out;
  };
  replay limits;
  limits.fair = true;
  limits.prefill_kept = std::numeric_limits<std::size_t>::max();
  replay_as(limits);
  const std::vector<double>& b = last_.boundaries_s;
  const auto cut = static_cast<std::size_t>(std::lower_bound(b.begin(), b.end(), elapsed_s) - b.begin());
  if (cut >= last_.prefill_boundaries || b[cut] >= ran_s) {
    limits.fair = false;
    limits.admitted = admitted;
    limits.decode_kept = std::numeric_limits<std::uint32_t>::max();
    replay_as(limits);
    return std::nullopt;
  }
  limits.order = last_.prefill_order;
  limits.chunked = last_.prefill_chunked;
  limits.prefill_kept = cut + 1;
  const double cut_s = b[cut];
  step_result out = replay_as(limits);
  EXA_ASSERT_MSG(std::abs(out.duration_s - cut_s) <= 1e-9 * cut_s, "the replay ends at the cut");
  return out;
}

void sim_engine::rollback() {
  // Put the retired sequences back among the running ones, in admission
  // order, and every counter back to where the step found it.
  const auto retired_from = static_cast<std::ptrdiff_t>(running_.size());
  for (seq& s : last_.finished) {
    active_.insert(s.id);
    running_.push_back(std::move(s));
  }
  last_.finished.clear();
  std::inplace_merge(running_.begin(), running_.begin() + retired_from, running_.end(),
                     [](const seq& a, const seq& b) { return a.admit_order < b.admit_order; });
  for (seq& s : running_) {
    s.generated = s.generated_before;
    s.hash = s.hash_before;
    s.prefilling = s.prefilling_before;
    s.prefilled = s.prefilled_before;
    s.done = false;
  }
  // What the step admitted goes back to the head of the queue, in order.
  while (!running_.empty() && running_.back().admit_order >= last_.next_admit) {
    waiting_.push_front(std::move(running_.back()));
    running_.pop_back();
  }
  last_.cache_inserts.clear();  // the replay admits them again
  kv_used_ = last_.kv_used;
  next_admit_ = last_.next_admit;
  stats_ = last_.stats;
  usage_.restore(last_.usage);
  last_.valid = false;
}

// ---- engine: a decode step stopped at a layer boundary (layer_yield) --------

std::vector<sim_engine::member> sim_engine::members(const std::vector<seq_id>& ids) const {
  std::vector<member> out;
  for (const seq_id id : ids) {
    const auto match = [id](const seq& s) { return s.id == id; };
    if (auto it = std::find_if(running_.begin(), running_.end(), match); it != running_.end())
      out.emplace_back(it->tenant, it->priority);
    else if (auto f = std::find_if(last_.finished.begin(), last_.finished.end(), match); f != last_.finished.end())
      out.emplace_back(f->tenant, f->priority);
  }
  return out;
}

bool sim_engine::goes_before(const std::vector<member>& batch, tenant_usage::slot tenant,
                             request_priority priority) const {
  // As the CPU engine decides (batch_scheduler::arrival_preempts).
  return fair::goes_before(usage_, batch, [](const member& m) { return m; }, tenant, priority);
}

bool sim_engine::offered_goes_before(const std::vector<member>& batch) {
  std::vector<arrival_hint> offers;
  {
    const std::lock_guard lock(*offers_mu_);
    offers.swap(offers_);
  }
  if (running_.size() >= config_.max_running) return false;
  // An offer whose request is here already (submitted since) is not an
  // arrival any more: the schedule has it.
  return std::any_of(offers.begin(), offers.end(), [&](const arrival_hint& h) {
    return !(h.id != 0 && active_.contains(h.id)) &&
           goes_before(batch, usage_.intern(h.tenant, h.tenant_weight), h.priority);
  });
}

std::optional<step_result> sim_engine::cut_at_layer(double elapsed_s) {
  // The decode step, or across tenants the prefill chunk, in flight at
  // elapsed_s stops at its next layer boundary (its 2 n_layers stages, each
  // layer's attention and MLP, split its time evenly) when an offered
  // arrival goes before its batch (a chunk's: its one sequence); the step's
  // earlier chunks and decode steps stand. A one-tenant step prefills in one
  // piece: a second tenant's arrival re-plans it instead (replan_fair).
  const std::vector<double>& b = last_.boundaries_s;
  const auto cut = static_cast<std::size_t>(std::lower_bound(b.begin(), b.end(), elapsed_s) - b.begin());
  if (cut >= b.size()) return std::nullopt;  // past its end
  const bool in_prefill = cut < last_.prefill_boundaries;
  if (in_prefill && !last_.fair) return std::nullopt;
  const double start = cut == 0 ? 0.0 : b[cut - 1];
  // A short decode step runs whole where the engine modeled stops only long
  // ones, weighed as that engine weighs it: its reads at peak bandwidth.
  if (!in_prefill && config_.layer_yield_min_decode_s > 0) {
    const std::size_t step = cut - last_.prefill_boundaries;
    EXA_ASSERT_MSG(step < last_.decode_read_s.size(), "every decode boundary has its step's reads");
    if (last_.decode_read_s[step] < config_.layer_yield_min_decode_s) return std::nullopt;
  }
  const double layer_s = (b[cut] - start) / stages_per_step();
  const double layers =
      std::max(1.0, std::ceil((elapsed_s - start) / layer_s - 1e-9)) + config_.layer_yield_lag_stages;
  const double at = start + layers * layer_s;
  if (at >= b[cut] - 1e-12 * b[cut]) return std::nullopt;  // its end is the next boundary anyway
  std::vector<member> batch;
  if (in_prefill) {
    EXA_ASSERT_MSG(cut < last_.chunk_seq.size(), "every prefill boundary of a step across tenants ends a chunk");
    batch = members({last_.chunk_seq[cut]});
  } else {
    for (const seq& s : running_)
      if (!s.prefilling) batch.emplace_back(s.tenant, s.priority);
    for (const seq& s : last_.finished) batch.emplace_back(s.tenant, s.priority);
  }
  if (!offered_goes_before(batch)) return std::nullopt;

  replay limits;
  limits.fair = last_.fair;
  limits.admitted = last_.admitted;
  limits.order = last_.prefill_order;
  limits.chunked = last_.prefill_chunked;
  limits.prefill_kept = in_prefill ? cut : last_.prefill_boundaries;
  limits.decode_kept = in_prefill ? 0 : static_cast<std::uint32_t>(cut - last_.prefill_boundaries);
  limits.partial_s = at - start;
  limits.partial_prefill = in_prefill;
  step_result out = replay_last(limits);
  EXA_ASSERT_MSG(owed_.has_value() && std::abs(out.duration_s - at) <= 1e-9 * at, "the replay stops at the layer");
  ++stats_.yielded_steps;
  last_.valid = last_.layer_cuttable = false;  // it ends at its stop; the rest is owed
  return out;
}

bool sim_engine::run_interlude(step_result& out) {
  // The prompts the owed step stopped for, prefilled alone in fair order
  // within the token budget, their first tokens at its end (prefill_ends_step
  // does not end it at the first: the CPU engine's interlude is one step).
  // Nothing decodes.
  last_.boundaries_s.clear();
  last_.decode_read_s.clear();
  last_.prefill_order.clear();
  last_.prefill_chunked.clear();
  last_.chunk_seq.clear();
  last_.fair = true;
  interlude_ = true;
  bool finished = false;
  prefill_fair(out, nullptr, finished);
  interlude_ = false;
  last_.prefill_boundaries = last_.boundaries_s.size();
  last_.has_prefill = last_.prefill_boundaries > 0;
  if (last_.boundaries_s.empty()) return false;
  ++stats_.steps;
  close_step(out);
  last_.valid = last_.layer_cuttable = false;  // short, and not replayed
  return true;
}

bool sim_engine::waiting_goes_before(const std::vector<member>& batch, std::uint64_t since) const {
  // Only prompts submitted since the interlude began: it had the others.
  if (running_.size() >= config_.max_running) return false;
  return std::any_of(waiting_.begin(), waiting_.end(),
                     [&](const seq& s) { return s.arrival >= since && goes_before(batch, s.tenant, s.priority); });
}

void sim_engine::owed_time_only(double duration_s) {
  // A step of the owed one's time: one boundary at its end, no prefill, no
  // admission.
  last_.boundaries_s.assign(1, duration_s);
  last_.decode_read_s.clear();
  last_.prefill_order.clear();
  last_.prefill_chunked.clear();
  last_.chunk_seq.clear();
  last_.prefill_boundaries = 0;
  last_.has_prefill = false;
  last_.admitted = 0;
}

void sim_engine::run_first_stage(step_result& out) {
  // One stage of the owed step's rest, and it stops again: only time passes
  // (the step after next goes on; nothing of it is undone or replayed).
  owed_->remaining_s -= owed_->layer_s;
  owed_->interlude_ran = false;
  owed_time_only(owed_->layer_s);
  out.duration_s = owed_->layer_s;
  ++stats_.yielded_steps;
  last_.valid = last_.layer_cuttable = false;
}

void sim_engine::run_remainder(step_result& out) {
  // The rest of the owed decode step: its batch's tokens at its end. Of an
  // owed chunk: its prompt tokens, and the first token when it completes
  // the prompt (its usage was charged when it was planned).
  last_owed_ = *owed_;
  owed_.reset();
  owed_time_only(last_owed_.remaining_s);
  ++stats_.steps;
  for (seq& s : running_) {
    if (s.done || std::find(last_owed_.ids.begin(), last_owed_.ids.end(), s.id) == last_owed_.ids.end()) continue;
    if (last_owed_.prefill_tokens > 0) {
      EXA_ASSERT_MSG(s.prefilling && s.prefilled + last_owed_.prefill_tokens <= s.context(),
                     "an owed chunk is of a prompt part way through its prefill");
      s.prefilled += last_owed_.prefill_tokens;
      out.prefill_tokens += last_owed_.prefill_tokens;
      if (s.prefilled < s.context()) continue;
      s.prefilling = false;
    } else if (s.prefilling) {
      continue;
    }
    emit(s, out);
  }
  close_step(out);
  last_.valid = false;
  last_.layer_cuttable = config_.layer_yield;
  last_was_remainder_ = true;
}

std::optional<step_result> sim_engine::cut_remainder(double elapsed_s) {
  // The rest of an owed step stops again, a layer or more on, for a later
  // arrival: nothing of it happened but the time, and the rest is owed.
  if (!last_.layer_cuttable) return std::nullopt;
  const double layer_s = last_owed_.layer_s;
  const double at =
      (std::max(1.0, std::ceil(elapsed_s / layer_s - 1e-9)) + config_.layer_yield_lag_stages) * layer_s;
  if (at >= last_owed_.remaining_s - 1e-12 * last_owed_.remaining_s) return std::nullopt;
  if (!offered_goes_before(members(last_owed_.ids))) return std::nullopt;
  std::vector<finish_event> pending = std::move(last_.pending);
  rollback();
  last_was_remainder_ = false;
  owed_ = last_owed_;
  owed_->remaining_s -= at;
  owed_->interlude_ran = false;
  ++stats_.yielded_steps;
  step_result out;
  out.finished = pending;
  out.duration_s = at;
  // Final: a later arrival, before this stop, waits for it.
  last_.pending = std::move(pending);
  last_.boundaries_s.assign(1, at);
  last_.decode_read_s.clear();
  last_.valid = last_.layer_cuttable = false;
  return out;
}

void set_step_stop(sim_engine_config& c, sim_step_stop mode, std::uint32_t n_layers) noexcept {
  c.layer_yield = mode != sim_step_stop::none;
  const bool cuda = mode == sim_step_stop::long_steps;
  c.layer_yield_min_decode_s = cuda ? fair::cuda_stoppable_decode_s(2 * std::max<std::uint32_t>(n_layers, 1)) : 0;
  c.layer_yield_lag_stages = cuda ? 1 : 0;
}

const char* to_string(sim_step_stop mode) noexcept {
  switch (mode) {
    case sim_step_stop::none: return "none";
    case sim_step_stop::every_step: return "every_step";
    case sim_step_stop::long_steps: return "long_steps";
  }
  return "none";
}

}  // namespace exa::engine
