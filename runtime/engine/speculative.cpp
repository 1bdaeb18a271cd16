#include "engine/speculative.hpp"

#include <algorithm>
#include <cmath>
#include <new>
#include <string>

#include "common/assert.hpp"

namespace exa::engine {
namespace {

// The draft's KV blocks: host memory of its own, reserved once (committed by
// the OS as blocks are first written), carved into equal blocks.
class host_block_pool final : public block_pool {
 public:
  host_block_pool(std::size_t block_bytes, std::uint32_t blocks)
      : block_bytes_((block_bytes + 63) / 64 * 64),
        region_(static_cast<std::byte*>(::operator new(block_bytes_ * blocks, std::align_val_t{64}))),
        free_(blocks) {}
  ~host_block_pool() override { ::operator delete(region_, std::align_val_t{64}); }

  std::size_t block_bytes() const noexcept override { return block_bytes_; }
  std::uint32_t capacity_blocks() const noexcept override { return free_.capacity(); }
  std::uint32_t free_blocks() const noexcept override { return free_.free_count(); }
  std::optional<block_id> allocate() noexcept override { return free_.allocate(); }
  void release(block_id b) override { free_.release(b); }
  void* address(block_id b) noexcept override { return region_ + std::size_t{b} * block_bytes_; }
  bool host_accessible() const noexcept override { return true; }

 private:
  std::size_t block_bytes_;
  std::byte* region_;
  block_free_list free_;
};

// Stream tags of the speculative draws: independent of each other and of the
// plain sampler's stream (uniform_draw(seed, ·)).
constexpr std::uint64_t draft_stream = 0x5bd1e9955bd1e995ull;
constexpr std::uint64_t accept_stream = 0x27d4eb2f165667c5ull;
constexpr std::uint64_t residual_stream = 0x94d049bb133111ebull;

}  // namespace

bool is_greedy(const sampling_params& p) noexcept { return p.temperature == 0.0f || p.top_k == 1; }

double draft_draw(std::uint64_t seed, std::uint64_t index) noexcept {
  return uniform_draw(seed ^ draft_stream, index);
}
double accept_draw(std::uint64_t seed, std::uint64_t index) noexcept {
  return uniform_draw(seed ^ accept_stream, index);
}
double residual_draw(std::uint64_t seed, std::uint64_t index) noexcept {
  return uniform_draw(seed ^ residual_stream, index);
}

expected<void> check_draft(const model::llama_model& target, const model::llama_model& draft,
                           std::uint32_t draft_tokens) {
  if (draft_tokens < 1 || draft_tokens > max_draft_tokens)
    return make_error(errc::invalid_argument, "draft_tokens must be in [1, " + std::to_string(max_draft_tokens) +
                                                  "], got " + std::to_string(draft_tokens));
  const std::string names = "draft model " + draft.path() + " and target model " + target.path();
  const auto& tv = target.tokenizer();
  const auto& dv = draft.tokenizer();
  if (target.config().vocab_size != draft.config().vocab_size || tv.vocab_size() != dv.vocab_size())
    return make_error(errc::invalid_argument, names + " have different vocabularies (" +
                                                  std::to_string(draft.config().vocab_size) + " vs " +
                                                  std::to_string(target.config().vocab_size) +
                                                  " tokens): a draft must share its target's vocabulary");
  for (std::uint32_t i = 0; i < tv.vocab_size(); ++i) {
    const auto id = static_cast<model::token_id>(i);
    if (tv.token_text(id) != dv.token_text(id))
      return make_error(errc::invalid_argument, names + " have different vocabularies (token " +
                                                    std::to_string(i) +
                                                    " differs): a draft must share its target's vocabulary");
  }
  if (draft.config().context_length < target.config().context_length)
    return make_error(errc::invalid_argument, "draft model " + draft.path() + " has a context of " +
                                                  std::to_string(draft.config().context_length) +
                                                  " tokens, shorter than its target's " +
                                                  std::to_string(target.config().context_length));
  return {};
}

void sampling_distribution(const float* logits, std::size_t vocab, const sampling_params& p,
                           std::vector<float>& probs) {
  EXA_ASSERT(vocab > 0 && !is_greedy(p));
  // The candidate set, order and weights of sampler::sample, step by step.
  std::vector<std::pair<float, model::token_id>> cand;
  cand.reserve(vocab);
  for (std::size_t i = 0; i < vocab; ++i)
    if (!std::isnan(logits[i])) cand.emplace_back(logits[i], static_cast<model::token_id>(i));
  probs.assign(vocab, 0.0f);
  if (cand.empty()) {  // the sampler's argmax fallback: token 0 wins every comparison with NaN
    probs[0] = 1.0f;
    return;
  }
  const auto better = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::size_t keep = cand.size();
  if (p.top_k > 0 && p.top_k < keep) {
    keep = p.top_k;
    std::partial_sort(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(keep), cand.end(), better);
  } else if (p.top_p < 1.0f) {
    std::sort(cand.begin(), cand.end(), better);
  }
  cand.resize(keep);
  double max_logit = -INFINITY;
  for (const auto& c : cand) max_logit = std::max(max_logit, static_cast<double>(c.first));
  if (std::isinf(max_logit)) {  // as sample(): all of it on the first candidate holding the maximum
    probs[static_cast<std::size_t>(first_holding(cand, max_logit))] = 1.0f;
    return;
  }
  std::vector<double> w(keep);
  double total = 0.0;
  for (std::size_t i = 0; i < keep; ++i) {
    w[i] = std::exp((cand[i].first - max_logit) / p.temperature);
    total += w[i];
  }
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    std::size_t n = 0;
    while (n < keep) {
      cum += w[n++];
      if (cum >= p.top_p * total) break;
    }
    keep = n;
    total = cum;
  }
  for (std::size_t i = 0; i < keep; ++i)
    probs[static_cast<std::size_t>(cand[i].second)] = static_cast<float>(w[i] / total);
}

