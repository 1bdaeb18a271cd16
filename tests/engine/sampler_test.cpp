// Sampling: greedy, temperature, top-k, top-p, and draws that are a pure
// function of (seed, index).

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/sampler.hpp"

using namespace exa;

TEST_CASE("greedy picks the largest logit, lowest id on ties", "[sampler]") {
  engine::sampler s;
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f};
  CHECK(s.sample(logits.data(), logits.size(), {}, 0) == 1);
  CHECK(s.sample(logits.data(), logits.size(), {1.0f, 1.0f, 1, 9}, 0) == 1);  // top_k 1 is greedy
}

TEST_CASE("greedy passes over NaN logits wherever they are, and takes token 0 when all are NaN", "[sampler]") {
  engine::sampler s;
  const std::vector<float> first_nan = {NAN, -3.0f, 1.0f, NAN, 0.5f};
  CHECK(s.sample(first_nan.data(), first_nan.size(), {}, 0) == 2);
  const std::vector<float> leading = {NAN, NAN, -7.0f};
  CHECK(s.sample(leading.data(), leading.size(), {}, 0) == 2);
  const std::vector<float> all_nan = {NAN, NAN, NAN};
  CHECK(s.sample(all_nan.data(), all_nan.size(), {}, 0) == 0);
  CHECK(s.sample(all_nan.data(), all_nan.size(), {0.8f, 1.0f, 0, 5}, 0) == 0);  // sampled: the same fallback
  // Sampled draws never pick a NaN either.
  for (int i = 0; i < 32; ++i) CHECK(s.sample(first_nan.data(), first_nan.size(), {1.0f, 1.0f, 0, 3}, i) % 3 != 0);
}

TEST_CASE("seeded draws repeat and depend on seed and index", "[sampler]") {
  engine::sampler s;
  std::vector<float> logits(50);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i));
  const engine::sampling_params p{1.0f, 1.0f, 0, 7};
  std::vector<int> a, b, c;
  for (int i = 0; i < 64; ++i) {
    a.push_back(s.sample(logits.data(), logits.size(), p, i));
    b.push_back(s.sample(logits.data(), logits.size(), p, i));
    c.push_back(s.sample(logits.data(), logits.size(), {1.0f, 1.0f, 0, 8}, i));
  }
  CHECK(a == b);
  CHECK(a != c);
  CHECK(engine::uniform_draw(1, 2) == engine::uniform_draw(1, 2));
  CHECK(engine::uniform_draw(1, 2) != engine::uniform_draw(1, 3));
}

TEST_CASE("temperature sampling follows the softmax distribution", "[sampler]") {
  engine::sampler s;
  const std::vector<float> logits = {0.0f, std::log(3.0f)};  // p = 0.25, 0.75
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ones += s.sample(logits.data(), 2, {1.0f, 1.0f, 0, 5}, i);
  CHECK(std::abs(ones / double(n) - 0.75) < 0.02);
}

TEST_CASE("top-k and top-p restrict the candidates", "[sampler]") {
  engine::sampler s;
  const std::vector<float> logits = {1.0f, 5.0f, 4.9f, 0.0f, 4.8f};
  for (int i = 0; i < 500; ++i) {
    const int k2 = s.sample(logits.data(), logits.size(), {5.0f, 1.0f, 2, 3}, i);
    CHECK((k2 == 1 || k2 == 2));
    const int p = s.sample(logits.data(), logits.size(), {1.0f, 0.01f, 0, 3}, i);
    CHECK(p == 1);  // the smallest set reaching 1% mass is the top token alone
  }
}

TEST_CASE("sampling parameters are validated", "[sampler]") {
  CHECK(engine::validate({0.0f, 1.0f, 0, 0}).has_value());
  CHECK_FALSE(engine::validate({-0.1f, 1.0f, 0, 0}).has_value());
  CHECK_FALSE(engine::validate({NAN, 1.0f, 0, 0}).has_value());
  CHECK_FALSE(engine::validate({1000.0f, 1.0f, 0, 0}).has_value());
  CHECK_FALSE(engine::validate({1.0f, 0.0f, 0, 0}).has_value());
  CHECK_FALSE(engine::validate({1.0f, 1.5f, 0, 0}).has_value());
}

