// Sampling: greedy, temperature, top-k, top-p, and draws that are a pure
// function of (seed, index).

#include <catch2/catch.hpp>

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
