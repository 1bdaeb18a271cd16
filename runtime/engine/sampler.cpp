#include "engine/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/assert.hpp"
#include "common/splitmix64.hpp"
#include "engine/det_math.hpp"

namespace exa::engine {
namespace {

// NaN logits never win (as sample() drops them), wherever they are; with
// nothing but NaN, token 0.
model::token_id argmax(const float* logits, std::size_t vocab) noexcept {
  std::size_t best = 0;
  while (best + 1 < vocab && std::isnan(logits[best])) ++best;
  for (std::size_t i = best + 1; i < vocab; ++i)
    if (logits[i] > logits[best]) best = i;
  return std::isnan(logits[best]) ? 0 : static_cast<model::token_id>(best);
}

}  // namespace

model::token_id first_holding(const std::vector<std::pair<float, model::token_id>>& candidates, double logit) {
  const auto it = std::find_if(candidates.begin(), candidates.end(),
                               [&](const auto& c) { return static_cast<double>(c.first) == logit; });
  EXA_ASSERT(it != candidates.end());
  return it->second;
}

expected<void> validate(const sampling_params& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0.0f || p.temperature > max_temperature)
    return make_error(errc::invalid_argument,
                      "temperature must be in [0, " + std::to_string(max_temperature) + "], got " +
                          std::to_string(p.temperature));
  if (!std::isfinite(p.top_p) || p.top_p <= 0.0f || p.top_p > 1.0f)
    return make_error(errc::invalid_argument,
                      "top_p must be in (0, 1], got " + std::to_string(p.top_p));
  return {};
}

double uniform_draw(std::uint64_t seed, std::uint64_t index) noexcept {
  const std::uint64_t x = splitmix64(splitmix64(seed) ^ splitmix64(index + 0x632be59bd9b4e019ull));
  return static_cast<double>(x >> 11) * 0x1.0p-53;
}

token_logprobs compute_logprobs(const float* logits, std::size_t vocab, model::token_id chosen,
                                std::uint32_t top_n) {
  EXA_ASSERT(vocab > 0);
  EXA_ASSERT(chosen >= 0 && static_cast<std::size_t>(chosen) < vocab);
  EXA_ASSERT(top_n <= max_top_logprobs);
  const auto valid = [&](std::size_t i) { return !std::isnan(logits[i]); };
  double max_logit = -INFINITY;
  for (std::size_t i = 0; i < vocab; ++i)
    if (valid(i)) max_logit = std::max(max_logit, static_cast<double>(logits[i]));
  double total = 0.0;
  if (std::isfinite(max_logit))
    for (std::size_t i = 0; i < vocab; ++i)
      if (valid(i)) total += det::exp(static_cast<double>(logits[i]) - max_logit);
  // log Z = max + log(sum exp(l - max)); without a finite logit every token
  // is impossible and every log-probability is -inf.
  const double log_z = total > 0.0 ? max_logit + det::log(total) : INFINITY;
  const auto logprob_of = [&](std::size_t i) -> float {
    if (!valid(i) || !std::isfinite(log_z)) return -INFINITY;
    return static_cast<float>(static_cast<double>(logits[i]) - log_z);
  };

  token_logprobs out;
  out.logprob = logprob_of(static_cast<std::size_t>(chosen));
  if (top_n == 0) return out;
  // A short sorted list beats sorting the vocabulary: one pass, and an
  // insertion only when a logit beats the current n-th.
  std::vector<std::pair<float, model::token_id>> best;
  best.reserve(top_n + 1);
  const auto better = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  for (std::size_t i = 0; i < vocab; ++i) {
    if (!valid(i)) continue;
    const std::pair<float, model::token_id> c{logits[i], static_cast<model::token_id>(i)};
    if (best.size() == top_n && !better(c, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), c, better), c);
    if (best.size() > top_n) best.pop_back();
  }
  for (const auto& [logit, id] : best) {
    out.top_ids.push_back(id);
    out.top_logprobs.push_back(logprob_of(static_cast<std::size_t>(id)));
  }
  return out;
}

model::token_id sampler::sample(const float* logits, std::size_t vocab, const sampling_params& p,
                                std::uint64_t index) {
  EXA_ASSERT(vocab > 0);
  if (p.temperature == 0.0f || p.top_k == 1) return argmax(logits, vocab);

  candidates_.clear();
  for (std::size_t i = 0; i < vocab; ++i)
    if (!std::isnan(logits[i])) candidates_.emplace_back(logits[i], static_cast<model::token_id>(i));
  if (candidates_.empty()) return argmax(logits, vocab);
  const auto better = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::size_t keep = candidates_.size();
  if (p.top_k > 0 && p.top_k < keep) {
    keep = p.top_k;
    std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<std::ptrdiff_t>(keep),
                      candidates_.end(), better);
  } else if (p.top_p < 1.0f) {
    std::sort(candidates_.begin(), candidates_.end(), better);
  }
  candidates_.resize(keep);
  // With neither filter the order does not matter, but it must be fixed:
  // it is token-id order here.

  const double max_logit =
      std::max_element(candidates_.begin(), candidates_.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; })->first;
  // An infinite maximum leaves no distribution (inf − inf is NaN): the first
  // candidate holding it is the token, and the engine, finding its logit not
  // finite, stops the sequence there (cpu_engine::sample_and_advance).
  if (std::isinf(max_logit)) return first_holding(candidates_, max_logit);
  probs_.resize(keep);
  double total = 0.0;
  for (std::size_t i = 0; i < keep; ++i) {
    probs_[i] = det::exp((candidates_[i].first - max_logit) / p.temperature);
    total += probs_[i];
  }
  if (p.top_p < 1.0f) {  // candidates are sorted: keep the smallest prefix reaching top_p
    double cum = 0.0;
    std::size_t n = 0;
    while (n < keep) {
      cum += probs_[n++];
      if (cum >= p.top_p * total) break;
    }
    keep = n;
    total = cum;
  }
  const double target = uniform_draw(p.seed, index) * total;
  double cum = 0.0;
  for (std::size_t i = 0; i < keep; ++i) {
    cum += probs_[i];
    if (target < cum) return candidates_[i].second;
  }
  return candidates_[keep - 1].second;
}

}  // namespace exa::engine