model::token_id pick(std::span<const float> w, double u) noexcept {
  double total = 0.0;
  std::size_t last = 0;
  for (std::size_t i = 0; i < w.size(); ++i)
    if (w[i] > 0.0f) {
      total += w[i];
      last = i;
    }
  const double target = u * total;
  double cum = 0.0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    if (w[i] <= 0.0f) continue;
    cum += w[i];
    if (target < cum) return static_cast<model::token_id>(i);
  }
  return static_cast<model::token_id>(last);
}

model::token_id speculative_choice(std::span<const float> p_target, std::span<const float> p_draft,
                                   model::token_id drafted, double u_accept, double u_residual,
                                   bool& accepted) {
  EXA_ASSERT(p_target.size() == p_draft.size());
  const auto x = static_cast<std::size_t>(drafted);
  EXA_ASSERT(x < p_target.size());
  const double pt = p_target[x];
  const double pd = p_draft[x];
  EXA_ASSERT_MSG(pd > 0.0, "a draft token the draft's distribution cannot produce");
  accepted = u_accept * pd < pt;  // u < p_t / p_d, without dividing
  if (accepted) return drafted;
  // The residual max(0, p_t - p_d). It is empty only when p_t <= p_d
  // everywhere, i.e. p_t == p_d, where every draft token is accepted; guard
  // against rounding anyway by falling back to p_t.
  std::vector<float> residual(p_target.size());
  bool any = false;
  for (std::size_t i = 0; i < residual.size(); ++i) {
    residual[i] = std::max(0.0f, p_target[i] - p_draft[i]);
    any = any || residual[i] > 0.0f;
  }
  return any ? pick(residual, u_residual) : pick(p_target, u_residual);
}

