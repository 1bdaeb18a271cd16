#pragma once
// Next-token sampling: greedy, temperature, top-k, top-p. The random draw for
// the i-th generated token is a pure function of (seed, i), so a request
// resumed elsewhere with the same seed and position draws the same numbers.

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "model/tokenizer.hpp"

namespace exa::engine {

struct sampling_params {
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;        // (0, 1]; 1 disables
  std::uint32_t top_k = 0;   // 0 disables
  std::uint64_t seed = 0;
};

/// Named limits on sampling parameters.
inline constexpr float max_temperature = 100.0f;

/// invalid_argument naming the parameter when out of range or not finite.
expected<void> validate(const sampling_params& p);

/// Uniform double in [0, 1) for draw `index` of stream `seed`.
double uniform_draw(std::uint64_t seed, std::uint64_t index) noexcept;

/// The most alternatives a request may ask log-probabilities for (OpenAI's
/// bound on top_logprobs; it keeps the per-token cost and message size small).
inline constexpr std::uint32_t max_top_logprobs = 20;

/// Log-probabilities at one generated position.
struct token_logprobs {
  float logprob = 0;                      // of the sampled token
  std::vector<model::token_id> top_ids;   // the most likely ids, best first
  std::vector<float> top_logprobs;        // their log-probabilities, same order
};

/// Log-softmax of the model's raw logits -- before temperature, top-k and
/// top-p, so the numbers describe the model, not the request's sampling
/// settings (what vLLM reports by default, and comparable across requests) --
/// at `chosen` and at the `top_n` (<= max_top_logprobs) most likely ids,
/// ordered like the sampler's candidates (logit desc, id asc). NaN logits are
/// impossible tokens (-inf), as in sample(). Computed in double, so a vocab of
/// any size sums without overflow or visible rounding.
token_logprobs compute_logprobs(const float* logits, std::size_t vocab, model::token_id chosen,
                                std::uint32_t top_n);

/// The first of `candidates` (logit, id) whose logit is `logit`.
model::token_id first_holding(const std::vector<std::pair<float, model::token_id>>& candidates, double logit);

class sampler {
 public:
  /// Picks a token from `logits[0, vocab)` for generated-token number `index`.
  /// Greedy ties go to the lowest id; candidate order is (logit desc, id asc).
  /// NaN logits are never chosen, unless every logit is NaN (token 0 then).
  model::token_id sample(const float* logits, std::size_t vocab, const sampling_params& p,
                         std::uint64_t index);

 private:
  std::vector<std::pair<float, model::token_id>> candidates_;
  std::vector<double> probs_;
};

}  // namespace exa::engine
