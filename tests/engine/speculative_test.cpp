// Speculative decoding: the rejection rule keeps the target's distribution;
// with any draft (one that always agrees, one derived from the target's first
// layer, an unrelated one that rarely agrees) greedy output is the target's
// own token for token -- in batches, with stop tokens and max_tokens falling
// inside an accepted run, with shared prefixes and under preemption -- and
// seeded sampled output depends on the seed alone: not on k, the batch,
// preemption or resume.

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>

#include "engine/speculative.hpp"
#include "fixtures.hpp"
#include "model/draft_model.hpp"

using namespace exa;

namespace {

using test::request;

model::model_spec target_spec() {
  auto s = test::tiny_spec();
  s.name = "spec-target";
  s.n_layers = 4;
  // Deep blocks that mostly refine (model_gen.hpp): a draft cut to the first
  // block agrees often, as with trained models.
  s.deep_block_scale = 0.1f;
  s.deep_block_from = 1;
  return s;
}

std::shared_ptr<const model::llama_model> target() { return test::make_model(target_spec()); }

// The target's first `layers` blocks (model/draft_model.hpp).
std::shared_ptr<const model::llama_model> derived_draft(std::uint32_t layers) {
  static std::map<std::uint32_t, std::shared_ptr<const model::llama_model>> cache;
  if (auto it = cache.find(layers); it != cache.end()) return it->second;
  const std::string path =
      std::string(EXA_TEST_TMPDIR) + "/engine-models/spec-draft-L" + std::to_string(layers) + ".gguf";
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  auto ok = model::derive_draft(target()->path(), layers, path);
  if (!ok) FAIL(to_string(ok.error()));
  auto m = model::llama_model::load(path);
  if (!m) FAIL(to_string(m.error()));
  return cache[layers] = *m;
}

// Same shape and vocabulary, unrelated weights: rarely agrees.
std::shared_ptr<const model::llama_model> unrelated_draft() {
  auto s = test::tiny_spec();
  s.name = "spec-unrelated";
  s.seed = 99;
  return test::make_model(s);
}

struct rig {
  std::shared_ptr<const model::llama_model> m;
  std::unique_ptr<gpu::cpu_memory_pool> pool;
  engine::thread_pool threads{2};
  std::unique_ptr<engine::cpu_engine> eng;

  rig(std::shared_ptr<const model::llama_model> draft, std::uint32_t k, std::uint32_t kv_tokens = 4096,
      engine::cpu_engine_config cfg = {})
      : m(target()), pool(test::make_pool(*m, kv_tokens)) {
    cfg.draft = std::move(draft);
    cfg.draft_tokens = k;
    if (cfg.draft) REQUIRE(engine::check_draft(*m, *cfg.draft, k));
    eng = std::make_unique<engine::cpu_engine>(m, *pool, threads, cfg);
  }
};

std::vector<std::int32_t> prompt_of(std::size_t i) { return test::test_prompt(4 + i % 5 * 4, 260, 100 + i); }

// Every request of `reqs` through one engine; tokens by id.
std::vector<std::vector<std::int32_t>> run(rig& r, const std::vector<engine::generation_request>& reqs,
                                           std::uint64_t* preempted = nullptr) {
  for (const auto& q : reqs) REQUIRE(r.eng->submit(q));
  return test::run_to_completion(*r.eng, reqs.size(), preempted);
}

std::vector<engine::generation_request> batch(std::size_t n, engine::sampling_params sp = {},
                                              std::uint32_t max_tokens = 24) {
  std::vector<engine::generation_request> out;
  // Some max_tokens end inside a window of accepted tokens.
  for (std::size_t i = 0; i < n; ++i)
    out.push_back(request(i, prompt_of(i), i % 4 == 3 ? 1 + static_cast<std::uint32_t>(i % 7) : max_tokens, sp));
  return out;
}

double acceptance(const engine::engine_stats& s) {
  return s.draft_proposed_tokens == 0 ? 0.0
                                      : static_cast<double>(s.draft_accepted_tokens) /
                                            static_cast<double>(s.draft_proposed_tokens);
}

}  // namespace