// One step's speculation for one sequence.
struct speculator::window {
  bool active = false;    // verify() decides this sequence's tokens this step
  bool sampled = false;   // the rejection rule (else greedy)
  std::uint32_t k = 0;    // draft tokens the target verifies
  std::uint32_t last_pos = 0;   // position of the sequence's last token (n)
  std::uint32_t generated = 0;  // generated-token index of position n + 1
  std::vector<model::token_id> proposals;  // d_1..d_k, at positions n+1..n+k
  // Sampled: the draft's pick and its distribution at positions n+1, n+2, ...
  // (one more than k once the position after k accepts needs one).
  std::vector<model::token_id> drafted;
  std::vector<float> p_draft;  // rows × vocab
  std::vector<model::token_id> decided;
  bool needs_bonus = false;  // sampled, all k accepted: the draft's p_d at n+k+1 first
};

struct speculator::draft_seq {
  std::uint32_t computed = 0;  // positions whose draft K/V are in the draft cache
  window w;
};

speculator::speculator(std::shared_ptr<const model::llama_model> draft, std::uint32_t draft_tokens,
                       std::uint32_t block_tokens, std::uint32_t capacity_blocks, thread_pool& threads,
                       resident_options resident)
    : draft_(std::move(draft)), draft_tokens_(draft_tokens), vocab_(draft_->config().vocab_size) {
  EXA_ASSERT(draft_tokens_ >= 1 && draft_tokens_ <= max_draft_tokens && capacity_blocks > 0);
  const kv_layout layout{draft_->config().n_layers, draft_->config().kv_dim(), block_tokens};
  pool_ = std::make_unique<host_block_pool>(layout.block_bytes(), capacity_blocks);
  cache_ = std::make_unique<kv_cache>(*pool_, layout);
  forward_ = std::make_unique<llama_forward>(draft_->config(), draft_->weights(), *cache_, threads, resident);
}

speculator::~speculator() = default;

const kv_cache& speculator::cache() const noexcept { return *cache_; }

resident_memory speculator::weights_memory() const noexcept { return forward_->weights_memory(); }

void speculator::forget(seq_id id) {
  cache_->release(id);
  seqs_.erase(id);
}

void speculator::drop_stale(batch_scheduler& scheduler) {
  // Finished, cancelled and preempted sequences give their draft blocks back
  // before anything is reserved, so the running ones never hold more than
  // their target blocks' worth.
  for (auto it = seqs_.begin(); it != seqs_.end();) {
    const sequence* s = scheduler.find(it->first);
    if (s == nullptr || !s->is_running) {
      cache_->release(it->first);
      it = seqs_.erase(it);
    } else {
      it->second.w = window{};
      ++it;
    }
  }
}

std::uint32_t speculator::reserve_window(sequence& seq, kv_cache& target) {
  const std::uint32_t left = seq.request.max_tokens - seq.generated();  // >= 1 while running
  // The window emits at most k + 1 tokens: never past max_tokens, so the
  // positions written stay inside prompt + max_tokens (checked at submit).
  std::uint32_t k = std::min(draft_tokens_, left - 1);
  while (k > 0 && !target.reserve(seq.request.id, seq.computed + 1 + k, seq.computed)) --k;
  // Rejected proposals' K/V is written there: never into a shared block.
  target.assert_writable(seq.request.id, seq.computed, seq.computed + 1 + k);
  return k;
}

std::span<const model::token_id> speculator::proposals(const sequence& seq) const {
  const auto it = seqs_.find(seq.request.id);
  if (it == seqs_.end() || !it->second.w.active) return {};
  return it->second.w.proposals;
}

bool speculator::speculates(const sequence& seq) const {
  const auto it = seqs_.find(seq.request.id);
  return it != seqs_.end() && it->second.w.active;
}

std::span<const model::token_id> speculator::decided(const sequence& seq) const {
  const auto it = seqs_.find(seq.request.id);
  EXA_ASSERT_MSG(it != seqs_.end() && it->second.w.active, "decided() of a sequence that did not speculate");
  return it->second.w.decided;
}

