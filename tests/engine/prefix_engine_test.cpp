// Prefix caching end to end on the CPU engine: a request whose prompt's KV
// blocks come from the cache produces exactly -- bit for bit, logprobs
// included -- what it produces cold, whether it shares a partial system
// prompt, its whole prompt, was admitted beside the sequence that computes the
// prefix, lost part of its prefix to eviction, or is preempted and re-admitted
// under a small pool; cached_tokens, the prefix counters and the summary say
// what was reused, and with the cache off nothing is.

#include <catch2/catch.hpp>

#include <cstring>
#include <map>

#include "fixtures.hpp"
#include "model/prefix_hash.hpp"

using namespace exa;

namespace {

struct outcome {
  std::vector<std::int32_t> tokens;
  std::vector<engine::token_logprobs> logprobs;
  std::optional<engine::finish_event> finish;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Tokens, logprobs and top logprobs equal bit for bit.
void check_same(const outcome& got, const outcome& want) {
  REQUIRE(got.finish.has_value());
  CHECK(got.tokens == want.tokens);
  REQUIRE(got.logprobs.size() == want.logprobs.size());
  for (std::size_t i = 0; i < got.logprobs.size(); ++i) {
    CAPTURE(i);
    CHECK(std::memcmp(&got.logprobs[i].logprob, &want.logprobs[i].logprob, sizeof(float)) == 0);
    CHECK(got.logprobs[i].top_ids == want.logprobs[i].top_ids);
    CHECK(same_bits(got.logprobs[i].top_logprobs, want.logprobs[i].top_logprobs));
  }
  CHECK(got.finish->generated == want.finish->generated);
}

engine::generation_request request(engine::seq_id id, std::vector<std::int32_t> prompt,
                                   std::uint32_t max_tokens = 8, engine::sampling_params sp = {}) {
  engine::generation_request r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling = sp;
  r.logprobs = true;
  r.top_logprobs = 5;
  return r;
}

std::vector<std::int32_t> concat(std::vector<std::int32_t> a, const std::vector<std::int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct rig {
  std::shared_ptr<const model::llama_model> m;
  std::unique_ptr<gpu::cpu_memory_pool> pool;
  engine::thread_pool threads{2};
  std::unique_ptr<engine::cpu_engine> eng;
  std::map<engine::seq_id, outcome> out;
  std::uint64_t preempted = 0;

  rig(std::shared_ptr<const model::llama_model> model, std::uint32_t kv_tokens, bool prefix_cache = true,
      engine::scheduler_config sched = {})
      : m(std::move(model)), pool(test::make_pool(*m, kv_tokens)) {
    engine::cpu_engine_config cfg;
    cfg.scheduler = sched;
    cfg.prefix_cache = prefix_cache;
    eng = std::make_unique<engine::cpu_engine>(m, *pool, threads, cfg);
  }

  void submit(engine::generation_request r) { REQUIRE(eng->submit(std::move(r))); }

  // Steps until idle, checking the cache's bookkeeping after every step.
  void drain() {
    for (int guard = 0; !eng->idle(); ++guard) {
      REQUIRE(guard < 10000);
      const auto r = eng->step();
      eng->cache().check_invariants();
      preempted += r.preempted;
      for (const auto& t : r.tokens) {
        auto& o = out[t.id];
        REQUIRE(t.index == o.tokens.size());
        o.tokens.push_back(t.token);
        REQUIRE(t.logprobs.has_value());
        o.logprobs.push_back(*t.logprobs);
      }
      for (const auto& f : r.finished) out[f.id].finish = f;
    }
  }

  outcome run(engine::generation_request r) {
    const auto id = r.id;
    submit(std::move(r));
    drain();
    return out.at(id);
  }
};

// The request alone on a fresh engine without a prefix cache.
outcome cold(const std::shared_ptr<const model::llama_model>& m, engine::generation_request r) {
  rig fresh(m, 1024, false);
  return fresh.run(std::move(r));
}

}  // namespace

TEST_CASE("a shared system prompt is reused and the output stays exact", "[prefix][engine]") {
  for (const auto type : {model::tensor_type::f32, model::tensor_type::q8_0}) {
    CAPTURE(model::to_string(type));
    auto m = test::make_model(test::tiny_spec(type));
    const auto vocab = m->config().vocab_size;
    const auto sys = test::test_prompt(40, vocab, 1);  // two full blocks and 8 tokens
    const auto a = concat(sys, test::test_prompt(9, vocab, 2));
    const auto b = concat(sys, test::test_prompt(13, vocab, 3));
    const engine::sampling_params sampled{0.8f, 0.95f, 0, 7};

    rig r(m, 1024);
    const auto got_a = r.run(request(1, a));
    const auto got_b = r.run(request(2, b, 8, sampled));
    check_same(got_a, cold(m, request(1, a)));
    check_same(got_b, cold(m, request(2, b, 8, sampled)));
    CHECK(got_a.finish->cached_tokens == 0);
    CHECK(got_b.finish->cached_tokens == 32);  // the third block diverges

    const auto s = r.eng->stats();
    CHECK(s.prefix_lookup_tokens == a.size() + b.size());
    CHECK(s.prefix_hit_tokens == 32);
    CHECK(s.prefix_cached_blocks == r.eng->cache().cached_blocks());
    // a: 49 prompt + 7 computed generated = 3 full blocks; b (60) adds its third.
    CHECK(s.prefix_cached_blocks == 4);

    // The summary lists b's chain first (last used), its first block first.
    const auto summary = r.eng->cached_prefixes(100);
    CHECK(summary.block_tokens == 16);
    REQUIRE(summary.hashes.size() == 4);
    const auto sys_hashes = model::prefix_block_hashes(sys, 16);
    CHECK(summary.hashes[0] == sys_hashes[0]);
    CHECK(summary.hashes[1] == sys_hashes[1]);
    CHECK(r.eng->cached_prefixes(1).hashes.size() == 1);
  }
}

TEST_CASE("a fully cached prompt recomputes only its last token", "[prefix][engine]") {
  auto m = test::make_model(test::tiny_spec());
  const auto p = test::test_prompt(48, m->config().vocab_size, 4);  // exactly three blocks
  rig r(m, 1024);
  const auto first = r.run(request(1, p));
  const auto prefill_before = r.eng->stats().prefill_tokens;
  const auto again = r.run(request(2, p));
  CHECK(again.finish->cached_tokens == 47);
  CHECK(r.eng->stats().prefill_tokens == prefill_before);  // one token: a decode step
  const auto want = cold(m, request(1, p));
  check_same(first, want);
  check_same(again, want);
  // A longer prompt over the same blocks takes all three.
  const auto longer = concat(p, {5, 6});
  const auto got = r.run(request(3, longer));
  CHECK(got.finish->cached_tokens == 48);
  check_same(got, cold(m, request(3, longer)));
}

TEST_CASE("sequences admitted together share what one of them computes", "[prefix][engine]") {
  auto m = test::make_model(test::tiny_spec());
  const auto vocab = m->config().vocab_size;
  const auto sys = test::test_prompt(40, vocab, 5);
  std::vector<std::vector<std::int32_t>> prompts;
  for (std::uint64_t i = 0; i < 4; ++i) prompts.push_back(concat(sys, test::test_prompt(3 + i * 5, vocab, 10 + i)));
  // Chunks of 16 prompt tokens: the others are still prefilling when the
  // first blocks are published, and the copies they computed give way.
  engine::scheduler_config sched;
  sched.prefill_chunk = 16;
  rig r(m, 1024, true, sched);
  for (std::uint64_t i = 0; i < prompts.size(); ++i) r.submit(request(i, prompts[i], 12));
  r.drain();
  for (std::uint64_t i = 0; i < prompts.size(); ++i) {
    CAPTURE(i);
    check_same(r.out.at(i), cold(m, request(i, prompts[i], 12)));
    CHECK(r.out.at(i).finish->cached_tokens == 0);  // all admitted cold
  }
  // Later arrivals find the prefix once, not four times.
  const auto got = r.run(request(9, prompts[2], 12));
  CHECK(got.finish->cached_tokens >= 48);
  check_same(got, cold(m, request(9, prompts[2], 12)));
}

TEST_CASE("eviction under pressure leaves outputs exact", "[prefix][engine]") {
  auto m = test::make_model(test::tiny_spec());
  const auto vocab = m->config().vocab_size;
  const auto a = test::test_prompt(49, vocab, 6);
  const auto d = test::test_prompt(100, vocab, 7);
  rig r(m, 8 * 16);  // eight blocks
  const auto first = r.run(request(1, a));
  CHECK(r.eng->cache().cached_blocks() == 3);
  CHECK(r.eng->stats().prefix_evicted_blocks == 0);
  // d needs seven blocks: a's cached blocks are evicted, last blocks first.
  const auto got_d = r.run(request(2, d));
  CHECK(r.eng->cache().used_blocks() <= 8);
  CHECK(r.eng->stats().prefix_evicted_blocks == 2);  // 5 fresh blocks of 7: two of a's go
  CHECK(r.eng->stats().prefix_evicted_blocks == r.eng->cache().evicted_blocks());
  CHECK(r.eng->stats().prefix_evicted_miss_tokens == 0);  // d was never cached
  const auto again = r.run(request(3, a));
  CHECK(again.finish->cached_tokens < 48);
  // What it did not find had been cached and evicted: a cache that size
  // too small, not a prompt never seen.
  CHECK(r.eng->stats().prefix_evicted_miss_tokens == 48 - again.finish->cached_tokens);
  const auto want = cold(m, request(1, a));
  check_same(first, want);
  check_same(again, want);
  check_same(got_d, cold(m, request(2, d)));
}

TEST_CASE("preemption under a small pool re-admits from the cache exactly", "[prefix][engine]") {
  auto m = test::make_model(test::tiny_spec());
  const auto vocab = m->config().vocab_size;
  const auto sys = test::test_prompt(40, vocab, 8);
  std::vector<std::vector<std::int32_t>> prompts;
  for (std::uint64_t i = 0; i < 6; ++i) prompts.push_back(concat(sys, test::test_prompt(10 + i, vocab, 20 + i)));
  rig r(m, 10 * 16);  // ten blocks for six sequences of six (two shared)
  for (std::uint64_t i = 0; i < prompts.size(); ++i) r.submit(request(i, prompts[i], 40));
  r.drain();
  CHECK(r.preempted > 0);  // the rare path really ran
  for (std::uint64_t i = 0; i < prompts.size(); ++i) {
    CAPTURE(i);
    check_same(r.out.at(i), cold(m, request(i, prompts[i], 40)));
  }
  const auto s = r.eng->stats();
  CHECK(s.preemptions == r.preempted);
  CHECK(s.prefix_hit_tokens > 0);
}

TEST_CASE("with the prefix cache off nothing is reused and outputs are the same", "[prefix][engine]") {
  auto m = test::make_model(test::tiny_spec());
  const auto vocab = m->config().vocab_size;
  const auto sys = test::test_prompt(40, vocab, 9);
  const auto a = concat(sys, test::test_prompt(9, vocab, 2));
  rig on(m, 1024, true);
  rig off(m, 1024, false);
  for (auto* r : {&on, &off}) {
    r->run(request(1, a));
    r->run(request(2, a));
  }
  CHECK(on.out.at(2).finish->cached_tokens == 48);
  CHECK(off.out.at(2).finish->cached_tokens == 0);
  check_same(off.out.at(2), on.out.at(2));
  check_same(off.out.at(1), on.out.at(2));
  const auto s = off.eng->stats();
  CHECK(s.prefix_lookup_tokens == 0);
  CHECK(s.prefix_hit_tokens == 0);
  CHECK(s.prefix_cached_blocks == 0);
  CHECK(off.eng->cached_prefixes(10).block_tokens == 0);
  CHECK(off.eng->cached_prefixes(10).hashes.empty());
}