TEST_CASE("the rejection rule emits the target's distribution", "[speculative][sampler]") {
  const std::vector<float> pt{0.1f, 0.4f, 0.0f, 0.2f, 0.3f, 0.0f};
  const std::vector<float> pd{0.3f, 0.1f, 0.2f, 0.0f, 0.2f, 0.2f};
  const std::uint64_t seed = 7;
  const int n = 200000;
  std::array<int, 6> counts{};
  int accepted_count = 0;
  for (int i = 0; i < n; ++i) {
    const auto x = engine::pick(pd, engine::draft_draw(seed, i));
    REQUIRE(pd[static_cast<std::size_t>(x)] > 0.0f);
    bool accepted = false;
    const auto y = engine::speculative_choice(pt, pd, x, engine::accept_draw(seed, i),
                                              engine::residual_draw(seed, i), accepted);
    CHECK(accepted == (y == x));
    ++counts[static_cast<std::size_t>(y)];
    accepted_count += accepted;
  }
  for (std::size_t t = 0; t < pt.size(); ++t) {
    CAPTURE(t);
    CHECK(std::abs(counts[t] / double(n) - pt[t]) < 0.005);  // > 4 standard deviations
  }
  // Acceptance is sum(min(p_t, p_d)) = 0.4.
  CHECK(std::abs(accepted_count / double(n) - 0.4) < 0.01);

  // A draft equal to the target is always accepted.
  for (int i = 0; i < 1000; ++i) {
    const auto x = engine::pick(pt, engine::draft_draw(seed, i));
    bool accepted = false;
    CHECK(engine::speculative_choice(pt, pt, x, engine::accept_draw(seed, i), engine::residual_draw(seed, i),
                                     accepted) == x);
    CHECK(accepted);
  }
}

TEST_CASE("sampling_distribution is what the sampler draws from", "[speculative][sampler]") {
  const std::vector<float> logits{1.0f, 2.5f, -0.5f, 2.5f, 0.3f, NAN, 1.7f, -2.0f, 0.9f, 2.0f};
  for (const engine::sampling_params p : {engine::sampling_params{0.8f, 1.0f, 0, 3},
                                          engine::sampling_params{1.3f, 1.0f, 4, 3},
                                          engine::sampling_params{0.7f, 0.6f, 0, 3},
                                          engine::sampling_params{1.1f, 0.8f, 5, 3}}) {
    CAPTURE(p.temperature, p.top_p, p.top_k);
    std::vector<float> probs;
    engine::sampling_distribution(logits.data(), logits.size(), p, probs);
    double total = 0;
    for (float q : probs) total += q;
    CHECK(std::abs(total - 1.0) < 1e-5);
    CHECK(probs[5] == 0.0f);  // NaN: impossible
    engine::sampler s;
    std::vector<int> counts(logits.size());
    const int n = 40000;
    for (int i = 0; i < n; ++i) ++counts[static_cast<std::size_t>(s.sample(logits.data(), logits.size(), p, i))];
    for (std::size_t t = 0; t < logits.size(); ++t) {
      CAPTURE(t);
      if (probs[t] == 0.0f) CHECK(counts[t] == 0);  // the same support, exactly
      CHECK(std::abs(counts[t] / double(n) - probs[t]) < 0.012);
    }
  }
}

TEST_CASE("an infinite logit takes all of the distribution, as the sampler takes it", "[speculative][sampler]") {
  // inf − inf leaves no distribution: the sampler picks the first candidate
  // holding the infinite maximum (and the engine then stops the sequence);
  // sampling_distribution puts everything there too.
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> logits{1.0f, inf, -0.5f, inf, NAN, 2.0f};
  const std::vector<float> all_minus{-inf, -inf, NAN, -inf};
  for (const engine::sampling_params p : {engine::sampling_params{0.8f, 1.0f, 0, 3},
                                          engine::sampling_params{1.3f, 1.0f, 3, 3},
                                          engine::sampling_params{0.7f, 0.6f, 0, 3}}) {
    CAPTURE(p.temperature, p.top_p, p.top_k);
    engine::sampler s;
    std::vector<float> probs;
    engine::sampling_distribution(logits.data(), logits.size(), p, probs);
    CHECK(probs == std::vector<float>{0, 1, 0, 0, 0, 0});
    for (int i = 0; i < 16; ++i) CHECK(s.sample(logits.data(), logits.size(), p, i) == 1);
    engine::sampling_distribution(all_minus.data(), all_minus.size(), p, probs);
    CHECK(probs == std::vector<float>{1, 0, 0, 0});
    for (int i = 0; i < 16; ++i) CHECK(s.sample(all_minus.data(), all_minus.size(), p, i) == 0);
  }
}

