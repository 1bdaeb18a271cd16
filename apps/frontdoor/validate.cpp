#include "validate.hpp"

#include <fmt/format.h>

#include <cmath>

namespace exa::door {

namespace {

std::optional<error> invalid(std::string message) { return error{errc::invalid_argument, std::move(message)}; }

std::optional<error> validate_prompt(const api::generate_request& r, const api::request_limits& limits) {
  if (int{r.prompt_text.has_value()} + int{r.prompt_ids.has_value()} + int{r.messages.has_value()} != 1)
    return invalid("exactly one of a text prompt, a token-id prompt and chat messages must be given");
  if (r.messages && r.messages->empty()) return invalid("chat messages must not be empty");
  if (r.prompt_text && r.prompt_text->size() > limits.prompt_bytes_max)
    return invalid(fmt::format("prompt is longer than {} bytes", limits.prompt_bytes_max));
  if (r.prompt_ids) {
    if (r.prompt_ids->empty()) return invalid("prompt token ids must not be empty");
    if (r.prompt_ids->size() > limits.prompt_tokens_max)
      return invalid(fmt::format("prompt has {} token ids; at most {} are allowed", r.prompt_ids->size(),
                                 limits.prompt_tokens_max));
    for (auto id : *r.prompt_ids)
      if (id < 0) return invalid(fmt::format("prompt token ids must not be negative (got {})", id));
  }
  return std::nullopt;
}

}  // namespace

std::optional<error> validate_generate(const api::generate_request& r, const api::request_limits& limits) {
  if (r.model.empty()) return invalid("model must be given");
  if (auto bad = validate_prompt(r, limits)) return bad;
  if (r.max_tokens < 1 || r.max_tokens > limits.max_tokens_max)
    return invalid(fmt::format("max_tokens must be between 1 and {} (got {})", limits.max_tokens_max, r.max_tokens));
  const auto& s = r.sampling;
  if (!(std::isfinite(s.temperature) && s.temperature >= 0.0f && s.temperature <= 2.0f))
    return invalid(fmt::format("temperature must be between 0 and 2 (got {})", s.temperature));
  if (!(std::isfinite(s.top_p) && s.top_p > 0.0f && s.top_p <= 1.0f))
    return invalid(fmt::format("top_p must be greater than 0 and at most 1 (got {})", s.top_p));
  if (r.stop.size() > limits.stop_sequences_max)
    return invalid(fmt::format("stop has {} sequences; at most {} are allowed", r.stop.size(), limits.stop_sequences_max));
  for (const auto& stop : r.stop) {
    if (stop.empty()) return invalid("stop sequences must not be empty");
    if (stop.size() > limits.stop_sequence_bytes_max)
      return invalid(fmt::format("stop sequences must be at most {} bytes", limits.stop_sequence_bytes_max));
  }
  return std::nullopt;
}

}  // namespace exa::door
