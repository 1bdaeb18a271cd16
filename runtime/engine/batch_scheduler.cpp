#include "engine/batch_scheduler.hpp"

#include <algorithm>
#include <optional>

#include "common/assert.hpp"
#include "engine/fair_stop.hpp"

namespace exa::engine {

namespace {

// Across tenants, whether `seq`'s tenant is over its share beside the
// lightest tenant with work (its prefill per step is capped).
bool capped(const tenant_usage& usage, const std::optional<tenant_usage::slot>& lightest, const sequence& seq) {
  return lightest && usage.over_share(seq.tenant, *lightest);
}

// A planned step's blocks checked and its tokens charged to their tenants.
void commit(const std::vector<scheduled_chunk>& plan, const kv_cache& cache, tenant_usage& usage) {
  for (const scheduled_chunk& c : plan) {
    cache.assert_writable(c.seq->request.id, c.seq->computed, c.seq->computed + c.n_tokens);
    usage.charge(c.seq->tenant, c.n_tokens);
  }
}

}  // namespace

batch_scheduler::batch_scheduler(scheduler_config config, kv_cache& cache)
    : config_(config), cache_(cache), usage_(config.usage) {
  EXA_ASSERT(config_.max_batch_tokens > 0 && config_.max_running > 0 && config_.prefill_chunk > 0);
}

void batch_scheduler::enqueue(std::unique_ptr<sequence> seq) {
  EXA_ASSERT(seq && !seq->is_running && seq->computed == 0);
  seq->tenant = usage_.intern(seq->request.tenant, seq->request.tenant_weight);
  seq->arrival = next_arrival_++;
  waiting_.push_back(std::move(seq));
}

sequence* batch_scheduler::find(seq_id id) {
  for (auto& s : running_)
    if (s->request.id == id) return s.get();
  for (auto& s : waiting_)
    if (s->request.id == id) return s.get();
  return nullptr;
}

bool batch_scheduler::remove(seq_id id) {
  cache_.release(id);
  const auto match = [id](const auto& s) { return s->request.id == id; };
  if (auto it = std::find_if(running_.begin(), running_.end(), match); it != running_.end()) {
    running_.erase(it);
    return true;
  }
  if (auto it = std::find_if(waiting_.begin(), waiting_.end(), match); it != waiting_.end()) {
    waiting_.erase(it);
    return true;
  }
  return false;
}

void batch_scheduler::finish(seq_id id) {
  const bool found = remove(id);
  EXA_ASSERT_MSG(found, "finish of an unknown sequence");
}

sequence* batch_scheduler::newest_after(const sequence& seq) {
  sequence* newest = nullptr;
  for (auto& s : running_)
    if (s->admit_order > seq.admit_order && (!newest || s->admit_order > newest->admit_order))
      newest = s.get();
  return newest;
}

void batch_scheduler::preempt(sequence& victim, std::vector<scheduled_chunk>& plan,
                              std::uint32_t& budget) {
  // A victim already planned this step gives its tokens back.
  for (auto it = plan.begin(); it != plan.end(); ++it)
    if (it->seq == &victim) {
      budget += it->n_tokens;
      plan.erase(it);
      break;
    }
  cache_.release(victim.request.id);
  victim.computed = 0;
  victim.is_running = false;
  auto it = std::find_if(running_.begin(), running_.end(),
                         [&](const auto& s) { return s.get() == &victim; });
  EXA_ASSERT(it != running_.end());
  // Front of the queue: preempted work resumes before new arrivals.
  waiting_.push_front(std::move(*it));
  running_.erase(it);
}

bool batch_scheduler::grow(std::vector<scheduled_chunk>& plan, sequence& seq, std::uint32_t n,
                           std::uint32_t& budget, std::uint32_t& preempted) {
  while (!cache_.reserve(seq.request.id, seq.computed + n, seq.computed)) {
    sequence* victim = newest_after(seq);
    if (victim == nullptr) {
      // `seq` is the newest. The oldest sequence always fits (the engine
      // refuses requests larger than the cache), so it never gets here alone.
      EXA_ASSERT_MSG(running_.front().get() != &seq, "oldest sequence cannot fit the KV cache");
      preempt(seq, plan, budget);
      ++preempted;
      return false;
    }
    preempt(*victim, plan, budget);
    ++preempted;
  }
  plan.push_back({&seq, n});
  budget -= n;
  return true;
}

void batch_scheduler::attach_cached(sequence& seq) {
  EXA_ASSERT(seq.computed == 0);
  const auto attached = cache_.attach_prefix(seq.request.id, seq.tokens);
  // The last token is computed again even when cached: its logits are needed.
  seq.computed = std::min<std::uint32_t>(attached, static_cast<std::uint32_t>(seq.tokens.size()) - 1);
}

void batch_scheduler::admit(std::vector<scheduled_chunk>& plan, std::uint32_t& budget, bool fair,
                            const std::vector<scheduled_chunk>* only_before, const sequence* favoured) {
  // Across tenants, sequences of a tenant over its share that would take
  // the running set past fair_context_tokens wait; lighter ones may go. An
  // interlude admits only prompts that go before the suspended step's; a
  // step with a favoured prompt, none that yields to it.
  std::vector<const sequence*> over_budget;
  const auto eligible = [&](const sequence& s) {
    return std::find(over_budget.begin(), over_budget.end(), &s) == over_budget.end() &&
           (only_before == nullptr || goes_before(*only_before, s.tenant, s.request.priority)) &&
           (favoured == nullptr || !yields_to(s, *favoured));
  };
  while (!waiting_.empty() && running_.size() < config_.max_running && budget > 0) {
    // First come, or across tenants the best in fair order (preempted work
    // is at the front, so it still goes first among equals).
    std::optional<std::size_t> best;
    for (std::size_t i = 0; i < waiting_.size() && (fair || !best); ++i)
      if (eligible(*waiting_[i]) &&
          (!best || key(*waiting_[i], waiting_[i]->arrival) < key(*waiting_[*best], waiting_[*best]->arrival)))
        best = i;
    if (!best) break;
    const std::size_t pick = *best;
    sequence& seq = *waiting_[pick];
    if (fair && (!within_context_budget(seq) || prefill_allowance(seq, 1) == 0)) {
      over_budget.push_back(&seq);
      continue;
    }
    attach_cached(seq);
    // Looked up once, at first admission, as the hit is counted (before
    // reserve() changes the table).
    const std::uint32_t evicted_run = seq.was_admitted ? 0 : cache_.evicted_run_tokens(seq.request.id, seq.tokens);
    const std::uint32_t n = prefill_allowance(seq, std::min({seq.pending(), config_.prefill_chunk, budget}));
    // Keep one free block per running sequence so admitting new work does
    // not immediately force preemptions when the others grow.
    const std::uint32_t need = cache_.blocks_needed(seq.request.id, seq.computed + n, seq.computed);
    if (need + running_.size() > cache_.free_blocks()) {
      cache_.release(seq.request.id);  // the cached blocks it attached
      seq.computed = 0;
      break;
    }
    const bool ok = cache_.reserve(seq.request.id, seq.computed + n, seq.computed);
    EXA_ASSERT(ok);
    if (!seq.was_admitted) {
      seq.was_admitted = true;
      seq.cached_tokens = std::min(seq.computed, seq.prompt_len);
      prefix_lookup_tokens_ += cache_.prefix_cache_enabled() ? seq.tokens.size() : 0;
      prefix_hit_tokens_ += seq.computed;
      // Up to the last token, as the hit is counted (it is always computed,
      // for its logits): what a larger cache would have served too.
      const auto last = static_cast<std::uint32_t>(seq.tokens.size()) - 1;
      const std::uint32_t reach = std::min(seq.computed + evicted_run, last);
      prefix_evicted_miss_tokens_ += reach > seq.computed ? reach - seq.computed : 0;
    }
    seq.is_running = true;
    seq.admit_order = next_admit_++;
    running_.push_back(std::move(waiting_[pick]));
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(pick));
    plan.push_back({&seq, n});
    budget -= n;
    if (capped(usage_, lightest_, seq)) heavy_prefill_left_ -= n;
  }
}