TEST_CASE("a draft must share the target's vocabulary and context", "[speculative][errors]") {
  const auto m = target();
  auto other_vocab = test::tiny_spec();
  other_vocab.vocab_size = 300;
  auto short_ctx = test::tiny_spec();
  short_ctx.context_length = 256;
  const auto refuse = [&](const model::llama_model& d, std::uint32_t k, const char* text) {
    auto ok = engine::check_draft(*m, d, k);
    REQUIRE_FALSE(ok.has_value());
    CHECK(ok.error().code == errc::invalid_argument);
    CHECK_THAT(ok.error().message, Catch::Contains(text));
  };
  refuse(*test::make_model(other_vocab), 4, "different vocabularies");
  refuse(*test::make_model(short_ctx), 4, "shorter than its target");
  refuse(*unrelated_draft(), 0, "draft_tokens must be in [1, 8]");
  refuse(*unrelated_draft(), 9, "draft_tokens must be in [1, 8]");
  CHECK(engine::check_draft(*m, *derived_draft(1), 4));
}

TEST_CASE("greedy output with any draft is the target's own, token for token", "[speculative][greedy]") {
  rig plain(nullptr, 1);
  const auto reqs = batch(12);
  const auto expected = run(plain, reqs);
  REQUIRE(expected[0] != expected[1]);
  REQUIRE(expected[3].size() == 4);  // a max_tokens cut (see batch())

  struct named {
    const char* name;
    std::shared_ptr<const model::llama_model> draft;
  };
  for (const named& d : {named{"the target itself", target()}, named{"derived, 1 layer", derived_draft(1)},
                         named{"derived, 2 layers", derived_draft(2)}, named{"unrelated", unrelated_draft()}}) {
    for (std::uint32_t k : {1u, 3u, 8u}) {
      CAPTURE(d.name, k);
      rig r(d.draft, k);
      CHECK(run(r, reqs) == expected);
      const auto s = r.eng->stats();
      CHECK(s.draft_proposed_tokens > 0);
      if (d.draft == target()) CHECK(s.draft_accepted_tokens == s.draft_proposed_tokens);
      if (d.draft == unrelated_draft()) CHECK(acceptance(s) < 0.3);
      if (d.draft == derived_draft(1)) CHECK(acceptance(s) > 0.5);
      // Everything finished: the draft's KV is all back.
      CHECK(r.eng->speculation()->cache().used_blocks() == 0);
      CHECK(s.kv_free_tokens == s.kv_capacity_tokens);
    }
  }
}

TEST_CASE("stop tokens inside an accepted run end generation where the target would", "[speculative][greedy]") {
  rig plain(nullptr, 1);
  const auto prompt = prompt_of(3);
  const auto free_run = run(plain, {request(0, prompt, 20)})[0];
  for (std::size_t at : {1u, 4u, 9u}) {
    CAPTURE(at);
    auto req = request(0, prompt, 20);
    req.stop_tokens = {free_run[at]};
    const auto want = run(plain, {req})[0];
    REQUIRE(want.size() < free_run.size());
    rig r(target(), 8);  // accepts everything: the stop token comes as an accepted draft token
    std::vector<std::int32_t> got;
    REQUIRE(r.eng->submit(req));
    engine::finish_reason reason = engine::finish_reason::length;
    while (!r.eng->idle()) {
      const auto s = r.eng->step();
      for (const auto& t : s.tokens) got.push_back(t.token);
      for (const auto& f : s.finished) reason = f.reason;
    }
    CHECK(got == want);
    CHECK(reason == engine::finish_reason::stop);
  }
}

TEST_CASE("logprobs of speculated tokens are the target's", "[speculative][logprobs]") {
  auto req = request(0, prompt_of(2), 16);
  req.logprobs = true;
  req.top_logprobs = 3;
  const auto collect = [&](rig& r) {
    REQUIRE(r.eng->submit(req));
    std::vector<engine::token_event> events;
    while (!r.eng->idle())
      for (auto& t : r.eng->step().tokens) events.push_back(t);
    return events;
  };
  rig plain(nullptr, 1), spec(derived_draft(2), 4);
  const auto want = collect(plain);
  const auto got = collect(spec);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    REQUIRE(got[i].logprobs.has_value());
    CHECK(got[i].token == want[i].token);
    CHECK(got[i].index == want[i].index);
    CHECK(got[i].logprobs->logprob == want[i].logprobs->logprob);  // bitwise: the same target logits
    CHECK(got[i].logprobs->top_ids == want[i].logprobs->top_ids);
    CHECK(got[i].logprobs->top_logprobs == want[i].logprobs->top_logprobs);
  }
  CHECK(spec.eng->stats().draft_accepted_tokens > 0);
}

