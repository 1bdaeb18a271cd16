// The architectures beyond plain Llama, against the slow reference: qwen2
// (Q/K/V biases, RoPE over half-split pairs, tied or untied head) and Llama
// 3.1-style RoPE (per-pair frequency factors from rope_freqs.weight) and
// linear RoPE scaling. Each feature is also shown to matter: the engine run
// without it is far from the reference. Batch invariance holds for them too.
//
// Bounds are reference_test.cpp's (normalized MSE of the logits per position).

#include <catch2/catch.hpp>

#include <cstring>

#include "engine/llama_forward.hpp"
#include "fixtures.hpp"
#include "reference_llama.hpp"

using namespace exa;

namespace {

model::model_spec arch_spec(const char* name, model::architecture arch, model::tensor_type t,
                            bool tied = false) {
  model::model_spec s;
  s.name = name;
  s.arch = arch;
  s.n_layers = 2;
  s.dim = 64;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.ff_dim = 160;
  s.vocab_size = 300;
  s.context_length = 128;
  s.type = t;
  s.tie_embeddings = tied;
  s.seed = 11;
  return s;
}

// Llama 3.1's factors with an original context so short that most pairs of a
// 16-wide head are scaled at the positions a test reaches.
model::model_spec llama3_spec(model::tensor_type t) {
  auto s = arch_spec("llama3rope", model::architecture::llama, t);
  s.rope_scaling = model::rope_scaling_kind::llama3;
  s.rope_scaling_factor = 8.0f;
  s.rope_original_context = 16;
  return s;
}

model::model_spec linear_spec() {
  auto s = arch_spec("linear", model::architecture::llama, model::tensor_type::f32);
  s.rope_scaling = model::rope_scaling_kind::linear;
  s.rope_scaling_factor = 4.0f;
  return s;
}

// Worst per-position NMSE of a forward pass over `prompt` (one batch) against
// `expected`, running `config` and `weights` (possibly altered copies).
double worst_nmse(const model::llama_model& m, const model::llama_config& config,
                  const model::llama_weights& weights, const std::vector<std::int32_t>& prompt,
                  const std::vector<std::vector<double>>& expected) {
  auto pool = test::make_pool(m, 64);
  engine::kv_cache cache(*pool, {config.n_layers, config.kv_dim(), 16});
  REQUIRE(cache.reserve(1, 64));
  engine::thread_pool threads(2);
  engine::llama_forward fwd(config, weights, cache, threads);
  engine::forward_batch batch;
  batch.tables.push_back(&cache.table(1));
  for (std::uint32_t p = 0; p < prompt.size(); ++p) batch.tokens.push_back({prompt[p], p, 0, true});
  std::vector<float> logits;
  fwd.run(batch, logits);
  const std::size_t vocab = config.vocab_size;
  REQUIRE(logits.size() == prompt.size() * vocab);
  double worst = 0;
  for (std::size_t p = 0; p < prompt.size(); ++p)
    worst = std::max(worst, test::nmse(logits.data() + p * vocab, expected[p]));
  return worst;
}

struct arch_case {
  const char* label;
  model::model_spec spec;
  double max_nmse;
};

}  // namespace

TEST_CASE("qwen2 and scaled-RoPE llama files match the reference", "[engine][reference][arch]") {
  using model::architecture;
  using model::tensor_type;
  auto qwen_base = arch_spec("qwen-base", architecture::qwen2, tensor_type::f32);
  qwen_base.rope_freq_base = 1000000.0f;  // Qwen2.5's base and epsilon
  qwen_base.rms_eps = 1e-6f;
  const arch_case cases[] = {
      {"qwen2 f32", arch_spec("qwen", architecture::qwen2, tensor_type::f32), 1e-6},
      {"qwen2 f32 tied", arch_spec("qwen-tied", architecture::qwen2, tensor_type::f32, true), 1e-6},
      {"qwen2 f32 base 1e6", qwen_base, 1e-6},
      {"qwen2 f16", arch_spec("qwen-f16", architecture::qwen2, tensor_type::f16), 5e-6},
      {"qwen2 q8_0", arch_spec("qwen-q8", architecture::qwen2, tensor_type::q8_0), 2e-3},
      {"llama3 rope f32", llama3_spec(tensor_type::f32), 1e-6},
      {"llama3 rope q8_0", llama3_spec(tensor_type::q8_0), 2e-3},
      {"linear rope f32", linear_spec(), 1e-6},
  };
  for (const arch_case& c : cases) {
    SECTION(c.label) {
      auto m = test::make_model(c.spec);
      const auto prompt = test::test_prompt(40, m->config().vocab_size, 5);
      const auto expected = test::reference_llama(*m).logits_all(prompt);
      const double worst = worst_nmse(*m, m->config(), m->weights(), prompt, expected);
      INFO(c.label << ": worst logits NMSE " << worst);
      CHECK(worst < c.max_nmse);
    }
  }
}

