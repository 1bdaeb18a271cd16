#include "engine/cpu_engine.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "common/assert.hpp"

namespace exa::engine {

std::string_view to_string(finish_reason r) noexcept {
  switch (r) {
    case finish_reason::stop: return "stop";
    case finish_reason::length: return "length";
    case finish_reason::cancelled: return "cancelled";
    case finish_reason::nonfinite_logits: return "nonfinite_logits";
  }
  return "unknown";
}

std::string nonfinite_logits_message(std::uint32_t generated) {
  return "the model produced no finite logit for generated token " + std::to_string(generated) +
         " (NaN or infinite values: its weights or activations overflow, or its device faulted); generation "
         "stopped there";
}

std::size_t cpu_engine::kv_block_bytes(const model::llama_config& c, std::uint32_t block_tokens) {
  return kv_layout{c.n_layers, c.kv_dim(), block_tokens}.block_bytes();
}

cpu_engine::cpu_engine(std::shared_ptr<const model::llama_model> model, block_pool& pool,
                       thread_pool& threads, cpu_engine_config config)
    : model_(std::move(model)),
      config_(config),
      cache_(pool, kv_layout{model_->config().n_layers, model_->config().kv_dim(), config.kv_block_tokens},
             config.kv_max_blocks, config.prefix_cache, config.kv_block_copy),
      scheduler_(config.scheduler, cache_),
      forward_(std::make_unique<llama_forward>(model_->config(), model_->weights(), cache_, threads, config.weights)) {
  if (config_.draft) {  // speculative decoding (speculative.hpp)
    EXA_ASSERT_MSG(check_draft(*model_, *config_.draft, config_.draft_tokens).has_value(),
                   "a draft model that check_draft() refuses");
    spec_ = std::make_unique<speculator>(config_.draft, config_.draft_tokens, config_.kv_block_tokens,
                                         cache_.capacity_tokens() / config_.kv_block_tokens, threads, config_.weights);
  }
}

cpu_engine::cpu_engine(std::shared_ptr<const model::llama_model> model, block_pool& pool, std::uint32_t kv_dim,
                       std::unique_ptr<forward_executor> forward, cpu_engine_config config)
    : model_(std::move(model)),
      config_(config),
      cache_(pool, kv_layout{model_->config().n_layers, kv_dim, config.kv_block_tokens}, config.kv_max_blocks,
             config.prefix_cache, config.kv_block_copy),
      scheduler_(config.scheduler, cache_),
      forward_(std::move(forward)) {
  EXA_ASSERT(forward_ != nullptr);
  EXA_ASSERT_MSG(!config_.draft, "speculative decoding needs the engine's own forward pass");
}

expected<void> cpu_engine::check(const generation_request& r) const {
  const auto& c = model_->config();
  if (r.prompt.empty())
    return make_error(errc::invalid_argument, "prompt is empty: give at least one token");
  const std::uint64_t total = r.prompt.size() + std::uint64_t{r.max_tokens};
  if (total > c.context_length)
    return make_error(errc::invalid_argument,
                      "prompt (" + std::to_string(r.prompt.size()) + " tokens) + max_tokens (" +
                          std::to_string(r.max_tokens) + ") exceeds the model's context length " +
                          std::to_string(c.context_length));
  if (total > cache_.capacity_tokens())
    return make_error(errc::invalid_argument,
                      "prompt + max_tokens (" + std::to_string(total) +
                          " tokens) exceeds this replica's KV cache capacity of " +
                          std::to_string(cache_.capacity_tokens()) + " tokens");
  if (r.resume_tokens.size() > r.max_tokens)
    return make_error(errc::invalid_argument, "more resume tokens than max_tokens");
  const auto in_vocab = [&](model::token_id t) { return t >= 0 && static_cast<std::uint32_t>(t) < c.vocab_size; };
  for (const auto* list : {&r.prompt, &r.resume_tokens})
    for (std::size_t i = 0; i < list->size(); ++i)
      if (!in_vocab((*list)[i]))
        return make_error(errc::invalid_argument,
                          "token id " + std::to_string((*list)[i]) + " at index " + std::to_string(i) +
                              " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  if (auto ok = validate(r.sampling); !ok) return ok;
  if (auto ok = check_tenant_weight(r.tenant_weight); !ok) return ok;
  if (r.top_logprobs > max_top_logprobs)
    return make_error(errc::invalid_argument, "top_logprobs must be at most " + std::to_string(max_top_logprobs) +
                                                  ", got " + std::to_string(r.top_logprobs));
  return {};
}

expected<void> cpu_engine::submit(generation_request request) {
  if (fault_) return make_error(errc::unavailable, "engine failed: " + *fault_);
  if (auto ok = check(request); !ok) return ok;
  if (scheduler_.find(request.id) != nullptr)
    return make_error(errc::invalid_argument, "request id " + std::to_string(request.id) + " is already active");
  if (scheduler_.waiting() >= config_.scheduler.max_waiting)
    return make_error(errc::overloaded, "engine queue is full (" +
                                            std::to_string(config_.scheduler.max_waiting) + " waiting)");
  auto seq = std::make_unique<sequence>();
  seq->tokens = request.prompt;
  seq->prompt_len = static_cast<std::uint32_t>(request.prompt.size());
  seq->tokens.insert(seq->tokens.end(), request.resume_tokens.begin(), request.resume_tokens.end());
  if (seq->generated() >= request.max_tokens) {  // a resume with nothing left to do
    pending_finished_.push_back({request.id, finish_reason::length, seq->generated()});
    return {};
  }
  seq->request = std::move(request);
  scheduler_.enqueue(std::move(seq));
  return {};
}

void cpu_engine::cancel(seq_id id) {
  if (const sequence* s = scheduler_.find(id)) {
    // A suspended step with this sequence in it is dropped whole: none of its
    // sequences has advanced (`computed` moves when a step completes), so the
    // next plan runs their tokens again from the start, overwriting the K/V
    // its first layers wrote.
    // Its plan was charged to the tenants when planned; the others' tokens
    // are charged again when planned again, so that charge is taken back.
    if (suspended_ && std::any_of(suspended_->plan.begin(), suspended_->plan.end(),
                                  [&](const scheduled_chunk& c) { return c.seq == s; })) {
      scheduler_.refund(suspended_->plan, s, suspended_->charged_at);
      suspended_.reset();
      suspension_.next_stage = 0;
    }
    const finish_event event{id, finish_reason::cancelled, s->generated(), s->cached_tokens};
    scheduler_.remove(id);  // frees its KV blocks now, not at the next step
    if (spec_) spec_->forget(id);
    pending_finished_.push_back(event);
  }
}

double cpu_engine::tenant_usage_of(std::string_view tenant) const {
  const tenant_usage& usage = scheduler_.usage();
  const auto slot = usage.find(tenant);
  return slot ? usage.usage(*slot) : 0;
}

bool cpu_engine::idle() const {
  return pending_finished_.empty() && (fault_.has_value() || scheduler_.empty());
}

bool cpu_engine::sample_and_advance(sequence& seq, const float* logits, step_result& out,
                                    std::optional<model::token_id> decided) {
  const auto& r = seq.request;
  const model::token_id next =
      decided ? *decided : sampler_.sample(logits, model_->config().vocab_size, r.sampling, seq.generated());
  // The sampler passes over NaN logits and the speculative rule gives them
  // no weight, so the chosen logit is NaN only when all are; an infinite one
  // is an overflow. Either way the numbers are not the model's: stop.
  if (!std::isfinite(logits[next])) [[unlikely]] {
    out.finished.push_back({r.id, finish_reason::nonfinite_logits, seq.generated(), seq.cached_tokens});
    ++stats_.nonfinite_logit_finishes;
    scheduler_.finish(r.id);
    return false;
  }
  if (std::find(r.stop_tokens.begin(), r.stop_tokens.end(), next) != r.stop_tokens.end()) {
    out.finished.push_back({r.id, finish_reason::stop, seq.generated(), seq.cached_tokens});
    scheduler_.finish(r.id);
    return false;
  }
  token_event& event = out.tokens.emplace_back(token_event{r.id, next, seq.generated(), std::nullopt});
  if (r.logprobs) event.logprobs = compute_logprobs(logits, model_->config().vocab_size, next, r.top_logprobs);
  seq.tokens.push_back(next);
  ++stats_.generated_tokens;
  if (seq.generated() >= r.max_tokens) {
    out.finished.push_back({r.id, finish_reason::length, seq.generated(), seq.cached_tokens});
    scheduler_.finish(r.id);
    return false;
  }
  return true;
}

forward_batch cpu_engine::build_batch(const std::vector<scheduled_chunk>& plan, std::vector<sequence*>& wants_logits,
                                      step_result& out) {
  forward_batch batch;
  for (const scheduled_chunk& c : plan) {
    const auto index = static_cast<std::uint32_t>(batch.tables.size());
    batch.tables.push_back(&cache_.table(c.seq->request.id));
    const std::uint32_t end = c.seq->computed + c.n_tokens;
    for (std::uint32_t p = c.seq->computed; p < end; ++p) {
      const bool last = p + 1 == c.seq->tokens.size();
      batch.tokens.push_back({c.seq->tokens[p], p, index, last});
      if (last) wants_logits.push_back(c.seq);
    }
    if (spec_) append_proposals(batch, *c.seq, index);
    if (c.seq->pending() > 1) out.prefill_tokens += c.n_tokens;  // not a one-token decode
  }
  return batch;
}

void cpu_engine::finish_step(const std::vector<scheduled_chunk>& plan, const std::vector<sequence*>& wants_logits,
                             step_result& out) {
  ++stats_.steps;
  stats_.prefill_tokens += out.prefill_tokens;
  for (const scheduled_chunk& c : plan) {
    c.seq->computed += c.n_tokens;
    cache_.publish(c.seq->request.id, c.seq->tokens, c.seq->computed);  // full blocks join the prefix cache
  }
  const std::size_t vocab = model_->config().vocab_size;
  if (spec_)
    emit_speculated(wants_logits, out);
  else
    for (std::size_t i = 0; i < wants_logits.size(); ++i)
      sample_and_advance(*wants_logits[i], logits_.data() + i * vocab, out);
  out.decode_tokens = static_cast<std::uint32_t>(wants_logits.size());
}

void cpu_engine::offer_arrival(arrival_hint hint) {
  const std::lock_guard lock(offers_mu_);
  if (offers_.size() >= max_offers) return;
  offers_.push_back(std::move(hint));
  offered_.store(true, std::memory_order_release);
}

void cpu_engine::discard_offers() {
  const std::lock_guard lock(offers_mu_);
  offers_.clear();
  offered_.store(false, std::memory_order_relaxed);
}

bool cpu_engine::arrival_preempts(const std::vector<scheduled_chunk>& plan) {
  if (!offered_.load(std::memory_order_acquire)) return false;
  std::vector<arrival_hint> offers;
  {
    const std::lock_guard lock(offers_mu_);
    offers.swap(offers_);
    offered_.store(false, std::memory_order_relaxed);
  }
  // An offer whose request is here already (submitted after an earlier
  // step, whose end it missed) is no arrival: this step's plan had it.
  return std::any_of(offers.begin(), offers.end(), [&](const arrival_hint& h) {
    return !(h.id != 0 && scheduler_.find(h.id) != nullptr) &&
           scheduler_.arrival_preempts(plan, h.tenant, h.tenant_weight, h.priority);
  });
}

step_result cpu_engine::step() {
  step_result out;
  out.finished = std::move(pending_finished_);
  pending_finished_.clear();
  if (fault_) return out;
  if (suspended_) {
    continue_suspended(out);
    return out;
  }
  const std::vector<scheduled_chunk> plan = scheduler_.plan(out.preempted);
  const std::uint64_t charged_at = scheduler_.usage().halvings();
  stats_.preemptions += out.preempted;
  if (plan.empty()) return out;
  if (spec_) spec_->propose(plan, scheduler_, cache_);  // the draft's proposals (speculative.hpp)

  std::vector<sequence*> wants_logits;
  forward_batch batch = build_batch(plan, wants_logits, out);
  if (!spec_ && forward_->can_yield()) {
    bool asked = false;
    const std::function<bool()> should_yield = [&] {
      asked = true;
      return arrival_preempts(plan);
    };
    auto ran = forward_->execute_yielding(batch, logits_, suspension_, should_yield);
    if (!ran) {
      fault_ = ran.error().message;
      return out;
    }
    // A step the forward ran whole without asking (the CUDA forward's short
    // decode steps) took none of the offers made meanwhile: their requests
    // are submitted now, before the next step, which plans them. Kept, an
    // offer whose request has finished or was refused would stop a later
    // step for nothing, and they would pile up to max_offers.
    if (!asked) discard_offers();
    if (*ran) {  // stopped at a layer boundary: the arrival's prefill goes next
      suspended_ = suspended_step{plan, std::move(batch), std::move(wants_logits), out.prefill_tokens};
      suspended_->charged_at = charged_at;
      out.prefill_tokens = 0;
      out.yielded = true;
      ++stats_.yielded_steps;
      return out;
    }
  } else if (auto ok = forward_->execute(batch, logits_); !ok) {
    // Nothing of this step happened: no sequence advances, and none will.
    fault_ = ok.error().message;
    return out;
  }
  finish_step(plan, wants_logits, out);
  return out;
}

void cpu_engine::continue_suspended(step_result& out) {
  suspended_step& s = *suspended_;
  if (!s.interlude_ran) {
    // The prompts the step stopped for, alone: a short step, their first
    // tokens at its end.
    s.interlude_ran = true;
    s.interlude_arrivals = scheduler_.arrivals();
    const std::vector<scheduled_chunk> plan = scheduler_.plan_interlude(s.plan);
    s.interlude_admitted = !plan.empty();
    if (!plan.empty()) {
      std::vector<sequence*> wants_logits;
      const forward_batch batch = build_batch(plan, wants_logits, out);
      if (auto ok = forward_->execute(batch, logits_); !ok) {
        fault_ = ok.error().message;
        return;
      }
      finish_step(plan, wants_logits, out);
      return;
    }
  }
  // The stopped step's remaining layers, from the hidden state it kept. It
  // may stop again for a later arrival (at least one stage on: it always
  // progresses), and have another interlude. A prompt submitted since the
  // interlude was planned is here by now (its offer names a request
  // submitted, and one that came between the steps was never offered): the
  // step stops for it at its next boundary as for an arrival, unless the
  // interlude could admit nothing (then the next one could not either).
  // The offers are taken at every boundary either way, so none outlives it.
  const bool waiting_first = s.interlude_admitted && scheduler_.waiting_preempts(s.plan, s.interlude_arrivals);
  const std::function<bool()> should_yield = [&] { return arrival_preempts(s.plan) || waiting_first; };
  auto ran = forward_->execute_yielding(s.batch, logits_, suspension_, should_yield);
  if (!ran) {
    fault_ = ran.error().message;
    return;
  }
  if (*ran) {
    s.interlude_ran = false;
    out.yielded = true;
    ++stats_.yielded_steps;
    return;
  }
  const suspended_step done = std::move(s);
  suspended_.reset();
  out.prefill_tokens = done.prefill_tokens;
  finish_step(done.plan, done.wants_logits, out);
}

engine_stats cpu_engine::stats() const {
  engine_stats s = stats_;
  s.running = static_cast<std::uint32_t>(scheduler_.running());
  s.waiting = static_cast<std::uint32_t>(scheduler_.waiting());
  s.kv_capacity_tokens = cache_.capacity_tokens();
  s.kv_free_tokens = cache_.free_tokens();
  s.prefix_lookup_tokens = scheduler_.prefix_lookup_tokens();
  s.prefix_hit_tokens = scheduler_.prefix_hit_tokens();
  s.prefix_cached_blocks = cache_.cached_blocks();
  s.prefix_evicted_blocks = cache_.evicted_blocks();
  s.prefix_evicted_miss_tokens = scheduler_.prefix_evicted_miss_tokens();
  const resident_memory w = forward_->weights_memory();
  s.weight_copy_bytes = w.bytes;
  s.weight_huge_pages = w.huge_pages;
  if (spec_) {
    s.weight_copy_bytes += spec_->weights_memory().bytes;  // the draft's copies are this engine's too
    s.draft_proposed_tokens = spec_->stats().proposed;
    s.draft_accepted_tokens = spec_->stats().accepted;
  }
  return s;
}

prefix_summary cpu_engine::cached_prefixes(std::size_t max_hashes) const {
  if (!cache_.prefix_cache_enabled()) return {};
  return {cache_.layout().block_tokens, cache_.cached_hashes(max_hashes)};
}

// ---- Speculative decoding hooks (speculative.hpp) ----

void cpu_engine::append_proposals(forward_batch& batch, const sequence& seq, std::uint32_t index) {
  // The draft's tokens follow the sequence's last token, each with logits:
  // the target verifies all of them in this one batch. Their K/V lands past
  // `computed`, in blocks private to the sequence (speculator::propose
  // reserved them); only accepted ones become `computed`.
  auto pos = static_cast<std::uint32_t>(seq.tokens.size());
  for (const model::token_id d : spec_->proposals(seq)) batch.tokens.push_back({d, pos++, index, true});
}

void cpu_engine::emit_speculated(const std::vector<sequence*>& wants_logits, step_result& out) {
  const std::size_t vocab = model_->config().vocab_size;
  std::vector<std::pair<sequence*, const float*>> rows;
  std::size_t row = 0;
  for (sequence* seq : wants_logits) {
    rows.emplace_back(seq, logits_.data() + row * vocab);
    row += 1 + spec_->proposals(*seq).size();
  }
  spec_->verify(rows);
  const std::size_t finished_before = out.finished.size();
  for (const auto& [seq, logits] : rows) {
    if (!spec_->speculates(*seq)) {
      sample_and_advance(*seq, logits, out);
      continue;
    }
    // Accepted draft tokens (K/V computed), then the target's own token; a
    // stop token or max_tokens may end the sequence anywhere in between.
    const auto tokens = spec_->decided(*seq);
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (!sample_and_advance(*seq, logits + i * vocab, out, tokens[i])) break;
      if (i + 1 < tokens.size()) ++seq->computed;
    }
  }
  for (std::size_t i = finished_before; i < out.finished.size(); ++i) spec_->forget(out.finished[i].id);
}

}  // namespace exa::engine