namespace {

// log p(i) computed the slow, obvious way: softmax in long double, then log.
long double direct_logprob(const std::vector<float>& logits, std::size_t i) {
  long double total = 0;
  for (const float l : logits) total += std::exp(static_cast<long double>(l));
  return std::log(std::exp(static_cast<long double>(logits[i])) / total);
}

}  // namespace

TEST_CASE("logprobs are the log-softmax of the raw logits, checked against a direct computation", "[sampler][logprobs]") {
  std::vector<float> logits(1000);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = 4.0f * std::sin(0.37f * static_cast<float>(i));
  for (const int chosen : {0, 17, 999}) {
    const auto lp = engine::compute_logprobs(logits.data(), logits.size(), chosen, 5);
    CHECK(std::abs(lp.logprob - static_cast<double>(direct_logprob(logits, chosen))) < 1e-5);
    REQUIRE(lp.top_ids.size() == 5);
    REQUIRE(lp.top_logprobs.size() == 5);
    // The top five are the five largest logits, best first, each with its value.
    std::vector<int> order(logits.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
    for (std::size_t k = 0; k < 5; ++k) {
      CHECK(lp.top_ids[k] == order[k]);
      CHECK(std::abs(lp.top_logprobs[k] - static_cast<double>(direct_logprob(logits, order[k]))) < 1e-5);
    }
  }
  // Probabilities over the whole vocabulary sum to one.
  long double sum = 0;
  for (std::size_t i = 0; i < logits.size(); ++i)
    sum += std::exp(static_cast<long double>(engine::compute_logprobs(logits.data(), logits.size(), i, 0).logprob));
  CHECK(std::abs(static_cast<double>(sum) - 1.0) < 1e-5);
}

TEST_CASE("logprobs: ties by lowest id, top_n over the vocabulary, huge logits, NaN", "[sampler][logprobs]") {
  const std::vector<float> tied = {1.0f, 3.0f, 3.0f, 2.0f};
  const auto a = engine::compute_logprobs(tied.data(), tied.size(), 3, 20);
  CHECK(a.top_ids == std::vector<model::token_id>{1, 2, 3, 0});  // the whole vocabulary, no more
  CHECK(a.top_logprobs[0] == a.top_logprobs[1]);
  CHECK(a.logprob == a.top_logprobs[2]);
  CHECK(engine::compute_logprobs(tied.data(), tied.size(), 1, 0).top_ids.empty());

  // Logits in the thousands would overflow a naive exp: two equal ones are log(1/2).
  const std::vector<float> huge = {5000.0f, 5000.0f, -5000.0f};
  const auto h = engine::compute_logprobs(huge.data(), huge.size(), 0, 1);
  CHECK(std::abs(h.logprob - std::log(0.5)) < 1e-6);
  CHECK(h.top_ids == std::vector<model::token_id>{0});
  CHECK(engine::compute_logprobs(huge.data(), huge.size(), 2, 0).logprob < -9000.0f);

  // A NaN logit is an impossible token, as for the sampler; the rest still sum to one.
  const std::vector<float> nan = {0.0f, NAN, 0.0f};
  const auto n = engine::compute_logprobs(nan.data(), nan.size(), 1, 3);
  CHECK(std::isinf(n.logprob));
  CHECK(n.top_ids == std::vector<model::token_id>{0, 2});
  CHECK(std::abs(n.top_logprobs[0] - std::log(0.5)) < 1e-6);
}

TEST_CASE("logprobs do not depend on the sampling settings that picked the token", "[sampler][logprobs]") {
  // compute_logprobs takes no sampling parameters at all: the reported
  // distribution is the model's, before temperature, top-k and top-p. Check
  // that a token sampled hot still gets its raw log-probability.
  engine::sampler s;
  const std::vector<float> logits = {0.0f, std::log(3.0f)};  // p = 0.25, 0.75
  for (int i = 0; i < 50; ++i) {
    const auto t = s.sample(logits.data(), 2, {2.0f, 1.0f, 0, 11}, i);
    const auto lp = engine::compute_logprobs(logits.data(), 2, t, 1);
    CHECK(std::abs(lp.logprob - std::log(t == 1 ? 0.75 : 0.25)) < 1e-6);
    CHECK(lp.top_ids[0] == 1);
  }
}
