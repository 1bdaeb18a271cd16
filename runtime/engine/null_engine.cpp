#include "engine/null_engine.hpp"

#include <algorithm>
#include <string>

namespace exa::engine {

model::token_id null_engine::next_token(const std::vector<model::token_id>& tokens, std::uint32_t vocab) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto t : tokens) h = (h ^ static_cast<std::uint64_t>(t)) * 1099511628211ull;
  // Printable ASCII bytes of the byte-level vocabulary (ids 3 + byte) when it
  // exists, so demo output reads as text.
  if (vocab >= 259) return static_cast<model::token_id>(3 + 32 + h % 95);
  return static_cast<model::token_id>(h % vocab);
}

expected<void> null_engine::submit(generation_request r) {
  if (r.prompt.empty()) return make_error(errc::invalid_argument, "prompt is empty: give at least one token");
  // Its tokens come from a hash, not a model: there is no distribution to
  // report, and made-up numbers would be worse than none.
  if (r.logprobs)
    return make_error(errc::unsupported, "logprobs need an engine that computes logits; the null engine has none");
  const std::uint64_t total = r.prompt.size() + std::uint64_t{r.max_tokens};
  if (total > config_.context_length)
    return make_error(errc::invalid_argument, "prompt (" + std::to_string(r.prompt.size()) + " tokens) + max_tokens (" +
                                                  std::to_string(r.max_tokens) +
                                                  ") exceeds the model's context length " +
                                                  std::to_string(config_.context_length));
  for (const auto t : r.prompt)
    if (t < 0 || static_cast<std::uint32_t>(t) >= config_.vocab_size)
      return make_error(errc::invalid_argument, "token id " + std::to_string(t) + " is outside the vocabulary");
  if (running_.count(r.id)) return make_error(errc::invalid_argument, "request id " + std::to_string(r.id) + " is already active");
  if (running_.size() >= config_.max_running + config_.max_waiting)
    return make_error(errc::overloaded, "engine queue is full");
  if (kv_used_ + total > config_.kv_capacity_tokens)
    return make_error(errc::overloaded, "KV cache is full");
  seq s;
  s.tokens = r.prompt;
  s.tokens.insert(s.tokens.end(), r.resume_tokens.begin(), r.resume_tokens.end());
  s.generated = static_cast<std::uint32_t>(r.resume_tokens.size());
  s.request = std::move(r);
  kv_used_ += static_cast<std::uint32_t>(total);
  const seq_id id = s.request.id;
  running_.emplace(id, std::move(s));
  return {};
}

void null_engine::cancel(seq_id id) {
  const auto it = running_.find(id);
  if (it == running_.end()) return;
  kv_used_ -= static_cast<std::uint32_t>(it->second.request.prompt.size() + it->second.request.max_tokens);
  finished_.push_back({id, finish_reason::cancelled, it->second.generated});
  running_.erase(it);
}

step_result null_engine::step() {
  step_result out;
  out.finished = std::move(finished_);
  finished_.clear();
  ++stats_.steps;
  for (auto it = running_.begin(); it != running_.end();) {
    seq& s = it->second;
    const auto& r = s.request;
    bool done = s.generated >= r.max_tokens;
    finish_reason reason = finish_reason::length;
    if (!done) {
      const model::token_id t = next_token(s.tokens, config_.vocab_size);
      if (std::find(r.stop_tokens.begin(), r.stop_tokens.end(), t) != r.stop_tokens.end()) {
        done = true;
        reason = finish_reason::stop;
      } else {
        out.tokens.push_back({r.id, t, s.generated, std::nullopt});
        s.tokens.push_back(t);
        ++s.generated;
        ++stats_.generated_tokens;
        done = s.generated >= r.max_tokens;
      }
    }
    if (done) {
      out.finished.push_back({r.id, reason, s.generated});
      kv_used_ -= static_cast<std::uint32_t>(r.prompt.size() + r.max_tokens);
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  out.decode_tokens = static_cast<std::uint32_t>(out.tokens.size());
  return out;
}

engine_stats null_engine::stats() const {
  engine_stats s = stats_;
  s.running = static_cast<std::uint32_t>(running_.size());
  s.kv_capacity_tokens = config_.kv_capacity_tokens;
  s.kv_free_tokens = config_.kv_capacity_tokens - kv_used_;
  return s;
}

}  // namespace exa::engine
