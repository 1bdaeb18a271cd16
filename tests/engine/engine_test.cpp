// The CPU engine end to end: continuous batching gives every request the same
// tokens it would get alone (any batch size, joining mid-flight, chunked
// prefill, preemption under KV pressure), resume continues a request exactly,
// and bad requests get errors that name the problem.

#include <catch2/catch.hpp>

#include <algorithm>
#include <optional>

#include "fixtures.hpp"

using namespace exa;

namespace {

using test::request;

struct rig {
  std::shared_ptr<const model::llama_model> m;
  std::unique_ptr<gpu::cpu_memory_pool> pool;
  engine::thread_pool threads{2};
  std::unique_ptr<engine::cpu_engine> eng;

  rig(std::shared_ptr<const model::llama_model> model, std::uint32_t kv_tokens, engine::cpu_engine_config cfg = {})
      : m(std::move(model)), pool(test::make_pool(*m, kv_tokens)) {
    eng = std::make_unique<engine::cpu_engine>(m, *pool, threads, cfg);
  }
};

// Expected tokens of request i, each generated alone.
std::vector<std::vector<std::int32_t>> alone(const std::shared_ptr<const model::llama_model>& m, std::size_t n,
                                             std::uint32_t max_tokens, engine::sampling_params sp = {}) {
  std::vector<std::vector<std::int32_t>> out;
  for (std::size_t i = 0; i < n; ++i) {
    rig r(m, 512);
    REQUIRE(r.eng->submit(request(0, test::test_prompt(5 + i % 7 * 3, m->config().vocab_size, i), max_tokens, sp)));
    out.push_back(test::run_to_completion(*r.eng, 1)[0]);
    REQUIRE(out.back().size() == max_tokens);
  }
  return out;
}

}  // namespace

TEST_CASE("greedy output is identical for batch sizes 1..32", "[engine][batching]") {
  auto m = test::make_model(test::tiny_spec());
  const std::uint32_t max_tokens = 12;
  const auto expected = alone(m, 32, max_tokens);
  // The check is meaningful: different prompts give different continuations.
  CHECK(expected[0] != expected[1]);
  for (std::size_t batch : {2u, 5u, 16u, 32u}) {
    CAPTURE(batch);
    rig r(m, 4096);
    for (std::size_t i = 0; i < batch; ++i)
      REQUIRE(r.eng->submit(request(i, test::test_prompt(5 + i % 7 * 3, m->config().vocab_size, i), max_tokens)));
    const auto got = test::run_to_completion(*r.eng, batch);
    for (std::size_t i = 0; i < batch; ++i) CHECK(got[i] == expected[i]);
  }
}

TEST_CASE("sequences joining mid-flight, chunked prefill and preemption keep outputs exact", "[engine][batching]") {
  auto m = test::make_model(test::tiny_spec(model::tensor_type::q8_0));
  const std::uint32_t max_tokens = 20;
  engine::sampling_params seeded{0.9f, 0.95f, 40, 1234};
  const auto expected = alone(m, 12, max_tokens, seeded);

  SECTION("join one per step with a small token budget") {
    engine::cpu_engine_config cfg;
    cfg.scheduler.max_batch_tokens = 9;
    cfg.scheduler.prefill_chunk = 4;
    rig r(m, 4096, cfg);
    std::vector<std::vector<std::int32_t>> got(12);
    std::size_t submitted = 0;
    while (submitted < 12 || !r.eng->idle()) {
      if (submitted < 12) {
        REQUIRE(r.eng->submit(request(submitted, test::test_prompt(5 + submitted % 7 * 3, m->config().vocab_size, submitted),
                                      max_tokens, seeded)));
        ++submitted;
      }
      for (const auto& t : r.eng->step().tokens) got[t.id].push_back(t.token);
    }
    for (std::size_t i = 0; i < 12; ++i) CHECK(got[i] == expected[i]);
  }
  SECTION("a KV cache too small for everyone forces preemption") {
    rig r(m, 160);  // 10 blocks of 16 tokens for 12 requests of up to ~43 tokens
    for (std::size_t i = 0; i < 12; ++i)
      REQUIRE(r.eng->submit(request(i, test::test_prompt(5 + i % 7 * 3, m->config().vocab_size, i), max_tokens, seeded)));
    std::uint64_t preempted = 0;
    const auto got = test::run_to_completion(*r.eng, 12, &preempted);
    CHECK(preempted > 0);  // the rare path really ran
    for (std::size_t i = 0; i < 12; ++i) CHECK(got[i] == expected[i]);
    CHECK(r.eng->stats().kv_free_tokens == r.eng->stats().kv_capacity_tokens);
  }
}