std::optional<tenant_usage::slot> batch_scheduler::lightest_with_work() const {
  std::optional<tenant_usage::slot> lightest;
  const auto consider = [&](const sequence& s) {
    if (!lightest || usage_.usage(s.tenant) < usage_.usage(*lightest)) lightest = s.tenant;
  };
  for (const auto& s : waiting_) consider(*s);
  for (const auto& s : running_) consider(*s);
  return lightest;
}

std::uint32_t batch_scheduler::prefill_allowance(const sequence& seq, std::uint32_t n) const {
  if (!capped(usage_, lightest_, seq)) return n;
  return std::min(n, heavy_prefill_left_);
}

std::vector<scheduled_chunk> batch_scheduler::plan(std::uint32_t& preempted) {
  std::vector<scheduled_chunk> plan;
  std::uint32_t budget = config_.max_batch_tokens;
  preempted = 0;
  usage_.adopt_weights();
  // Snapshot: preemption moves sequences out of running_ while we iterate.
  std::vector<sequence*> order;
  for (auto& s : running_) order.push_back(s.get());

  // Across tenants, a light tenant's prompt may make heavy tenants' decodes
  // sit out this step (bounded: max_held_steps in a row).
  const bool fair = contended();
  lightest_ = fair && config_.fair_prefill_tokens > 0 ? lightest_with_work() : std::nullopt;
  heavy_prefill_left_ = config_.fair_prefill_tokens;
  const sequence* favoured = fair && held_steps_ < config_.max_held_steps ? favoured_prefill() : nullptr;
  held_decodes_ = 0;
  // Decoding sequences first (one token each): a long prompt never stalls them.
  for (sequence* s : order) {
    if (budget == 0 || !s->is_running || s->pending() != 1) continue;
    if (favoured != nullptr && yields_to(*s, *favoured)) {
      ++held_decodes_;
      continue;
    }
    grow(plan, *s, 1, budget, preempted);
  }
  // Then prefill chunks, oldest first (across tenants: in fair order). The
  // prompts of tenants that yield to the favoured one sit out with their
  // decodes, so its step stays short.
  std::uint32_t held_prefills = 0;
  if (fair)
    std::stable_sort(order.begin(), order.end(),
                     [&](const sequence* a, const sequence* b) { return key(*a, a->admit_order) < key(*b, b->admit_order); });
  for (sequence* s : order) {
    if (budget == 0) break;
    if (!s->is_running || s->pending() <= 1) continue;
    const bool planned = std::any_of(plan.begin(), plan.end(), [&](auto& c) { return c.seq == s; });
    if (planned) continue;
    if (favoured != nullptr && yields_to(*s, *favoured)) {
      ++held_prefills;
      continue;
    }
    const std::uint32_t n = prefill_allowance(*s, std::min({s->pending(), config_.prefill_chunk, budget}));
    if (n == 0) continue;
    const bool is_capped = capped(usage_, lightest_, *s);
    if (grow(plan, *s, n, budget, preempted) && is_capped) heavy_prefill_left_ -= n;
  }
  admit(plan, budget, fair, nullptr, favoured);
  const bool held_admissions =
      favoured != nullptr && std::any_of(waiting_.begin(), waiting_.end(), [&](const auto& s) {
        return s.get() != favoured && yields_to(*s, *favoured);
      });
  held_steps_ = held_decodes_ + held_prefills > 0 || held_admissions ? held_steps_ + 1 : 0;
  commit(plan, cache_, usage_);
  return plan;
}

