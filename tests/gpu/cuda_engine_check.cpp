// The CUDA engine end to end: the same greedy ids as the CPU engine at every
// step that is not a near-tie (after one, the sequences may fairly differ),
// with close log-probabilities; and batch invariance on the GPU: a sequence's
// tokens and log-probabilities are bitwise the same alone or among seven
// others, with CUDA graphs or without, whatever its prefill was split into,
// with its prefix computed or taken from the prefix cache.

#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "fixtures.hpp"
#include "gpu/cuda_engine.hpp"

using namespace exa;
using model::tensor_type;

namespace {

struct generated {
  std::vector<model::token_id> ids;
  std::vector<engine::token_logprobs> logprobs;
};

std::map<engine::seq_id, generated> run(engine::inference_engine& eng, const std::vector<engine::generation_request>& reqs) {
  for (const auto& r : reqs) REQUIRE(eng.submit(r).has_value());
  std::map<engine::seq_id, generated> out;
  for (int steps = 0; !eng.idle(); ++steps) {
    REQUIRE(steps < 10000);
    const auto res = eng.step();
    REQUIRE_FALSE(eng.fault().has_value());
    for (const auto& t : res.tokens) {
      out[t.id].ids.push_back(t.token);
      REQUIRE(t.logprobs.has_value());
      out[t.id].logprobs.push_back(*t.logprobs);
    }
  }
  return out;
}

std::vector<engine::generation_request> requests(const model::llama_model& m, std::size_t n, std::uint32_t top) {
  std::vector<engine::generation_request> reqs;
  const std::size_t lengths[] = {1, 17, 40, 5, 23, 9, 31, 2};
  for (std::size_t i = 0; i < n; ++i) {
    auto r = test::request(i + 1, test::test_prompt(lengths[i % 8], m.config().vocab_size, i + 1), 12);
    r.logprobs = true;
    r.top_logprobs = top;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

std::unique_ptr<engine::inference_engine> cuda_engine(std::shared_ptr<const model::llama_model> m,
                                                      std::size_t max_graphs = 16, std::uint32_t prefill_chunk = 256,
                                                      bool prefix_cache = true) {
  gpu::cuda_engine_options o;
  o.engine.scheduler.prefill_chunk = prefill_chunk;
  o.engine.prefix_cache = prefix_cache;
  o.own_kv_blocks = 64;
  o.max_graphs = max_graphs;
  auto e = gpu::make_cuda_engine(std::move(m), 0, o);
  if (!e) FAIL(e.error().message);
  return std::move(*e);
}

model::model_spec variant(const char* name) {
  auto s = test::tiny_spec(tensor_type::f16);
  s.name = std::string("cuda-") + name;
  return s;
}

std::vector<model::model_spec> test_models() {
  std::vector<model::model_spec> specs;
  specs.push_back(variant("f16"));
  auto bf = variant("bf16");
  bf.type = tensor_type::bf16;
  specs.push_back(bf);
  auto q8 = variant("q8_0");
  q8.type = tensor_type::q8_0;
  specs.push_back(q8);
  auto qwen = variant("qwen2");
  qwen.arch = model::architecture::qwen2;  // Q/K/V biases, half-split RoPE pairs
  qwen.rope_freq_base = 1000000.0f;
  specs.push_back(qwen);
  auto llama3 = variant("llama3-rope");
  llama3.rope_scaling = model::rope_scaling_kind::llama3;  // rope_freqs factors
  llama3.rope_original_context = 256;
  specs.push_back(llama3);
  auto linear = variant("linear-rope");
  linear.rope_scaling = model::rope_scaling_kind::linear;
  specs.push_back(linear);
  auto wide = variant("hd64");  // the head width of real models, more layers
  wide.n_layers = 4;
  wide.dim = 256;
  wide.n_heads = 4;
  wide.n_kv_heads = 2;
  wide.ff_dim = 512;
  wide.vocab_size = 512;
  specs.push_back(wide);
  auto tied = variant("tied-q8_0");
  tied.type = tensor_type::q8_0;
  tied.tie_embeddings = true;
  specs.push_back(tied);
  return specs;
}

}  // namespace

TEST_CASE("the CUDA engine gives the CPU engine's greedy ids at every step that is not a near-tie", "[cuda][engine]") {
  for (const auto& spec : test_models()) {
    CAPTURE(spec.name);
    const auto m = test::make_model(spec);
    auto pool = test::make_pool(*m, 64 * 16);
    engine::thread_pool threads(2);
    engine::cpu_engine cpu(m, *pool, threads, {});
    const auto want = run(cpu, requests(*m, 8, 2));
    auto gpu_engine = cuda_engine(m);
    const auto got = run(*gpu_engine, requests(*m, 8, 2));

    std::size_t compared = 0;
    for (const auto& [id, w] : want) {
      CAPTURE(id);
      const generated& g = got.at(id);
      for (std::size_t i = 0; i < w.ids.size() && i < g.ids.size(); ++i) {
        CAPTURE(i);
        const auto& lp = w.logprobs[i];
        REQUIRE(lp.top_logprobs.size() == 2);
        const bool near_tie = lp.top_logprobs[0] - lp.top_logprobs[1] < 1e-3f;
        if (near_tie) break;  // the engines may fairly choose differently from here on
        REQUIRE(g.ids[i] == w.ids[i]);
        CHECK(std::fabs(g.logprobs[i].logprob - lp.logprob) < 2e-3f);
        ++compared;
      }
    }
    CHECK(compared >= 40);  // most of the 8 × 12 steps are clear choices
  }
}

TEST_CASE("a sequence's logits on the GPU are bitwise the same alone or in a batch of 8", "[cuda][engine][invariance]") {
  auto spec = variant("hd64");
  spec.n_layers = 4, spec.dim = 256, spec.ff_dim = 512, spec.vocab_size = 512;
  for (const tensor_type type : {tensor_type::f16, tensor_type::q8_0}) {
    spec.type = type;
    CAPTURE(model::to_string(type));
    const auto m = test::make_model(spec);
    const auto all = requests(*m, 8, engine::max_top_logprobs);
    auto alone_engine = cuda_engine(m);
    const auto alone = run(*alone_engine, {all[2]});
    auto batch_engine = cuda_engine(m);
    const auto batched = run(*batch_engine, all);
    auto eager_engine = cuda_engine(m, 0, 5);  // no graphs; prefill in chunks of 5
    const auto eager = run(*eager_engine, all);

    const generated& a = alone.at(3);
    REQUIRE(a.ids.size() == 12);
    for (const auto* other : {&batched.at(3), &eager.at(3)}) {
      REQUIRE(other->ids == a.ids);
      for (std::size_t i = 0; i < a.ids.size(); ++i) {
        CHECK(other->logprobs[i].logprob == a.logprobs[i].logprob);
        CHECK(other->logprobs[i].top_ids == a.logprobs[i].top_ids);
        CHECK(other->logprobs[i].top_logprobs == a.logprobs[i].top_logprobs);
      }
    }
    // The batched run decoded with graphs: the comparison covered replays.
    const auto counters = gpu::cuda_counters(*batch_engine);
    REQUIRE(counters.has_value());
    CHECK(counters->graph_replays > 0);
    CHECK(gpu::cuda_counters(*eager_engine)->graph_captures == 0);
  }
}

TEST_CASE("the prefix cache on the GPU changes nothing a sequence computes", "[cuda][engine][prefix]") {
  auto spec = variant("hd64");
  spec.n_layers = 4, spec.dim = 256, spec.ff_dim = 512, spec.vocab_size = 512;
  const auto m = test::make_model(spec);
  // One request first (its full blocks are published), then five sharing its
  // 40-token prefix: with the cache they attach its first two 16-token
  // blocks; the last, whose prompt is exactly those 32 tokens, recomputes its
  // last token, so its second block is copied on the device first.
  const auto prefix = test::test_prompt(40, m->config().vocab_size, 99);
  std::vector<engine::generation_request> first, rest;
  for (std::uint64_t i = 0; i < 6; ++i) {
    auto prompt = prefix;
    const auto tail = test::test_prompt(i * 3, m->config().vocab_size, 200 + i);
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    if (i == 5) prompt.resize(32);
    auto r = test::request(i + 1, prompt, 8);
    r.logprobs = true;
    r.top_logprobs = engine::max_top_logprobs;
    (i == 0 ? first : rest).push_back(std::move(r));
  }
  std::map<engine::seq_id, generated> with_cache, without;
  auto cached = cuda_engine(m, 16, 256, true);
  auto plain = cuda_engine(m, 16, 256, false);
  for (auto* wave : {&first, &rest}) {
    for (auto& [id, g] : run(*cached, *wave)) with_cache[id] = g;
    for (auto& [id, g] : run(*plain, *wave)) without[id] = g;
  }
  CHECK(cached->stats().prefix_hit_tokens >= 4 * 32);  // two 16-token blocks each, at least
  CHECK(plain->stats().prefix_hit_tokens == 0);
  REQUIRE(with_cache.size() == 6);
  for (const auto& [id, g] : without) {
    CAPTURE(id);
    const generated& c = with_cache.at(id);
    REQUIRE(c.ids == g.ids);
    for (std::size_t i = 0; i < g.ids.size(); ++i) {
      CHECK(c.logprobs[i].logprob == g.logprobs[i].logprob);
      CHECK(c.logprobs[i].top_logprobs == g.logprobs[i].top_logprobs);
    }
  }
}