void speculator::draft_from_row(const sequence& seq, window& w, const float* logits) {
  const auto& p = seq.request.sampling;
  model::token_id token = 0;
  if (!w.sampled) {
    token = sampler_.sample(logits, vocab_, p, 0);  // greedy: the argmax, as the target's
  } else {
    const std::size_t row = w.drafted.size();
    w.p_draft.resize((row + 1) * vocab_);
    std::vector<float> probs;
    sampling_distribution(logits, vocab_, p, probs);
    std::copy(probs.begin(), probs.end(), w.p_draft.begin() + static_cast<std::ptrdiff_t>(row * vocab_));
    token = pick(probs, draft_draw(p.seed, std::uint64_t{w.generated} + row));
    w.drafted.push_back(token);
  }
  if (w.proposals.size() < w.k) w.proposals.push_back(token);
}

void speculator::propose(const std::vector<scheduled_chunk>& plan, batch_scheduler& scheduler,
                         kv_cache& target) {
  drop_stale(scheduler);
  first_step(plan, target);
  next_steps(plan);
}

void speculator::first_step(const std::vector<scheduled_chunk>& plan, kv_cache& target) {
  // Every planned chunk's tokens the draft has not computed yet, with logits
  // at the sequence's last token where the draft proposes (or, sampled, where
  // the rule needs its distribution).
  forward_batch batch;
  std::vector<sequence*> with_logits;
  for (const scheduled_chunk& c : plan) {
    sequence& seq = *c.seq;
    draft_seq& st = seqs_[seq.request.id];
    window& w = st.w;
    const std::uint32_t end = seq.computed + c.n_tokens;
    const bool last = end == seq.tokens.size();
    if (!last && st.computed >= end) continue;  // the draft is ahead of a target recomputing
    std::uint32_t k = 0;
    if (last) {
      w.sampled = !is_greedy(seq.request.sampling);
      if (c.n_tokens == 1) k = reserve_window(seq, target);
    }
    // Draft positions up to n + k (n + k itself only after k accepts).
    if (!cache_->reserve(seq.request.id, end + k)) continue;  // no speculation this step (header)
    // The draft's KV never covers the sequence's last token before the step.
    EXA_ASSERT(st.computed < end);
    const bool logits = last && (w.sampled || k > 0);
    const auto index = static_cast<std::uint32_t>(batch.tables.size());
    batch.tables.push_back(&cache_->table(seq.request.id));
    for (std::uint32_t p = st.computed; p < end; ++p)
      batch.tokens.push_back({seq.tokens[p], p, index, logits && p + 1 == end});
    st.computed = end;
    if (last) {
      w.active = true;
      w.k = k;
      w.last_pos = end - 1;
      w.generated = seq.generated();
    }
    if (logits) with_logits.push_back(&seq);
  }
  if (batch.tokens.empty()) return;
  forward_->run(batch, logits_);
  for (std::size_t i = 0; i < with_logits.size(); ++i)
    draft_from_row(*with_logits[i], seqs_.at(with_logits[i]->request.id).w, logits_.data() + i * vocab_);
}

void speculator::next_steps(const std::vector<scheduled_chunk>& plan) {
  // Draft step s feeds d_s (position n + s) of every window still short of k.
  for (std::uint32_t s = 1; s < draft_tokens_; ++s) {
    forward_batch batch;
    std::vector<sequence*> with_logits;
    for (const scheduled_chunk& c : plan) {
      draft_seq& st = seqs_.at(c.seq->request.id);
      window& w = st.w;
      if (!w.active || w.k <= s) continue;
      EXA_ASSERT(w.proposals.size() == s);
      const std::uint32_t pos = w.last_pos + s;
      EXA_ASSERT(st.computed == pos);
      batch.tokens.push_back({w.proposals.back(), pos, static_cast<std::uint32_t>(batch.tables.size()), true});
      batch.tables.push_back(&cache_->table(c.seq->request.id));
      st.computed = pos + 1;
      with_logits.push_back(c.seq);
    }
    if (batch.tokens.empty()) return;
    forward_->run(batch, logits_);
    for (std::size_t i = 0; i < with_logits.size(); ++i)
      draft_from_row(*with_logits[i], seqs_.at(with_logits[i]->request.id).w, logits_.data() + i * vocab_);
  }
}