void batch_scheduler::refund(const std::vector<scheduled_chunk>& plan, const sequence* kept,
                             std::uint64_t charged_at) {
  for (const scheduled_chunk& c : plan)
    if (c.seq != kept) usage_.refund(c.seq->tenant, c.n_tokens, charged_at);
}

bool batch_scheduler::arrival_preempts(const std::vector<scheduled_chunk>& planned, std::string_view tenant,
                                       double weight, request_priority priority) {
  if (running_.size() >= config_.max_running) return false;
  return goes_before(planned, usage_.intern(tenant, weight), priority);
}

bool batch_scheduler::waiting_preempts(const std::vector<scheduled_chunk>& planned, std::uint64_t since) const {
  if (running_.size() >= config_.max_running) return false;
  return std::any_of(waiting_.begin(), waiting_.end(), [&](const auto& s) {
    return s->arrival >= since && !s->was_admitted && goes_before(planned, s->tenant, s->request.priority);
  });
}

bool batch_scheduler::goes_before(const std::vector<scheduled_chunk>& planned, tenant_usage::slot tenant,
                                  request_priority priority) const {
  const auto member_of = [](const scheduled_chunk& c) { return std::pair{c.seq->tenant, c.seq->request.priority}; };
  return fair::goes_before(usage_, planned, member_of, tenant, priority);
}