TEST_CASE("each architecture feature changes the logits", "[engine][reference][arch]") {
  // The engine run without a feature must be far from the reference that
  // has it: otherwise the test above could not tell the feature apart.
  SECTION("qwen2's half-split RoPE pairs") {
    auto m = test::make_model(arch_spec("qwen", model::architecture::qwen2, model::tensor_type::f32));
    REQUIRE(m->config().rope_pairs == model::rope_pairing::halves);
    const auto prompt = test::test_prompt(40, m->config().vocab_size, 5);
    const auto expected = test::reference_llama(*m).logits_all(prompt);
    auto adjacent = m->config();
    adjacent.rope_pairs = model::rope_pairing::adjacent;
    CHECK(worst_nmse(*m, adjacent, m->weights(), prompt, expected) > 1e-3);
  }
  SECTION("qwen2's Q/K/V biases") {
    auto m = test::make_model(arch_spec("qwen", model::architecture::qwen2, model::tensor_type::f32));
    const auto prompt = test::test_prompt(40, m->config().vocab_size, 5);
    const auto expected = test::reference_llama(*m).logits_all(prompt);
    auto unbiased = m->weights();
    for (auto& l : unbiased.layers) {
      REQUIRE((l.bq && l.bk && l.bv && !l.bo));
      l.bq.reset();
      l.bk.reset();
      l.bv.reset();
    }
    CHECK(worst_nmse(*m, m->config(), unbiased, prompt, expected) > 1e-3);
  }
  SECTION("Llama 3.1's rope_freqs factors") {
    auto m = test::make_model(llama3_spec(model::tensor_type::f32));
    REQUIRE(m->weights().rope_freqs.has_value());
    const auto prompt = test::test_prompt(40, m->config().vocab_size, 5);
    const auto expected = test::reference_llama(*m).logits_all(prompt);
    auto unscaled = m->weights();
    unscaled.rope_freqs.reset();
    CHECK(worst_nmse(*m, m->config(), unscaled, prompt, expected) > 1e-4);
  }
  SECTION("linear RoPE scaling") {
    auto m = test::make_model(linear_spec());
    REQUIRE(m->config().rope_freq_scale == 0.25f);
    const auto prompt = test::test_prompt(40, m->config().vocab_size, 5);
    const auto expected = test::reference_llama(*m).logits_all(prompt);
    auto unscaled = m->config();
    unscaled.rope_freq_scale = 1.0f;
    CHECK(worst_nmse(*m, unscaled, m->weights(), prompt, expected) > 1e-4);
  }
}

TEST_CASE("qwen2 and scaled-RoPE logits are bitwise batch- and chunk-invariant", "[engine][invariance][arch]") {
  const auto spec = GENERATE(arch_spec("qwen-inv", model::architecture::qwen2, model::tensor_type::q8_0),
                             llama3_spec(model::tensor_type::f16));
  CAPTURE(spec.name);
  auto m = test::make_model(spec);
  const auto& c = m->config();
  const auto a = test::test_prompt(29, c.vocab_size, 1);
  const auto b = test::test_prompt(17, c.vocab_size, 2);
  auto pool = test::make_pool(*m, 256);
  engine::kv_cache cache(*pool, {c.n_layers, c.kv_dim(), 16});

  // Runs steps of (sequence, first position, count) chunks over sequences
  // {a, b} with `threads` workers; returns every logit row of sequence a.
  using chunk = std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>;
  const auto run = [&](const std::vector<std::vector<chunk>>& steps, std::size_t threads) {
    engine::thread_pool pool_threads(threads);
    engine::llama_forward fwd(c, m->weights(), cache, pool_threads);
    const std::vector<std::int32_t>* seqs[] = {&a, &b};
    for (std::uint64_t s : {1, 2}) {
      cache.release(s);
      REQUIRE(cache.reserve(s, 32));
    }
    std::vector<std::vector<float>> rows_a;
    for (const auto& step : steps) {
      engine::forward_batch batch;
      batch.tables = {&cache.table(1), &cache.table(2)};
      for (const auto& [s, first, n] : step)
        for (std::uint32_t p = first; p < first + n; ++p) batch.tokens.push_back({(*seqs[s])[p], p, s, true});
      std::vector<float> logits;
      fwd.run(batch, logits);
      for (std::size_t i = 0; i < batch.tokens.size(); ++i)
        if (batch.tokens[i].seq_index == 0)
          rows_a.emplace_back(logits.begin() + i * c.vocab_size, logits.begin() + (i + 1) * c.vocab_size);
    }
    return rows_a;
  };
  const auto alone = run({{{0, 0, 29}}}, 1);
  const auto chunked = run({{{0, 0, 5}}, {{0, 5, 1}, {1, 0, 9}}, {{1, 9, 8}, {0, 6, 23}}}, 3);
  REQUIRE(alone.size() == 29);
  REQUIRE(chunked.size() == 29);
  for (std::size_t p = 0; p < 29; ++p) {
    INFO("position " << p);
    CHECK(std::memcmp(alone[p].data(), chunked[p].data(), c.vocab_size * sizeof(float)) == 0);
  }
  CHECK(std::memcmp(alone[3].data(), alone[4].data(), c.vocab_size * sizeof(float)) != 0);
}