model::token_id speculator::decide_at(const sequence& seq, window& w, std::uint32_t i, const float* target_row,
                                      bool& accepted) {
  const auto& p = seq.request.sampling;
  if (!w.sampled) {
    const model::token_id t = sampler_.sample(target_row, vocab_, p, 0);
    accepted = i < w.k && t == w.proposals[i];
    return t;
  }
  EXA_ASSERT(i < w.drafted.size());
  sampling_distribution(target_row, vocab_, p, p_target_);
  const std::uint64_t g = std::uint64_t{w.generated} + i;
  const std::span<const float> p_draft(w.p_draft.data() + std::size_t{i} * vocab_, vocab_);
  return speculative_choice(p_target_, p_draft, w.drafted[i], accept_draw(p.seed, g), residual_draw(p.seed, g),
                            accepted);
}

void speculator::verify(const std::vector<std::pair<sequence*, const float*>>& rows) {
  std::vector<std::pair<sequence*, const float*>> bonus;
  for (const auto& [seq, target_rows] : rows) {
    const auto it = seqs_.find(seq->request.id);
    if (it == seqs_.end() || !it->second.w.active) continue;
    draft_seq& st = it->second;
    window& w = st.w;
    EXA_ASSERT(w.decided.empty() && w.proposals.size() == w.k);
    std::uint32_t accepted = 0;
    for (; accepted < w.k; ++accepted) {
      bool ok = false;
      w.decided.push_back(decide_at(*seq, w, accepted, target_rows + std::size_t{accepted} * vocab_, ok));
      if (!ok) break;
    }
    stats_.proposed += w.k;
    stats_.accepted += accepted;
    // Draft KV stays valid up to the last accepted token.
    st.computed = std::min(st.computed, w.last_pos + 1 + accepted);
    if (accepted < w.k) {
      ++stats_.rejected;
      continue;
    }
    if (!w.sampled || w.drafted.size() > w.k) {
      bool ok = false;
      w.decided.push_back(decide_at(*seq, w, w.k, target_rows + std::size_t{w.k} * vocab_, ok));
    } else {
      bonus.emplace_back(seq, target_rows);
    }
  }
  if (!bonus.empty()) run_bonus(bonus);
}

void speculator::run_bonus(const std::vector<std::pair<sequence*, const float*>>& rows) {
  // Sampled windows whose k tokens were all accepted: the draft computes d_k
  // to give its distribution at n + k + 1, which the rule needs there.
  forward_batch batch;
  for (const auto& [seq, target_rows] : rows) {
    draft_seq& st = seqs_.at(seq->request.id);
    const window& w = st.w;
    const std::uint32_t pos = w.last_pos + w.k;
    EXA_ASSERT(w.k > 0 && st.computed == pos);
    batch.tokens.push_back({w.proposals.back(), pos, static_cast<std::uint32_t>(batch.tables.size()), true});
    batch.tables.push_back(&cache_->table(seq->request.id));
    st.computed = pos + 1;
  }
  forward_->run(batch, logits_);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    sequence& seq = *rows[i].first;
    window& w = seqs_.at(seq.request.id).w;
    draft_from_row(seq, w, logits_.data() + i * vocab_);
    bool ok = false;
    w.decided.push_back(decide_at(seq, w, w.k, rows[i].second + std::size_t{w.k} * vocab_, ok));
  }
}

}  // namespace exa::engine