std::vector<scheduled_chunk> batch_scheduler::plan_interlude(const std::vector<scheduled_chunk>& suspended) {
  std::vector<scheduled_chunk> plan;
  std::uint32_t budget = config_.max_batch_tokens;
  usage_.adopt_weights();
  held_decodes_ = 0;
  lightest_ = std::nullopt;  // it admits only prompts lighter than the stopped step's
  admit(plan, budget, true, &suspended);
  commit(plan, cache_, usage_);
  return plan;
}

bool batch_scheduler::contended() const {
  return tenants_contended(usage_, [&](auto&& differs) {
    for (const auto& s : waiting_)
      if (differs(s->tenant, s->request.priority)) return true;
    for (const auto& s : running_)
      if (differs(s->tenant, s->request.priority)) return true;
    return false;
  });
}

fair_key batch_scheduler::key(const sequence& seq, std::uint64_t order) const {
  return {seq.request.priority, usage_.usage(seq.tenant), order};
}

const sequence* batch_scheduler::favoured_prefill() const {
  // The prompt fair order serves first: one being prefilled, or a waiting
  // one when the running set has room for it.
  const sequence* best = nullptr;
  fair_key best_key;
  const auto consider = [&](const sequence& s, std::uint64_t order) {
    const fair_key k = key(s, order);
    if (best == nullptr || k < best_key) {
      best = &s;
      best_key = k;
    }
  };
  for (const auto& s : running_)
    if (s->pending() > 1) consider(*s, s->arrival);
  if (running_.size() < config_.max_running)
    for (const auto& s : waiting_) consider(*s, s->arrival);
  return best;
}

bool batch_scheduler::within_context_budget(const sequence& candidate) const {
  if (config_.fair_context_tokens == 0) return true;
  // Over its share beside the lightest tenant with work here.
  const auto lightest = lightest_with_work();
  if (!usage_.over_share(candidate.tenant, *lightest)) return true;
  const auto reserved = [](const sequence& s) { return std::uint64_t{s.prompt_len} + s.request.max_tokens; };
  std::uint32_t mine = 0;
  std::uint64_t context = reserved(candidate);
  for (const auto& s : running_) {
    mine += s->tenant == candidate.tenant ? 1 : 0;
    context += reserved(*s);
  }
  return over_share_admits(mine, static_cast<double>(context), static_cast<double>(config_.fair_context_tokens));
}

bool batch_scheduler::yields_to(const sequence& decoding, const sequence& favoured) const {
  return yields_to(decoding, favoured.tenant, favoured.request.priority);
}

bool batch_scheduler::yields_to(const sequence& decoding, tenant_usage::slot tenant, request_priority priority) const {
  return fair::yields_to(usage_, decoding.tenant, decoding.request.priority, tenant, priority);
}

}  // namespace exa::engine