TEST_CASE("a resumed request continues exactly where it stopped", "[engine][resume]") {
  auto m = test::make_model(test::tiny_spec(model::tensor_type::f16));
  const auto prompt = test::test_prompt(9, m->config().vocab_size, 42);
  for (const engine::sampling_params sp : {engine::sampling_params{}, engine::sampling_params{1.0f, 0.9f, 0, 77}}) {
    rig full(m, 512);
    REQUIRE(full.eng->submit(request(0, prompt, 24, sp)));
    const auto whole = test::run_to_completion(*full.eng, 1)[0];
    REQUIRE(whole.size() == 24);

    rig resumed(m, 512);
    auto req = request(0, prompt, 24, sp);
    req.resume_tokens.assign(whole.begin(), whole.begin() + 10);
    REQUIRE(resumed.eng->submit(req));
    std::vector<std::int32_t> rest;
    while (!resumed.eng->idle())
      for (const auto& t : resumed.eng->step().tokens) {
        CHECK(t.index == 10 + rest.size());
        rest.push_back(t.token);
      }
    CHECK(rest == std::vector<std::int32_t>(whole.begin() + 10, whole.end()));
  }
}

TEST_CASE("stop tokens and max_tokens end generation", "[engine]") {
  auto m = test::make_model(test::tiny_spec());
  rig r(m, 512);
  const auto prompt = test::test_prompt(6, m->config().vocab_size, 5);
  REQUIRE(r.eng->submit(request(0, prompt, 10)));
  const auto free_run = test::run_to_completion(*r.eng, 1)[0];
  REQUIRE(free_run.size() == 10);

  auto req = request(0, prompt, 10);
  req.stop_tokens = {free_run[4]};
  REQUIRE(r.eng->submit(req));
  std::vector<std::int32_t> got;
  engine::finish_reason reason = engine::finish_reason::length;
  while (!r.eng->idle()) {
    auto s = r.eng->step();
    for (auto& t : s.tokens) got.push_back(t.token);
    for (auto& f : s.finished) reason = f.reason;
  }
  // Stops before the first occurrence of the stop token, which is not emitted.
  const auto first = std::find(free_run.begin(), free_run.end(), free_run[4]) - free_run.begin();
  CHECK(got == std::vector<std::int32_t>(free_run.begin(), free_run.begin() + first));
  CHECK(reason == engine::finish_reason::stop);
}

TEST_CASE("cancellation frees KV blocks at once", "[engine][kv]") {
  auto m = test::make_model(test::tiny_spec());
  rig r(m, 512);
  REQUIRE(r.eng->submit(request(7, test::test_prompt(40, m->config().vocab_size, 1), 50)));
  r.eng->step();
  const auto before = r.eng->stats();
  CHECK(before.kv_free_tokens < before.kv_capacity_tokens);
  r.eng->cancel(7);
  CHECK(r.eng->stats().kv_free_tokens == before.kv_capacity_tokens);
  const auto s = r.eng->step();
  REQUIRE(s.finished.size() == 1);
  CHECK(s.finished[0].reason == engine::finish_reason::cancelled);
  CHECK(r.eng->idle());
}

TEST_CASE("bad requests are refused with errors naming the problem", "[engine][errors]") {
  auto m = test::make_model(test::tiny_spec());
  engine::cpu_engine_config cfg;
  cfg.scheduler.max_waiting = 2;
  rig r(m, 256, cfg);
  const auto vocab = m->config().vocab_size;
  const auto check = [&](engine::generation_request req, errc code, const char* text) {
    auto res = r.eng->submit(std::move(req));
    REQUIRE_FALSE(res.has_value());
    CHECK(res.error().code == code);
    CHECK_THAT(res.error().message, Catch::Contains(text));
  };
  check(request(1, {}, 4), errc::invalid_argument, "prompt is empty");
  check(request(1, {1, 2, static_cast<std::int32_t>(vocab)}, 4), errc::invalid_argument, "outside the vocabulary");
  check(request(1, {1, -5}, 4), errc::invalid_argument, "token id -5");
  check(request(1, test::test_prompt(500, vocab, 1), 20), errc::invalid_argument, "context length");
  check(request(1, test::test_prompt(200, vocab, 1), 100), errc::invalid_argument, "KV cache capacity");
  check(request(1, {1, 2}, 4, {-1.0f, 1.0f, 0, 0}), errc::invalid_argument, "temperature");
  check(request(1, {1, 2}, 4, {1.0f, 0.0f, 0, 0}), errc::invalid_argument, "top_p");
  REQUIRE(r.eng->submit(request(1, {1, 2}, 4)));
  check(request(1, {1, 2}, 4), errc::invalid_argument, "already active");
  REQUIRE(r.eng->submit(request(2, {1, 2}, 4)));
  check(request(3, {1, 2}, 4), errc::overloaded, "queue is full");
  // Refused requests left nothing behind; the good ones still complete.
  const auto got = test::run_to_completion(*r.eng, 3);
  CHECK(got[1].size() == 4);
  CHECK(got[2].size() == 4);
}