TEST_CASE("shared prefixes and preemption keep speculative output exact", "[speculative][greedy][kv]") {
  // Twelve requests sharing a 40-token prefix (the prefix cache shares its
  // blocks) in a cache too small for all of them.
  std::vector<engine::generation_request> reqs;
  const auto common = test::test_prompt(40, 260, 5);
  for (std::size_t i = 0; i < 12; ++i) {
    auto p = common;
    const auto tail = prompt_of(i);
    p.insert(p.end(), tail.begin(), tail.end());
    reqs.push_back(request(i, p, 20));
  }
  rig plain(nullptr, 1);
  const auto expected = run(plain, reqs);
  rig r(derived_draft(1), 4, 96);
  std::uint64_t preempted = 0;
  CHECK(run(r, reqs, &preempted) == expected);
  CHECK(preempted > 0);
  CHECK(r.eng->speculation()->cache().used_blocks() == 0);
}

TEST_CASE("seeded sampled output depends on the seed and the draft alone", "[speculative][sampled]") {
  const engine::sampling_params seeded{0.9f, 0.95f, 40, 1234};
  const auto draft = derived_draft(1);
  // Reference: each request alone, k = 4.
  const auto reqs = batch(10, seeded);
  std::vector<std::vector<std::int32_t>> expected;
  for (const auto& q : reqs) {
    rig r(draft, 4);
    auto alone = q;
    alone.id = 0;
    expected.push_back(run(r, {alone})[0]);
  }
  REQUIRE(expected[0] != expected[1]);

  SECTION("in one batch, for every k") {
    for (std::uint32_t k : {1u, 2u, 4u, 8u}) {
      CAPTURE(k);
      rig r(draft, k);
      CHECK(run(r, reqs) == expected);
      CHECK(r.eng->stats().draft_accepted_tokens > 0);
    }
  }
  SECTION("under preemption") {
    rig r(draft, 4, 96);
    std::uint64_t preempted = 0;
    CHECK(run(r, reqs, &preempted) == expected);
    CHECK(preempted > 0);
  }
  SECTION("resumed after any number of tokens") {
    for (std::size_t cut : {1u, 5u, 11u}) {
      CAPTURE(cut);
      rig r(draft, 4);
      auto q = reqs[0];
      q.id = 0;
      REQUIRE(expected[0].size() > cut);
      q.resume_tokens.assign(expected[0].begin(), expected[0].begin() + static_cast<std::ptrdiff_t>(cut));
      REQUIRE(r.eng->submit(q));
      std::vector<std::int32_t> rest;
      while (!r.eng->idle())
        for (const auto& t : r.eng->step().tokens) {
          CHECK(t.index == cut + rest.size());
          rest.push_back(t.token);
        }
      CHECK(rest == std::vector<std::int32_t>(expected[0].begin() + static_cast<std::ptrdiff_t>(cut),
                                              expected[0].end()));
    }
  }
  SECTION("a draft equal to the target accepts every token") {
    rig r(target(), 4);
    run(r, reqs);
    const auto s = r.eng->stats();
    CHECK(s.draft_proposed_tokens > 0);
    CHECK(s.draft_accepted_tokens == s.draft_proposed_tokens);
  }
}

TEST_CASE("cancelling a speculating request frees both caches", "[speculative][kv]") {
  rig r(derived_draft(1), 4);
  REQUIRE(r.eng->submit(request(7, prompt_of(1), 50)));
  REQUIRE(r.eng->submit(request(8, prompt_of(2), 50)));
  for (int i = 0; i < 3; ++i) r.eng->step();
  CHECK(r.eng->speculation()->cache().used_blocks() > 0);
  r.eng->cancel(7);
  r.eng->cancel(8);
  CHECK(r.eng->speculation()->cache().used_blocks() == 0);
  const auto s = r.eng->step();
  CHECK(s.finished.size() == 2);
  CHECK(r.eng->idle());
  CHECK(r.eng->stats().kv_free_tokens == r.eng->stats().kv_capacity_tokens);
}