TEST_CASE("logprobs come with tokens only when asked, and do not change the tokens", "[engine][logprobs]") {
  auto m = test::make_model(test::tiny_spec());
  const auto prompt = test::test_prompt(6, m->config().vocab_size, 9);
  const engine::sampling_params hot{1.3f, 0.9f, 0, 42};
  rig plain(m, 512), asked(m, 512);
  REQUIRE(plain.eng->submit(request(0, prompt, 8, hot)));
  auto req = request(0, prompt, 8, hot);
  req.logprobs = true;
  req.top_logprobs = 4;
  REQUIRE(asked.eng->submit(req));
  std::vector<std::int32_t> a, b;
  while (!plain.eng->idle())
    for (const auto& t : plain.eng->step().tokens) {
      CHECK_FALSE(t.logprobs.has_value());  // the zero-cost path
      a.push_back(t.token);
    }
  while (!asked.eng->idle())
    for (const auto& t : asked.eng->step().tokens) {
      REQUIRE(t.logprobs.has_value());
      CHECK(t.logprobs->top_ids.size() == 4);
      CHECK(t.logprobs->logprob <= t.logprobs->top_logprobs[0]);  // nothing beats the best
      CHECK(std::is_sorted(t.logprobs->top_logprobs.rbegin(), t.logprobs->top_logprobs.rend()));
      b.push_back(t.token);
    }
  CHECK(a == b);

  req.top_logprobs = engine::max_top_logprobs + 1;
  auto refused = asked.eng->submit(req);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == errc::invalid_argument);
  CHECK_THAT(refused.error().message, Catch::Contains("top_logprobs must be at most 20"));
}

TEST_CASE("a model that overflows ends only the requests it reaches, with nonfinite_logits, emitting nothing after",
          "[engine][errors]") {
  const auto type = GENERATE(model::tensor_type::f32, model::tensor_type::q8_0);
  CAPTURE(model::to_string(type));
  auto clean = test::make_model(test::tiny_spec(type));
  const auto vocab = clean->config().vocab_size;
  const auto a_prompt = test::test_prompt(9, vocab, 31), c_prompt = test::test_prompt(7, vocab, 32);
  std::vector<std::vector<std::int32_t>> ref;
  {
    rig r(clean, 1024);
    REQUIRE(r.eng->submit(request(0, a_prompt, 12)));
    REQUIRE(r.eng->submit(request(1, c_prompt, 12)));
    ref = test::run_to_completion(*r.eng, 2);
  }
  // The poisoned token: one C generates (at k >= 1) that nothing else reads.
  const auto absent = [](const std::vector<std::int32_t>& v, std::int32_t t) {
    return std::find(v.begin(), v.end(), t) == v.end();
  };
  std::size_t k = 1;
  while (k < ref[1].size() &&
         !(absent(a_prompt, ref[1][k]) && absent(ref[0], ref[1][k]) && absent(c_prompt, ref[1][k]) &&
           absent({ref[1].begin(), ref[1].begin() + static_cast<std::ptrdiff_t>(k)}, ref[1][k])))
    ++k;
  REQUIRE(k < ref[1].size());
  const std::int32_t poison = ref[1][k];
  auto m = test::make_poisoned_model(test::tiny_spec(type), poison);

  // A never sees the token; B has it in its prompt (and samples); C generates it.
  auto b_prompt = a_prompt;
  b_prompt.insert(b_prompt.begin() + 4, poison);
  rig r(m, 1024);
  REQUIRE(r.eng->submit(request(0, a_prompt, 12)));
  REQUIRE(r.eng->submit(request(1, b_prompt, 12, engine::sampling_params{0.9f, 0.95f, 40, 99})));
  REQUIRE(r.eng->submit(request(2, c_prompt, 12)));
  std::vector<std::vector<std::int32_t>> got(3);
  std::vector<std::optional<engine::finish_event>> fin(3);
  for (int steps = 0; !r.eng->idle() && steps < 200; ++steps) {
    const auto s = r.eng->step();
    for (const auto& t : s.tokens) got[t.id].push_back(t.token);
    for (const auto& f : s.finished) fin[f.id] = f;
  }
  REQUIRE(r.eng->idle());
  REQUIRE(fin[0].has_value());
  REQUIRE(fin[1].has_value());
  REQUIRE(fin[2].has_value());
  CHECK(got[0] == ref[0]);
  CHECK(fin[0]->reason == engine::finish_reason::length);
  CHECK(got[1].empty());
  CHECK(fin[1]->reason == engine::finish_reason::nonfinite_logits);
  CHECK(fin[1]->generated == 0);
  CHECK(got[2] == std::vector<std::int32_t>(ref[1].begin(), ref[1].begin() + static_cast<std::ptrdiff_t>(k) + 1));
  CHECK(fin[2]->reason == engine::finish_reason::nonfinite_logits);
  CHECK(fin[2]->generated == k + 1);
  const auto st = r.eng->stats();
  CHECK(st.nonfinite_logit_finishes == 2);
  CHECK(st.kv_free_tokens == st.kv_capacity_tokens);
  CHECK(engine::to_string(engine::finish_reason::nonfinite_logits) == "nonfinite_logits");
  CHECK(engine::nonfinite_logits_message(3).find("generated token 3") != std::string::npos);
}
