// Scheduling across tenants inside a replica (issue 13): the per-tenant
// usage counters, the CPU engine's batch scheduler (a light tenant's prompt
// first, a heavy tenant's decodes sitting out a bounded number of steps),
// the simulated engine (chunked prefill in fair order, so a light tenant's
// request starts at the next chunk boundary), and what must not change:
// every request's tokens, whatever shares its steps.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <functional>
#include <map>
#include <optional>

#include "engine/batch_scheduler.hpp"
#include "engine/fair_stop.hpp"
#include "engine/kv_cache.hpp"
#include "engine/llama_forward.hpp"
#include "engine/sim_engine.hpp"
#include "engine/tenant_usage.hpp"
#include "fixtures.hpp"
#include "gpu/cpu_memory_pool.hpp"

using namespace exa;
using namespace exa::engine;

// ---- tenant_usage -------------------------------------------------------------

TEST_CASE("tenant usage: tokens over weight, halved every window", "[fair]") {
  tenant_usage u({.window_tokens = 1000, .max_tenants = 8, .lately_tokens = 64});
  const auto a = u.intern("a", 1);
  const auto b = u.intern("b", 2);
  CHECK(u.intern("a", 1) == a);
  CHECK(a != b);
  u.charge(a, 300);
  u.charge(b, 600);
  CHECK(u.usage(a) == 300);
  CHECK(u.usage(b) == 300);  // twice the tokens at twice the weight
  // A new weight takes effect when the engine's next step begins.
  CHECK(u.intern("b", 3) == b);
  CHECK(u.usage(b) == 300);
  u.adopt_weights();
  CHECK(u.usage(b) == 200);
  u.intern("b", 2);
  u.adopt_weights();
  CHECK(u.served_lately(a));
  // 900 of 1000 charged: the next 100 halve everything.
  u.charge(b, 100);
  CHECK(u.usage(a) == 150);
  CHECK(u.usage(b) == 175);  // 700 / 2 tokens at weight 2
  // Idle long enough, a tenant is forgotten: below lately_tokens it no
  // longer counts, and below half a token its counter is zero.
  u.charge(b, 3000);
  CHECK(u.usage(a) == Approx(150.0 / 8));
  CHECK_FALSE(u.served_lately(a));
  u.charge(b, 10000);
  CHECK(u.usage(a) == 0);
}

TEST_CASE("tenant usage: a refund takes back a charge as it has decayed since, never below zero", "[fair]") {
  tenant_usage u({.window_tokens = 1000, .max_tenants = 8, .lately_tokens = 64});
  const auto a = u.intern("a", 1);
  const auto b = u.intern("b", 1);
  CHECK_FALSE(u.find("c"));
  CHECK(u.find("b") == b);
  u.charge(a, 400);
  const std::uint64_t at = u.halvings();
  u.charge(b, 300);
  u.refund(b, 300, at);  // no halving since: as if never charged
  CHECK(u.usage(b) == 0);
  u.charge(b, 300);      // the window's count was taken back too: 700 of 1000
  CHECK(u.halvings() == at);
  u.charge(a, 300);      // 1000: everything halves
  REQUIRE(u.halvings() == at + 1);
  CHECK(u.usage(b) == 150);
  u.refund(b, 100, at);  // charged before the halving: 50 left of it
  CHECK(u.usage(b) == 100);
  u.refund(b, 1000, at);
  CHECK(u.usage(b) == 0);
}

TEST_CASE("tenant usage: shares follow the weights, among tenants served lately", "[fair]") {
  tenant_usage u({.window_tokens = 1u << 30, .max_tenants = 8, .lately_tokens = 64});
  const auto a = u.intern("a", 1);
  const auto b = u.intern("b", 3);
  const auto c = u.intern("c", 1);  // never served
  u.charge(a, 300);
  u.charge(b, 600);
  CHECK(u.over_share(a, a));      // a third of the service at a quarter of the weight
  CHECK_FALSE(u.over_share(b, b));
  // c has work but no service: beside it, a's share of the weight is a fifth.
  CHECK(u.over_share(a, c));
  // With one tenant served, it is at its share exactly: not over.
  tenant_usage one;
  const auto only = one.intern("", 1);
  one.charge(only, 5000);
  CHECK_FALSE(one.over_share(only, only));
}

TEST_CASE("tenant usage: bounded slots, restore, and weights checked", "[fair]") {
  tenant_usage u({.window_tokens = 1u << 30, .max_tenants = 2, .lately_tokens = 64});
  const auto a = u.intern("a", 1);
  const auto b = u.intern("b", 1);
  CHECK(u.intern("c", 1) == b);  // past the bound, tenants share the last slot
  CHECK(u.slots() == 2);
  u.charge(a, 10);
  tenant_usage::snapshot saved;
  u.save(saved);
  u.charge(a, 90);
  u.charge(b, 50);
  u.restore(saved);
  CHECK(u.usage(a) == 10);
  CHECK(u.usage(b) == 0);

  CHECK(check_tenant_weight(0.5));
  for (const double bad : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    CAPTURE(bad);
    const auto ok = check_tenant_weight(bad);
    REQUIRE_FALSE(ok);
    CHECK(ok.error().code == errc::invalid_argument);
    CHECK(ok.error().message.find("tenant_weight") != std::string::npos);
  }
}

// ---- batch scheduler (CPU engine) -----------------------------------------------

namespace {

struct sched_rig {
  std::unique_ptr<gpu::cpu_memory_pool> pool;
  kv_cache cache;
  batch_scheduler sched;

  sched_rig(std::uint32_t blocks, scheduler_config cfg)
      : pool(std::move(*gpu::cpu_memory_pool::create(kv_layout{1, 8, 4}.block_bytes(), blocks))),
        cache(*pool, {1, 8, 4}),
        sched(cfg, cache) {}

  void add(seq_id id, std::uint32_t prompt, std::string tenant,
           request_priority priority = request_priority::interactive) {
    auto s = std::make_unique<sequence>();
    s->request.id = id;
    s->request.max_tokens = 1000;
    s->request.tenant = std::move(tenant);
    s->request.priority = priority;
    s->tokens.assign(prompt, 1);
    s->prompt_len = prompt;
    sched.enqueue(std::move(s));
  }

  // Plans a step and applies it as the engine would (a token per finished chunk).
  std::vector<std::pair<seq_id, std::uint32_t>> step() {
    std::uint32_t preempted = 0;
    auto plan = sched.plan(preempted);
    std::vector<std::pair<seq_id, std::uint32_t>> out;
    for (auto& c : plan) {
      out.emplace_back(c.seq->request.id, c.n_tokens);
      c.seq->computed += c.n_tokens;
      if (c.seq->computed == c.seq->tokens.size()) c.seq->tokens.push_back(2);
    }
    return out;
  }
};

using plan_t = std::vector<std::pair<seq_id, std::uint32_t>>;

scheduler_config small_config() {
  scheduler_config cfg{/*max_batch_tokens=*/64, /*max_running=*/4, /*max_waiting=*/100, /*prefill_chunk=*/4};
  cfg.max_held_steps = 2;
  return cfg;
}

}  // namespace

TEST_CASE("scheduler: a light tenant's prompt goes first, and heavy decodes sit out a bounded number of steps",
          "[fair][scheduler]") {
  sched_rig r(256, small_config());
  for (seq_id id = 1; id <= 3; ++id) r.add(id, 8, "heavy");
  for (int i = 0; i < 12; ++i) r.step();  // prefilled, then decoding: the heavy tenant has been served
  r.add(4, 8, "heavy");
  r.add(5, 24, "light");  // later, but its tenant has been served nothing
  // One place in the running set: the light prompt takes it, and the heavy
  // decodes sit out its steps, two in a row at most.
  const plan_t light_only{{5, 4}};
  const plan_t with_decodes{{1, 1}, {2, 1}, {3, 1}, {5, 4}};
  const std::vector<plan_t> want{light_only, light_only, with_decodes, light_only, light_only, with_decodes};
  for (std::size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    CHECK(r.step() == want[i]);
  }
  CHECK(r.sched.running() == 4);
  CHECK(r.sched.waiting() == 1);  // the heavy tenant's newcomer waits for a place
  // Prefilled: the light tenant decodes beside the heavy one, nothing held.
  CHECK(r.step() == plan_t{{1, 1}, {2, 1}, {3, 1}, {5, 1}});
  CHECK(r.sched.held_decodes() == 0);
}

TEST_CASE("scheduler: a heavy tenant's prefill chunks and admissions sit out with its decodes", "[fair][scheduler]") {
  scheduler_config cfg = small_config();
  cfg.max_running = 6;
  sched_rig r(256, cfg);
  for (seq_id id = 1; id <= 3; ++id) r.add(id, 8, "heavy");
  for (int i = 0; i < 12; ++i) r.step();
  r.add(4, 40, "heavy");
  CHECK(r.step() == plan_t{{1, 1}, {2, 1}, {3, 1}, {4, 4}});  // one tenant: first come
  r.add(5, 8, "heavy");
  r.add(6, 8, "light");
  // The light prompt alone: no heavy decode, no chunk of the heavy prompt
  // being prefilled, no heavy admission -- two steps in a row at most.
  CHECK(r.step() == plan_t{{6, 4}});
  CHECK(r.sched.held_decodes() == 3);
  CHECK(r.sched.waiting() == 1);
  CHECK(r.step() == plan_t{{6, 4}});
  const plan_t all = r.step();
  CHECK(all.size() == 6);  // everything again: 1-3, 4's chunk, 6's decode, 5 admitted
  CHECK(r.sched.waiting() == 0);
}

TEST_CASE("scheduler: tenants over their share prefill at most fair_prefill_tokens a step, in all",
          "[fair][scheduler]") {
  scheduler_config cfg = small_config();
  cfg.max_running = 6;
  cfg.fair_prefill_tokens = 6;
  sched_rig r(256, cfg);
  r.add(1, 40, "heavy");
  r.add(2, 4, "light");
  for (int i = 0; i < 14; ++i) r.step();  // heavy served 40 and more, light a few tokens
  r.add(3, 40, "heavy");
  r.add(4, 40, "heavy");
  std::uint32_t heavy_prefilled = 0;
  for (int i = 0; i < 40; ++i) {
    CAPTURE(i);
    std::uint32_t heavy_prompt = 0;
    for (const auto& [id, n] : r.step())
      if (id == 3 || id == 4) heavy_prompt += n;  // prompt chunks until both are prefilled (the loop ends then)
    CHECK(heavy_prompt <= 6);
    heavy_prefilled += heavy_prompt;
    if (heavy_prefilled >= 80) break;
  }
  CHECK(heavy_prefilled >= 80);  // they progress, six tokens a step
  // With one tenant there is no cap: first come, chunks of prefill_chunk.
  sched_rig one(256, cfg);
  one.add(1, 40, "heavy");
  one.add(2, 40, "heavy");
  CHECK(one.step() == plan_t{{1, 4}, {2, 4}});
}

TEST_CASE("scheduler: one tenant keeps first-come order and never holds decodes back", "[fair][scheduler]") {
  sched_rig r(256, small_config());
  for (seq_id id = 1; id <= 3; ++id) r.add(id, 8, "only");
  for (int i = 0; i < 12; ++i) r.step();
  r.add(4, 8, "only");
  r.add(5, 24, "only");
  CHECK(r.step() == plan_t{{1, 1}, {2, 1}, {3, 1}, {4, 4}});  // first come
  CHECK(r.sched.held_decodes() == 0);
  CHECK(r.step() == plan_t{{1, 1}, {2, 1}, {3, 1}, {4, 4}});
}

TEST_CASE("scheduler: batch decodes yield to an interactive prompt of the same tenant", "[fair][scheduler]") {
  sched_rig r(256, small_config());
  for (seq_id id = 1; id <= 3; ++id) r.add(id, 8, "t", request_priority::batch);
  for (int i = 0; i < 12; ++i) r.step();
  r.add(4, 8, "t", request_priority::batch);
  r.add(5, 8, "t", request_priority::interactive);
  CHECK(r.step() == plan_t{{5, 4}});
  CHECK(r.sched.held_decodes() == 3);
  CHECK(r.step() == plan_t{{5, 4}});
  CHECK(r.step() == plan_t{{1, 1}, {2, 1}, {3, 1}, {5, 1}});
}

TEST_CASE("scheduler: a tenant over its share is admitted within fair_context_tokens only", "[fair][scheduler]") {
  // Every sequence reserves 8 + 1000 tokens of context here; the bound
  // holds four of them.
  const auto run = [](std::uint64_t bound, const std::string& second) {
    scheduler_config cfg = small_config();
    cfg.max_running = 8;
    cfg.fair_context_tokens = bound;
    cfg.usage.lately_tokens = 1;
    sched_rig r(256, cfg);
    r.add(1, 8, "heavy");
    r.add(2, 8, "heavy");
    for (int i = 0; i < 4; ++i) r.step();  // the heavy tenant has been served
    r.add(3, 8, second);
    for (seq_id id = 4; id <= 6; ++id) r.add(id, 8, "heavy");
    for (int i = 0; i < 8; ++i) r.step();
    const std::size_t running = r.sched.running();
    r.add(7, 8, second);  // the light tenant is still admitted past the bound
    for (int i = 0; i < 4; ++i) r.step();
    return std::pair{running, r.sched.running()};
  };
  CHECK(run(4 * 1008, "light") == std::pair<std::size_t, std::size_t>{4, 5});  // the fourth heavy waits
  CHECK(run(0, "light") == std::pair<std::size_t, std::size_t>{6, 7});         // no bound
  CHECK(run(4 * 1008, "heavy") == std::pair<std::size_t, std::size_t>{6, 7});  // one tenant: unbounded
  // A tenant with nothing running is admitted whatever the bound.
  scheduler_config cfg = small_config();
  cfg.fair_context_tokens = 10;
  cfg.usage.lately_tokens = 1;
  sched_rig r(256, cfg);
  r.add(1, 8, "heavy");
  for (int i = 0; i < 4; ++i) r.step();
  r.sched.finish(1);
  r.add(2, 8, "light");
  r.add(3, 8, "heavy");
  r.add(4, 8, "heavy");
  for (int i = 0; i < 4; ++i) r.step();
  CHECK(r.sched.running() == 2);  // the light one and one heavy
  CHECK(r.sched.waiting() == 1);
}

// ---- CPU engine -----------------------------------------------------------------

TEST_CASE("cpu engine: across tenants every request still gets the tokens it gets alone", "[fair][engine]") {
  auto m = test::make_model(test::tiny_spec(model::tensor_type::q8_0));
  const std::uint32_t vocab = m->config().vocab_size;
  const sampling_params seeded{0.9f, 0.95f, 40, 99};
  const auto make = [&](std::size_t i) {
    generation_request r = test::request(i, test::test_prompt(6 + i % 5 * 4, vocab, i), 10, seeded);
    r.tenant = i % 3 == 0 ? "light" : "heavy";
    r.tenant_weight = i % 3 == 0 ? 2.0 : 1.0;
    r.priority = i % 4 == 3 ? request_priority::batch : request_priority::interactive;
    return r;
  };
  std::vector<std::vector<std::int32_t>> alone;
  for (std::size_t i = 0; i < 9; ++i) {
    thread_pool threads(1);
    auto pool = test::make_pool(*m, 512);
    cpu_engine e(m, *pool, threads, {});
    generation_request r = make(i);
    r.id = 0;  // run_to_completion's numbering
    REQUIRE(e.submit(r));
    alone.push_back(test::run_to_completion(e, 1)[0]);
  }
  // Without and with a context bound that holds the heavy tenant to a few
  // sequences (each reserves at most 32 tokens here).
  for (const std::uint64_t context_bound : {std::uint64_t{0}, std::uint64_t{70}}) {
    CAPTURE(context_bound);
    cpu_engine_config cfg;
    cfg.scheduler.max_batch_tokens = 12;
    cfg.scheduler.prefill_chunk = 4;
    cfg.scheduler.usage.lately_tokens = 1;
    cfg.scheduler.fair_context_tokens = context_bound;
    thread_pool threads(2);
    auto pool = test::make_pool(*m, 1024);
    cpu_engine e(m, *pool, threads, cfg);
    std::vector<std::vector<std::int32_t>> got(9);
    std::size_t submitted = 0;
    while (submitted < 9 || !e.idle()) {
      if (submitted < 9) REQUIRE(e.submit(make(submitted++)));
      for (const auto& t : e.step().tokens) got[t.id].push_back(t.token);
    }
    for (std::size_t i = 0; i < 9; ++i) {
      CAPTURE(i);
      CHECK(got[i] == alone[i]);
    }
  }
  thread_pool threads(1);
  auto pool = test::make_pool(*m, 512);
  cpu_engine e(m, *pool, threads, {});
  generation_request bad = make(20);
  bad.tenant_weight = 0;
  const auto refused = e.submit(bad);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == errc::invalid_argument);
}

// ---- a step stopped at a layer boundary (CPU engine) ------------------------------

TEST_CASE("forward: a batch stopped at any stage boundary and resumed after another batch gives bitwise its logits",
          "[fair][engine]") {
  auto spec = test::tiny_spec(model::tensor_type::q8_0);
  spec.n_layers = 4;
  auto m = test::make_model(spec);
  const std::uint32_t vocab = m->config().vocab_size;
  auto pool = test::make_pool(*m, 1024);
  kv_cache cache(*pool, {m->config().n_layers, m->config().kv_dim(), 16});
  thread_pool threads(2);
  llama_forward fwd(m->config(), m->weights(), cache, threads);
  const std::vector<std::vector<std::int32_t>> heavy{test::test_prompt(9, vocab, 1), test::test_prompt(5, vocab, 2)};
  const std::vector<std::int32_t> light = test::test_prompt(20, vocab, 3);
  const auto batch_of = [&](const std::vector<std::pair<seq_id, const std::vector<std::int32_t>*>>& seqs) {
    return test::prompt_batch(cache, seqs);
  };
  const auto same = test::bitwise_equal;
  std::vector<float> want_heavy, want_light;
  fwd.run(batch_of({{1, &heavy[0]}, {2, &heavy[1]}}), want_heavy);
  fwd.run(batch_of({{3, &light}}), want_light);
  REQUIRE(fwd.can_yield());

  // Every stage boundary: between layers, and between a layer's attention
  // and its MLP.
  for (std::uint32_t stop = 1; stop < 2 * spec.n_layers; ++stop) {
    CAPTURE(stop);
    const seq_id base = 10 * (stop + 1);
    const forward_batch stopped = batch_of({{base + 1, &heavy[0]}, {base + 2, &heavy[1]}});
    forward_suspension state;
    std::uint32_t asked = 0;
    std::vector<float> logits;
    // Asked before stages 1, 2, ...: yes the stop-th time.
    auto ran = fwd.execute_yielding(stopped, logits, state, [&] { return ++asked == stop; });
    REQUIRE(ran.has_value());
    CHECK(*ran);
    CHECK(asked == stop);
    CHECK(state.next_stage == stop);
    CHECK(logits.empty());
    // Another batch, on other sequences, in between.
    std::vector<float> between;
    fwd.run(batch_of({{base + 3, &light}}), between);
    CHECK(same(between, want_light));
    ran = fwd.execute_yielding(stopped, logits, state, [] { return false; });
    REQUIRE(ran.has_value());
    CHECK_FALSE(*ran);
    CHECK(state.next_stage == 0);
    CHECK(same(logits, want_heavy));
  }
}

namespace {

// Three heavy requests decoding, then a light one offered while a step runs.
struct yield_rig {
  std::shared_ptr<const model::llama_model> m;
  thread_pool threads{2};
  std::unique_ptr<gpu::cpu_memory_pool> pool;
  std::unique_ptr<cpu_engine> e;
  std::map<seq_id, std::vector<std::int32_t>> got;
  std::vector<finish_event> finished;

  explicit yield_rig(std::shared_ptr<const model::llama_model> model) : m(std::move(model)) {
    cpu_engine_config cfg;
    cfg.scheduler.usage.lately_tokens = 1;
    pool = test::make_pool(*m, 1024);
    e = std::make_unique<cpu_engine>(m, *pool, threads, cfg);
  }
  step_result step() {
    step_result r = e->step();
    for (const auto& t : r.tokens) got[t.id].push_back(t.token);
    finished.insert(finished.end(), r.finished.begin(), r.finished.end());
    return r;
  }
  void drain() {
    for (int i = 0; i < 1000 && !e->idle(); ++i) step();
    REQUIRE(e->idle());
  }
};

generation_request yield_request(seq_id id, std::uint32_t vocab, const std::string& tenant,
                                 request_priority priority = request_priority::interactive) {
  generation_request r = test::request(id, test::test_prompt(5 + id * 3, vocab, id), 12, {0.8f, 0.9f, 30, 7 + id});
  r.tenant = tenant;
  r.priority = priority;
  return r;
}

// A 4-layer model: a step has 8 stages to stop at.
std::shared_ptr<const model::llama_model> four_layers() {
  auto spec = test::tiny_spec(model::tensor_type::q8_0);
  spec.n_layers = 4;
  return test::make_model(spec);
}

// Heavy requests 1-3 decoding (`extra` steps past their prefills), their
// step stopped for light request 4 (offered with `offer_id`), and 4 submitted.
void stopped_for_light(yield_rig& r, int extra = 0, seq_id offer_id = 4) {
  const std::uint32_t vocab = r.m->config().vocab_size;
  for (seq_id id = 1; id <= 3; ++id) REQUIRE(r.e->submit(yield_request(id, vocab, "heavy")));
  while (r.got.size() < 3) r.step();
  for (int i = 0; i < extra; ++i) r.step();
  r.e->offer_arrival({offer_id, "light", 1, request_priority::interactive});
  REQUIRE(r.step().yielded);  // after layer 0's attention
  REQUIRE(r.e->submit(yield_request(4, vocab, "light")));
}

std::vector<std::int32_t> tokens_alone(std::shared_ptr<const model::llama_model> m, generation_request r) {
  thread_pool threads(1);
  auto pool = test::make_pool(*m, 512);
  cpu_engine e(m, *pool, threads, {});
  r.id = 0;  // run_to_completion's numbering
  REQUIRE(e.submit(r));
  return test::run_to_completion(e, 1)[0];
}

// After a second stop, for light request 5 (submitted): its interlude, then
// the heavy step's end, then everyone's tokens as alone.
void second_interlude_then_the_rest(yield_rig& r) {
  const std::uint32_t vocab = r.m->config().vocab_size;
  const step_result second = r.step();  // the second interlude: request 5 alone
  REQUIRE(second.tokens.size() == 1);
  CHECK(second.tokens[0].id == 5);
  const step_result ended = r.step();  // the heavy step, at last
  CHECK(ended.tokens.size() == 3);     // the three heavy ones, nothing else
  for (const auto& t : ended.tokens) CHECK(t.id <= 3);
  CHECK(r.e->stats().yielded_steps == 2);
  r.drain();
  for (seq_id id = 1; id <= 5; ++id) {
    CAPTURE(id);
    CHECK(r.got[id] == tokens_alone(r.m, yield_request(id, vocab, id >= 4 ? "light" : "heavy")));
  }
}

// The first interlude (light request 4 alone), `between`, then one stage of
// the heavy step, which stops again.
void interlude_then_a_stage(yield_rig& r, const std::function<void()>& between = {}) {
  const step_result first = r.step();
  REQUIRE(first.tokens.size() == 1);
  CHECK(first.tokens[0].id == 4);
  if (between) between();
  const step_result again = r.step();
  CHECK(again.yielded);
  CHECK(again.tokens.empty());
}

}  // namespace

TEST_CASE("cpu engine: a heavy tenant's step stops at a layer boundary for a light tenant's prompt", "[fair][engine]") {
  auto m = test::make_model(test::tiny_spec(model::tensor_type::q8_0));
  const std::uint32_t vocab = m->config().vocab_size;
  yield_rig r(m);
  for (seq_id id = 1; id <= 3; ++id) REQUIRE(r.e->submit(yield_request(id, vocab, "heavy")));
  while (r.got.size() < 3) r.step();  // all three prefilled: decoding now
  const auto before = r.got;

  // The light request is offered while the next step runs (here: before it;
  // the step asks at its first layer boundary).
  r.e->offer_arrival({0, "light", 1, request_priority::interactive});
  const step_result stopped = r.step();
  CHECK(stopped.yielded);
  CHECK(stopped.tokens.empty());
  CHECK(stopped.decode_tokens == 0);
  CHECK(r.e->stats().yielded_steps == 1);
  CHECK_FALSE(r.e->idle());
  REQUIRE(r.e->submit(yield_request(4, vocab, "light")));
  // The interlude: the light prompt alone, its first token at its end.
  const step_result interlude = r.step();
  CHECK_FALSE(interlude.yielded);
  REQUIRE(interlude.tokens.size() == 1);
  CHECK(interlude.tokens[0].id == 4);
  CHECK(interlude.tokens[0].index == 0);
  CHECK(interlude.prefill_tokens == yield_request(4, vocab, "light").prompt.size());
  // Then the stopped step ends: one token for each heavy request.
  const step_result resumed = r.step();
  CHECK(resumed.tokens.size() == 3);
  for (const auto& t : resumed.tokens) CHECK(t.id != 4);
  CHECK(r.got == [&] {
    auto want = before;
    want[4] = {interlude.tokens[0].token};
    for (const auto& t : resumed.tokens) want[t.id].push_back(t.token);
    return want;
  }());
  r.drain();
  // Every request's tokens as alone, bitwise (seeded sampling reads every logit).
  for (seq_id id = 1; id <= 4; ++id) {
    CAPTURE(id);
    CHECK(r.got[id] == tokens_alone(m, yield_request(id, vocab, id == 4 ? "light" : "heavy")));
  }
  CHECK(r.e->stats().yielded_steps == 1);
}

TEST_CASE("cpu engine: a stopped step may stop again as it goes on, for a later arrival", "[fair][engine]") {
  auto m = four_layers();
  const std::uint32_t vocab = m->config().vocab_size;
  yield_rig r(m);
  stopped_for_light(r, 0, 0);
  // The second light request is offered while the first one's interlude
  // runs: the stopped step stops again at its next boundary, for it.
  r.e->offer_arrival({0, "light", 1, request_priority::interactive});
  interlude_then_a_stage(r);
  REQUIRE(r.e->submit(yield_request(5, vocab, "light")));
  second_interlude_then_the_rest(r);
}

TEST_CASE("cpu engine: a prompt that arrives while the interlude runs stops the rest of the step at its next boundary",
          "[fair][engine]") {
  // As a replica does it: a request arriving while a step runs is offered
  // with its id, and submitted when the step returns; one arriving between
  // steps is submitted without an offer. Either way, once the first light
  // prompt's interlude is over, the second one is here (submitted), and the
  // stopped heavy step must not run to its end before it.
  auto m = four_layers();
  const std::uint32_t vocab = m->config().vocab_size;
  yield_rig r(m);
  stopped_for_light(r);
  SECTION("offered while the interlude ran, submitted after it") {
    r.e->offer_arrival({5, "light", 1, request_priority::interactive});
  }
  SECTION("submitted between the steps, never offered") {}
  // The interlude, request 5 submitted, then the heavy step goes on one
  // stage and stops.
  interlude_then_a_stage(r, [&] { REQUIRE(r.e->submit(yield_request(5, vocab, "light"))); });
  second_interlude_then_the_rest(r);
}

TEST_CASE("cpu engine: an arrival done within its own interlude leaves no offer behind to stop the step again",
          "[fair][engine]") {
  auto m = four_layers();
  const std::uint32_t vocab = m->config().vocab_size;
  yield_rig r(m);
  // The heavy tenant served well ahead, so that the light one is still the
  // lighter after both of its prompts (the stale offer would stop the step).
  stopped_for_light(r, 6);
  r.e->offer_arrival({5, "light", 1, request_priority::interactive});  // during 4's interlude
  REQUIRE(r.step().tokens.size() == 1);
  generation_request one = yield_request(5, vocab, "light");
  one.max_tokens = 1;  // finished by its interlude, and gone
  REQUIRE(r.e->submit(one));
  REQUIRE(r.step().yielded);  // the rest stops for 5
  const step_result second = r.step();
  REQUIRE(second.tokens.size() == 1);
  CHECK(second.tokens[0].id == 5);
  const step_result ended = r.step();  // no stop for 5's offer, long answered
  CHECK_FALSE(ended.yielded);
  CHECK(ended.tokens.size() == 3);
  CHECK(r.e->stats().yielded_steps == 2);
  r.drain();
}

TEST_CASE("cpu engine: a step does not stop for an arrival that does not go before all of it", "[fair][engine]") {
  auto m = test::make_model(test::tiny_spec(model::tensor_type::q8_0));
  const std::uint32_t vocab = m->config().vocab_size;
  // Requests 1 and 2 of the heavy tenant decoding (and `other`, when named,
  // of another tenant, interactive).
  const auto decoding = [&](yield_rig& r, request_priority heavy, const std::string& other = "") {
    for (seq_id id = 1; id <= 2; ++id) REQUIRE(r.e->submit(yield_request(id, vocab, "heavy", heavy)));
    if (!other.empty()) REQUIRE(r.e->submit(yield_request(3, vocab, other)));
    while (r.got.size() < (other.empty() ? 2u : 3u)) r.step();
  };
  SECTION("the same tenant; a batch arrival beside interactive work; work that does not yield beside work that does") {
    struct no_stop {
      request_priority heavy;
      std::string other;  // a tenant with an interactive request decoding too
      arrival_hint offer;
    };
    const std::vector<no_stop> cases{
        {request_priority::interactive, "", {0, "heavy", 1, request_priority::interactive}},
        {request_priority::interactive, "", {0, "light", 1, request_priority::batch}},
        // Heavy batch work yields to a batch arrival of a tenant served
        // less, but the other tenant's interactive decode goes before it.
        {request_priority::batch, "other", {0, "light", 1, request_priority::batch}},
    };
    for (std::size_t i = 0; i < cases.size(); ++i) {
      CAPTURE(i);
      yield_rig r(m);
      decoding(r, cases[i].heavy, cases[i].other);
      r.e->offer_arrival(cases[i].offer);
      CHECK_FALSE(r.step().yielded);
      CHECK(r.e->stats().yielded_steps == 0);
    }
  }
  SECTION("an offer whose request was submitted already") {
    yield_rig r(m);
    decoding(r, request_priority::interactive);
    REQUIRE(r.e->submit(yield_request(3, vocab, "light")));
    // Offered while an earlier step ran, weighed only now: the plan has it.
    r.e->offer_arrival({3, "light", 1, request_priority::interactive});
    CHECK_FALSE(r.step().yielded);
    r.e->offer_arrival({4, "light", 1, request_priority::interactive});  // a request still to come
    CHECK(r.step().yielded);
  }
  SECTION("but a step with the arrival's own tenant's work beside heavy work stops") {
    yield_rig r(m);
    decoding(r, request_priority::interactive);
    REQUIRE(r.e->submit(yield_request(3, vocab, "light")));
    while (r.got.size() < 3) r.step();  // the light one decodes beside them now
    r.e->offer_arrival({0, "light", 1, request_priority::interactive});
    CHECK(r.step().yielded);
    REQUIRE(r.e->submit(yield_request(4, vocab, "light")));
    r.drain();
    for (seq_id id = 1; id <= 4; ++id) {
      CAPTURE(id);
      CHECK(r.got[id] == tokens_alone(m, yield_request(id, vocab, id >= 3 ? "light" : "heavy")));
    }
  }
  SECTION("but batch work stops for an interactive arrival of its own tenant") {
    yield_rig r(m);
    decoding(r, request_priority::batch);
    r.e->offer_arrival({0, "heavy", 1, request_priority::interactive});
    CHECK(r.step().yielded);
    REQUIRE(r.e->submit(yield_request(3, vocab, "heavy")));
    r.drain();
    for (seq_id id = 1; id <= 3; ++id) {
      CAPTURE(id);
      CHECK(r.got[id] == tokens_alone(m, yield_request(id, vocab, "heavy", id <= 2 ? request_priority::batch
                                                                                  : request_priority::interactive)));
    }
  }
}

namespace {

// The CPU forward pass, but a decode-only step runs whole without asking
// while `whole` is set, as the CUDA forward runs its short decode steps.
class whole_decode_forward final : public forward_executor {
 public:
  // `pages` only addresses the engine's blocks in `pool` (it reserves none).
  whole_decode_forward(const model::llama_model& m, block_pool& pool, thread_pool& threads)
      : pages_(pool, {m.config().n_layers, m.config().kv_dim(), 16}), inner_(m.config(), m.weights(), pages_, threads) {}
  bool whole = true;
  expected<void> execute(const forward_batch& batch, std::vector<float>& logits) override {
    return inner_.execute(batch, logits);
  }
  bool can_yield() const noexcept override { return true; }
  expected<bool> execute_yielding(const forward_batch& batch, std::vector<float>& logits, forward_suspension& state,
                                  const std::function<bool()>& should_yield) override {
    if (whole && state.next_stage == 0 && batch.tokens.size() == batch.tables.size()) {
      if (auto ok = inner_.execute(batch, logits); !ok) return std::unexpected(ok.error());
      return false;
    }
    return inner_.execute_yielding(batch, logits, state, should_yield);
  }

 private:
  kv_cache pages_;
  llama_forward inner_;
};

}  // namespace

TEST_CASE("cpu engine: an offer made while a step runs whole without asking does not outlive that step",
          "[fair][engine]") {
  auto m = test::make_model(test::tiny_spec(model::tensor_type::q8_0));
  const std::uint32_t vocab = m->config().vocab_size;
  thread_pool threads(1);
  auto pool = test::make_pool(*m, 1024);
  auto fwd = std::make_unique<whole_decode_forward>(*m, *pool, threads);
  whole_decode_forward& f = *fwd;
  cpu_engine_config cfg;
  cfg.scheduler.usage.lately_tokens = 1;
  cfg.prefix_cache = false;
  cpu_engine e(m, *pool, m->config().kv_dim(), std::move(fwd), cfg);
  for (seq_id id = 1; id <= 3; ++id) REQUIRE(e.submit(yield_request(id, vocab, "heavy")));
  for (int i = 0; i < 3; ++i) e.step();  // prefilled (asked and stopped for nothing), then decoding
  // Offered while a decode step runs whole: its request would be submitted
  // after that step (here it never is: refused, say). The next step, which
  // asks, must not stop for it.
  e.offer_arrival({0, "light", 1, request_priority::interactive});
  CHECK_FALSE(e.step().yielded);
  f.whole = false;
  CHECK_FALSE(e.step().yielded);
  CHECK(e.stats().yielded_steps == 0);
  // A step that asks still stops for an offer made while it runs.
  e.offer_arrival({0, "light", 1, request_priority::interactive});
  CHECK(e.step().yielded);
  CHECK(e.stats().yielded_steps == 1);
}

TEST_CASE("cpu engine: cancelling a request of a stopped step drops the step and loses nothing else",
          "[fair][engine]") {
  auto m = test::make_model(test::tiny_spec(model::tensor_type::q8_0));
  const std::uint32_t vocab = m->config().vocab_size;
  yield_rig r(m);
  for (seq_id id = 1; id <= 3; ++id) REQUIRE(r.e->submit(yield_request(id, vocab, "heavy")));
  while (r.got.size() < 3) r.step();
  const double heavy_before = r.e->tenant_usage_of("heavy");
  r.e->offer_arrival({0, "light", 1, request_priority::interactive});
  REQUIRE(r.step().yielded);
  CHECK(r.e->tenant_usage_of("heavy") == heavy_before + 3);  // charged when planned: a token each
  r.e->cancel(2);
  // The dropped step's charge is taken back but for the cancelled request's
  // token, which ran in part and will not run again; the others' tokens are
  // charged when they run again, once.
  CHECK(r.e->tenant_usage_of("heavy") == heavy_before + 1);
  REQUIRE(r.e->submit(yield_request(4, vocab, "light")));
  r.step();  // the light request's prefill (it goes first)
  r.step();  // the heavy decodes again
  CHECK(r.e->tenant_usage_of("heavy") == heavy_before + 3);
  r.drain();
  REQUIRE(std::count_if(r.finished.begin(), r.finished.end(), [](const finish_event& f) {
            return f.id == 2 && f.reason == finish_reason::cancelled;
          }) == 1);
  for (const seq_id id : {seq_id{1}, seq_id{3}, seq_id{4}}) {
    CAPTURE(id);
    CHECK(r.got[id] == tokens_alone(m, yield_request(id, vocab, id == 4 ? "light" : "heavy")));
  }
  // The cancelled one got a prefix of its tokens alone, and nothing after.
  const auto alone = tokens_alone(m, yield_request(2, vocab, "heavy"));
  REQUIRE(r.got[2].size() < alone.size());
  CHECK(std::equal(r.got[2].begin(), r.got[2].end(), alone.begin()));
}

// ---- simulated engine -------------------------------------------------------------

namespace {

sim_model llama2_13b_int4() {  // as sim_engine_test.cpp spells it
  sim_model m;
  m.parameters = 13'015'864'320;
  m.weight_bytes = 7'322'849'280;
  m.kv_bytes_per_token = 819'200;
  m.n_layers = 40;
  m.dim = 5120;
  m.int8_compute = true;
  return m;
}

generation_request sim_request(seq_id id, std::uint32_t prompt, std::uint32_t max_tokens, std::string tenant) {
  generation_request r;
  r.id = id;
  r.prompt.assign(prompt, static_cast<model::token_id>(10 + id % 50));
  r.max_tokens = max_tokens;
  r.tenant = std::move(tenant);
  return r;
}

sim_engine_config sim_config() {
  sim_engine_config cfg;
  cfg.prefill_ends_step = true;  // as replicas run it
  cfg.fair_prefill_chunk = 128;
  return cfg;
}

// A light tenant's request arrives `arrival_s` after four of the heavy
// tenant's prompts did; returns its time to first token. The step in flight
// at the arrival is cut there, as the replica and device actors do.
// `light_known`: the light tenant was served before (else its request is
// the first the engine sees of it).
// `layer_yield`: the engine stops a step part way, and the arrival is
// offered before the cut (as the replica does); `lag_stages` and
// `min_decode_s` as sim_engine_config's.
double light_ttft(const std::string& light_tenant, double arrival_s, bool light_known = true,
                  bool layer_yield = false, std::uint32_t lag_stages = 0, double min_decode_s = 0) {
  sim_engine_config cfg = sim_config();
  cfg.layer_yield = layer_yield;
  cfg.layer_yield_lag_stages = lag_stages;
  cfg.layer_yield_min_decode_s = min_decode_s;
  sim_engine e(sim_cost_model(llama2_13b_int4(), sim_device{}), cfg);
  // Both tenants have been served lately, the heavy one more (run to the
  // end): its prefills are the ones chunked.
  if (light_known) REQUIRE(e.submit(sim_request(1, 500, 10, light_tenant)));
  REQUIRE(e.submit(sim_request(2, 500, 10, "heavy")));
  REQUIRE(e.submit(sim_request(3, 500, 10, "heavy")));
  for (int i = 0; i < 100 && !e.idle(); ++i) e.step();
  REQUIRE(e.idle());
  for (seq_id id = 10; id < 14; ++id) REQUIRE(e.submit(sim_request(id, 500, 50, "heavy")));
  double now_s = 0;
  step_result r = e.step();
  for (int i = 0; i < 100 && now_s + r.duration_s < arrival_s; ++i) {
    now_s += r.duration_s;
    r = e.step();
  }
  REQUIRE(now_s + r.duration_s >= arrival_s);
  // Id 0: submitted before the cut here, an offer with its id would be
  // taken for one the schedule has.
  if (layer_yield) e.offer_arrival({0, light_tenant, 1, request_priority::interactive});
  REQUIRE(e.submit(sim_request(20, 500, 10, light_tenant)));
  const auto cut = e.truncate_last_step(arrival_s - now_s);
  now_s += cut ? cut->duration_s : r.duration_s;
  for (int i = 0; i < 1000 && !e.idle(); ++i) {
    r = e.step();
    now_s += r.duration_s;
    for (const token_event& t : r.tokens)
      if (t.id == 20) return now_s - arrival_s;
  }
  FAIL("the light tenant's request produced no token");
  return 0;
}

}  // namespace

TEST_CASE("sim engine: a light tenant's prefill starts at the next chunk boundary of a heavy one's",
          "[fair][sim]") {
  const sim_cost_model cost(llama2_13b_int4(), sim_device{});
  const double own_s = cost.prefill_s(500);
  const double chunk_s = cost.prefill_s(128, 256);  // the longest of a 500-token prompt's chunks but its last
  for (const double arrival_s : {0.001, 0.005, 0.020, 0.040}) {
    CAPTURE(arrival_s);
    const double fair = light_ttft("light", arrival_s);
    // Its own prefill (whole: its tenant is under its share), after at
    // most one of the heavy tenant's chunks.
    CHECK(fair >= own_s * (1 - 1e-9));
    CHECK(fair <= own_s + chunk_s + 1e-4);
    // The same request of the same tenant (one tenant: first come) waits
    // for the prompts ahead of it.
    const double fifo = light_ttft("heavy", arrival_s);
    CHECK(fifo >= 4 * own_s - arrival_s);
  }
}

TEST_CASE("sim engine: with layer_yield, a heavy tenant's prefill chunk stops at its next layer boundary too "
          "(a stage later with the CUDA engine's lag)",
          "[fair][sim]") {
  // The CPU engine stops any step, prefill included: a light prompt waits
  // out one stage of the heavy chunk in flight, not the rest of the chunk.
  const sim_cost_model cost(llama2_13b_int4(), sim_device{});
  const double own_s = cost.prefill_s(500);
  const double stage_s = cost.prefill_s(128, 256) / 80;  // of the longest chunk but a prompt's last
  for (const double arrival_s : {0.001, 0.005, 0.020, 0.040}) {
    CAPTURE(arrival_s);
    const double stopped = light_ttft("light", arrival_s, true, true);
    CHECK(stopped >= own_s * (1 - 1e-9));
    CHECK(stopped <= own_s + stage_s + 1e-9);
    // Without the stop, up to the rest of the chunk: at these arrivals,
    // more than a stage.
    CHECK(light_ttft("light", arrival_s) > stopped + stage_s);
    // The heavy tenant's own arrival does not stop its chunk.
    CHECK(light_ttft("heavy", arrival_s, true, true) == Approx(light_ttft("heavy", arrival_s)).epsilon(1e-12));
    // As the CUDA engine stops (its host asks a stage ahead): one stage of
    // the chunk later, and still before the chunk's end at these arrivals.
    const double later = light_ttft("light", arrival_s, true, true, 1);
    CHECK(later > stopped + 1e-9);
    CHECK(later <= stopped + stage_s + 1e-9);
    CHECK(later < light_ttft("light", arrival_s));
  }
}

TEST_CASE("sim engine: as the CUDA engine, a decode step whose reads are short runs whole", "[fair][sim]") {
  const sim_cost_model cost(llama2_13b_int4(), sim_device{});
  const double own_s = cost.prefill_s(500);
  // In the heavy requests' decode steps (their prompts all prefilled by
  // then): a decode step whose reads at peak bandwidth take less than
  // min_decode_s runs whole, as without the stop; one whose reads take more
  // stops as on the CPU engine.
  const double decode_s = cost.decode_step_s(4, 4 * 520);  // about the step in flight
  const double read_s = cost.decode_read_s(4 * 520);      // its reads at peak bandwidth
  CHECK(read_s < decode_s);  // the model's steps run at 80 % of peak
  for (const double steps : {10.5, 20.3}) {
    const double arrival_s = 4 * own_s + steps * decode_s;
    CAPTURE(arrival_s);
    const double whole = light_ttft("light", arrival_s);
    const double stopped = light_ttft("light", arrival_s, true, true);
    REQUIRE(stopped < whole);  // the arrival lands in a decode step the stop shortens
    CHECK(light_ttft("light", arrival_s, true, true, 0, 1.5 * read_s) == Approx(whole).epsilon(1e-12));
    // Between the reads and the modeled step: weighed by its reads, it runs whole.
    CHECK(light_ttft("light", arrival_s, true, true, 0, 1.1 * read_s) == Approx(whole).epsilon(1e-12));
    CHECK(light_ttft("light", arrival_s, true, true, 0, read_s / 1.5) == Approx(stopped).epsilon(1e-12));
  }
}

TEST_CASE("sim engine: set_step_stop gives the CPU engine's stop, the CUDA engine's, or none", "[fair][sim]") {
  sim_engine_config c;
  set_step_stop(c, sim_step_stop::every_step, 40);
  CHECK(c.layer_yield);
  CHECK(c.layer_yield_min_decode_s == 0);
  CHECK(c.layer_yield_lag_stages == 0);
  set_step_stop(c, sim_step_stop::long_steps, 40);
  CHECK(c.layer_yield);
  CHECK(c.layer_yield_min_decode_s == Approx(80 * fair::cuda_stage_launch_s));  // 80 stages: 2.4 ms
  CHECK(c.layer_yield_lag_stages == 1);
  set_step_stop(c, sim_step_stop::none, 40);
  CHECK_FALSE(c.layer_yield);
  CHECK(c.layer_yield_min_decode_s == 0);
  CHECK(c.layer_yield_lag_stages == 0);
  CHECK(std::string(to_string(sim_step_stop::long_steps)) == "long_steps");
}

namespace {

// A layer_yield engine that has served one request of the light tenant and
// `heavy_requests` of the heavy one, and is idle again.
sim_engine yielding_after_service(const sim_cost_model& cost, seq_id heavy_requests) {
  sim_engine_config cfg = sim_config();
  cfg.layer_yield = true;
  sim_engine e(cost, cfg);
  REQUIRE(e.submit(sim_request(1, 500, 10, "light")));
  for (seq_id id = 2; id < 2 + heavy_requests; ++id) REQUIRE(e.submit(sim_request(id, 500, 10, "heavy")));
  for (int i = 0; i < 100 && !e.idle(); ++i) e.step();
  REQUIRE(e.idle());
  return e;
}

// A layer_yield engine, both tenants served before, the heavy one more,
// that has just prefilled one heavy prompt of 250 tokens (request 10) in
// two chunks of 125, in one step.
sim_engine heavy_prompt_prefilled(const sim_cost_model& cost) {
  sim_engine e = yielding_after_service(cost, 2);
  REQUIRE(e.submit(sim_request(10, 250, 5, "heavy")));
  return e;
}

}  // namespace

TEST_CASE("sim engine: with layer_yield, a stopped chunk's rest computes its tokens, and its prompt's first token when it completes it",
          "[fair][sim]") {
  const sim_cost_model cost(llama2_13b_int4(), sim_device{});
  sim_engine e = heavy_prompt_prefilled(cost);
  const step_result prefill = e.step();
  REQUIRE(prefill.tokens.size() == 1);
  const double first_s = cost.prefill_s(125);
  const double second_s = cost.prefill_s(125, 125);
  REQUIRE(prefill.duration_s == Approx(first_s + second_s));
  const std::uint64_t prefilled_before = e.stats().prefill_tokens;
  // A light prompt arrives a third into the second chunk.
  e.offer_arrival({20, "light", 1, request_priority::interactive});
  const auto stop = e.truncate_last_step(first_s + second_s / 3);
  REQUIRE(stop.has_value());
  CHECK(stop->tokens.empty());
  CHECK(stop->prefill_tokens == 125);  // the first chunk stands
  CHECK(stop->duration_s >= first_s + second_s / 3);
  CHECK(stop->duration_s <= first_s + second_s / 3 + second_s / 80 + 1e-12);
  CHECK(e.stats().yielded_steps == 1);
  REQUIRE(e.submit(sim_request(20, 500, 10, "light")));
  const step_result interlude = e.step();
  REQUIRE(interlude.tokens.size() == 1);
  CHECK(interlude.tokens[0].id == 20);
  CHECK(interlude.duration_s == Approx(cost.prefill_s(500)));
  const step_result rest = e.step();  // the chunk's rest: it completes the prompt
  REQUIRE(rest.tokens.size() == 1);
  CHECK(rest.tokens[0].id == 10);
  CHECK(rest.tokens[0].token == prefill.tokens[0].token);
  CHECK(rest.prefill_tokens == 125);
  CHECK(stop->duration_s + rest.duration_s == Approx(prefill.duration_s));
  CHECK(e.stats().prefill_tokens == prefilled_before - 250 + 125 + 500 + 125);
  for (int i = 0; i < 1000 && !e.idle(); ++i) e.step();
  CHECK(e.idle());
  CHECK(e.stats().kv_free_tokens == e.stats().kv_capacity_tokens);
}

TEST_CASE("sim engine: with layer_yield, cancelling the request of a stopped chunk drops the chunk's rest",
          "[fair][sim]") {
  const sim_cost_model cost(llama2_13b_int4(), sim_device{});
  sim_engine e = heavy_prompt_prefilled(cost);
  const step_result prefill = e.step();
  REQUIRE(prefill.tokens.size() == 1);
  e.offer_arrival({20, "light", 1, request_priority::interactive});
  REQUIRE(e.truncate_last_step(prefill.duration_s * 0.8).has_value());
  REQUIRE(e.submit(sim_request(20, 500, 10, "light")));
  e.cancel(10);
  const step_result next = e.step();  // 20's prefill, and 10's cancellation
  REQUIRE(next.tokens.size() == 1);
  CHECK(next.tokens[0].id == 20);
  REQUIRE(next.finished.size() == 1);
  CHECK(next.finished[0].id == 10);
  CHECK(next.finished[0].reason == finish_reason::cancelled);
  CHECK(next.duration_s == Approx(cost.prefill_s(500)));
  std::size_t tokens_of_10 = 0;
  for (int i = 0; i < 1000 && !e.idle(); ++i)
    for (const token_event& t : e.step().tokens) tokens_of_10 += t.id == 10 ? 1 : 0;
  CHECK(e.idle());
  CHECK(tokens_of_10 == 0);
  CHECK(e.stats().kv_free_tokens == e.stats().kv_capacity_tokens);
}

TEST_CASE("sim engine: a new tenant's first request cuts into a one-tenant prefill at a chunk boundary",
          "[fair][sim]") {
  // The engine has seen one tenant only, so it prefilled the four prompts
  // first come, in one piece; the newcomer's arrival re-plans that step as
  // one across tenants, chunked, up to the next chunk boundary.
  const sim_cost_model cost(llama2_13b_int4(), sim_device{});
  const double own_s = cost.prefill_s(500);
  const double chunk_s = cost.prefill_s(128, 256);
  for (const double arrival_s : {0.0005, 0.004, 0.012}) {
    CAPTURE(arrival_s);
    const double fair = light_ttft("light", arrival_s, false);
    CHECK(fair >= own_s * (1 - 1e-9));
    CHECK(fair <= own_s + chunk_s + 1e-4);
  }
  // Past the first prompt's prefill, the step as it ran stands: the
  // newcomer waits for the other three.
  CHECK(light_ttft("light", 0.020, false) >= 4 * own_s - 0.020);
}

TEST_CASE("sim engine: interactive prompts are prefilled before batch ones", "[fair][sim]") {
  sim_engine e(sim_cost_model(llama2_13b_int4(), sim_device{}), sim_config());
  for (seq_id id = 1; id <= 3; ++id) {
    generation_request r = sim_request(id, 300, 5, "t");
    r.priority = request_priority::batch;
    REQUIRE(e.submit(r));
  }
  REQUIRE(e.submit(sim_request(4, 300, 5, "t")));  // interactive, last to arrive
  const step_result first = e.step();
  REQUIRE(first.tokens.size() == 1);
  CHECK(first.tokens[0].id == 4);
}

namespace {

// Four heavy sequences decode; a light request arrives `into_decode_s`
// into their first decode macro step and is offered (when `offer`) before
// the step is cut, as the replica and device actors do. Returns the light
// request's time to first token and every request's tokens.
struct sim_yield_run {
  double ttft_s = -1;
  double cut_s = 0;  // how long the step in flight ran
  std::map<seq_id, std::vector<model::token_id>> tokens;
};

sim_yield_run run_layer_yield(bool layer_yield, bool offer, double into_decode_s) {
  sim_engine_config cfg = sim_config();
  cfg.layer_yield = layer_yield;
  sim_engine e(sim_cost_model(llama2_13b_int4(), sim_device{}), cfg);
  sim_yield_run out;
  const auto take = [&](const step_result& r, double end_s, double arrival_s) {
    for (const token_event& t : r.tokens) {
      out.tokens[t.id].push_back(t.token);
      if (t.id == 20 && out.ttft_s < 0) out.ttft_s = end_s - arrival_s;
    }
  };
  REQUIRE(e.submit(sim_request(1, 500, 10, "light")));
  REQUIRE(e.submit(sim_request(2, 500, 10, "heavy")));
  REQUIRE(e.submit(sim_request(3, 500, 10, "heavy")));
  for (int i = 0; i < 100 && !e.idle(); ++i) e.step();
  REQUIRE(e.idle());
  out.tokens.clear();
  for (seq_id id = 10; id < 14; ++id) REQUIRE(e.submit(sim_request(id, 500, 50, "heavy")));
  double now_s = 0;
  while (out.tokens.size() < 4) {  // their prefills, each ending a step
    const step_result r = e.step();
    now_s += r.duration_s;
    take(r, now_s, 0);
  }
  const step_result decoding = e.step();
  REQUIRE(decoding.duration_s > into_decode_s);
  const double arrival_s = now_s + into_decode_s;
  if (offer) e.offer_arrival({0, "light", 1, request_priority::interactive});
  const auto cut = e.truncate_last_step(into_decode_s);
  out.cut_s = cut ? cut->duration_s : decoding.duration_s;
  now_s += out.cut_s;
  take(cut ? *cut : decoding, now_s, arrival_s);
  REQUIRE(e.submit(sim_request(20, 500, 10, "light")));
  for (int i = 0; i < 1000 && !e.idle(); ++i) {
    const step_result r = e.step();
    now_s += r.duration_s;
    take(r, now_s, arrival_s);
  }
  REQUIRE(e.idle());
  return out;
}

}  // namespace

namespace {

// A layer_yield engine whose heavy tenant's four sequences (ids 10-13) are
// in their first decode macro step, both tenants served before.
sim_engine heavy_decoding(const sim_cost_model& cost) {
  sim_engine e = yielding_after_service(cost, 1);
  for (seq_id id = 10; id < 14; ++id) REQUIRE(e.submit(sim_request(id, 500, 50, "heavy")));
  for (int i = 0; i < 4; ++i) e.step();  // the four prefills
  const step_result decoding = e.step();
  REQUIRE(decoding.tokens.size() > 4);   // several decode steps
  return e;
}

// heavy_decoding's engine, its macro step stopped inside its first decode
// step for a light arrival (not yet submitted).
sim_engine heavy_stopped(const sim_cost_model& cost) {
  sim_engine e = heavy_decoding(cost);
  e.offer_arrival({0, "light", 1, request_priority::interactive});
  const auto stop = e.truncate_last_step(0.0005);
  REQUIRE(stop.has_value());
  CHECK(stop->tokens.empty());  // stopped inside the first decode step
  return e;
}

}  // namespace

TEST_CASE("sim engine: with layer_yield, a decode step stops at its next layer boundary for a light prompt",
          "[fair][sim]") {
  const sim_cost_model cost(llama2_13b_int4(), sim_device{});
  const double own_s = cost.prefill_s(500);
  // The heavy batch's longest decode step (four sequences at their end), an
  // eightieth of it per stage (40 layers, attention and MLP).
  const double step_s = cost.decode_step_s(4, 4 * 550);
  const double layer_s = step_s / 80;
  for (const double into_s : {0.0013, 0.0171, 0.0502}) {
    CAPTURE(into_s);
    const auto stopped = run_layer_yield(true, true, into_s);
    const auto waited = run_layer_yield(false, true, into_s);
    const auto not_offered = run_layer_yield(true, false, into_s);
    // Its own prefill, after at most a stage of the heavy step in flight.
    CHECK(stopped.ttft_s >= own_s * (1 - 1e-9));
    CHECK(stopped.ttft_s <= own_s + layer_s + 1e-9);
    CHECK(stopped.cut_s - into_s <= layer_s + 1e-12);
    CHECK(stopped.cut_s >= into_s);
    // Without it, the rest of that decode step first (up to a whole one).
    CHECK(waited.ttft_s >= stopped.ttft_s);
    CHECK(waited.ttft_s <= own_s + step_s + 1e-9);
    CHECK(not_offered.ttft_s == Approx(waited.ttft_s).epsilon(1e-12));
    // Nobody's tokens change, only when they leave.
    CHECK(stopped.tokens == waited.tokens);
    CHECK(stopped.tokens.at(20).size() == 10);
    for (seq_id id = 10; id < 14; ++id) CHECK(stopped.tokens.at(id).size() == 50);
  }
  // An arrival of the heavy tenant itself does not stop its step.
  sim_engine e = heavy_decoding(cost);
  e.offer_arrival({0, "heavy", 1, request_priority::interactive});
  const auto cut = e.truncate_last_step(0.0013);
  REQUIRE(cut.has_value());  // at the decode step's end, as without layer_yield
  CHECK(cut->tokens.size() % 4 == 0);
  CHECK_FALSE(cut->tokens.empty());
  // The end of a decode step: a whole number of them after the step began.
  const double decode_s = cut->duration_s / static_cast<double>(cut->tokens.size() / 4);
  CHECK(decode_s == Approx(cost.decode_step_s(4, 4 * 501)).epsilon(0.01));
  const step_result next = e.step();  // no interlude, no rest owed: decoding on
  CHECK(next.tokens.size() % 4 == 0);
  CHECK(next.tokens.size() >= 4);
}

TEST_CASE("sim engine: with layer_yield, the rest of a stopped step may stop again for a later arrival",
          "[fair][sim]") {
  const sim_cost_model cost(llama2_13b_int4(), sim_device{});
  sim_engine e = heavy_stopped(cost);
  REQUIRE(e.submit(sim_request(20, 500, 10, "light")));
  const step_result interlude = e.step();
  REQUIRE(interlude.tokens.size() == 1);
  CHECK(interlude.tokens[0].id == 20);
  CHECK(interlude.duration_s == Approx(cost.prefill_s(500)));
  const step_result rest = e.step();  // the stopped step's rest: the heavy batch's tokens at its end
  REQUIRE(rest.tokens.size() == 4);
  const double owed_s = rest.duration_s;
  e.offer_arrival({0, "light", 1, request_priority::interactive});
  const auto again = e.truncate_last_step(owed_s / 10);
  REQUIRE(again.has_value());
  CHECK(again->tokens.empty());
  CHECK(again->duration_s >= owed_s / 10);
  CHECK(again->duration_s < owed_s);
  // A second arrival within the same stop (before it): the stop stands.
  e.offer_arrival({0, "light", 1, request_priority::interactive});
  CHECK_FALSE(e.truncate_last_step(owed_s / 20).has_value());
  REQUIRE(e.submit(sim_request(21, 500, 10, "light")));
  const step_result second = e.step();
  REQUIRE(second.tokens.size() == 1);
  CHECK(second.tokens[0].id == 21);
  const step_result end = e.step();
  CHECK(end.tokens.size() == 4);
  CHECK(end.duration_s == Approx(owed_s - again->duration_s));
  for (int i = 0; i < 1000 && !e.idle(); ++i) e.step();
  CHECK(e.idle());
}

TEST_CASE("sim engine: with layer_yield, one interlude prefills every light prompt waiting at the stop, as the CPU engine's does",
          "[fair][sim]") {
  const sim_cost_model cost(llama2_13b_int4(), sim_device{});
  sim_engine e = heavy_stopped(cost);
  // Two prompts of the light tenant came in the same moment.
  REQUIRE(e.submit(sim_request(20, 500, 10, "light")));
  REQUIRE(e.submit(sim_request(21, 500, 10, "light")));
  const step_result interlude = e.step();
  REQUIRE(interlude.tokens.size() == 2);  // both first tokens, at the interlude's end
  CHECK(interlude.tokens[0].id == 20);
  CHECK(interlude.tokens[1].id == 21);
  CHECK(interlude.duration_s == Approx(2 * cost.prefill_s(500)));
  const step_result rest = e.step();  // then the stopped step's rest, the heavy batch's tokens
  REQUIRE(rest.tokens.size() == 4);
  for (const token_event& t : rest.tokens) CHECK((t.id >= 10 && t.id < 14));
  CHECK(e.stats().yielded_steps == 1);
  for (int i = 0; i < 1000 && !e.idle(); ++i) e.step();
  CHECK(e.idle());
}

TEST_CASE("sim engine: with layer_yield, a prompt that arrives while the interlude runs stops the rest at its first stage",
          "[fair][sim]") {
  const sim_cost_model cost(llama2_13b_int4(), sim_device{});
  // Request 20 stops the heavy decode step; request 21 arrives while 20's
  // interlude runs, which does not stop, and is submitted when it ends.
  const auto stopped_for_20 = [&] {
    sim_engine e = heavy_decoding(cost);
    e.offer_arrival({20, "light", 1, request_priority::interactive});
    REQUIRE(e.truncate_last_step(0.0005).has_value());
    REQUIRE(e.submit(sim_request(20, 500, 10, "light")));
    const step_result interlude = e.step();
    REQUIRE(interlude.tokens.size() == 1);
    CHECK(interlude.tokens[0].id == 20);
    return e;
  };
  sim_engine alone = stopped_for_20();
  const step_result rest = alone.step();  // without 21: the rest of the stopped step
  REQUIRE(rest.tokens.size() == 4);

  sim_engine e = stopped_for_20();
  e.offer_arrival({21, "light", 1, request_priority::interactive});
  REQUIRE(e.submit(sim_request(21, 500, 10, "light")));
  const step_result stage = e.step();  // one stage of the rest, then it stops again
  CHECK(stage.tokens.empty());
  CHECK(stage.duration_s > 0);
  CHECK(stage.duration_s < rest.duration_s / 10);
  const step_result second = e.step();  // 21's interlude
  REQUIRE(second.tokens.size() == 1);
  CHECK(second.tokens[0].id == 21);
  CHECK(second.duration_s == Approx(cost.prefill_s(500)));
  const step_result end = e.step();
  REQUIRE(end.tokens.size() == 4);
  CHECK(stage.duration_s + end.duration_s == Approx(rest.duration_s));
  for (std::size_t i = 0; i < 4; ++i) CHECK(end.tokens[i].token == rest.tokens[i].token);
  CHECK(alone.stats().yielded_steps == 1);  // the stop for 20
  CHECK(e.stats().yielded_steps == 2);      // and the rest's, for 21
  for (int i = 0; i < 1000 && !e.idle(); ++i) e.step();
  CHECK(e.idle());
}

TEST_CASE("over_share_admits: a tenant over its share grows its running set within the budget only", "[fair]") {
  CHECK(over_share_admits(0, 9.0, 4.0));    // nothing running here: it always progresses
  CHECK(over_share_admits(3, 4.0, 4.0));    // within the budget
  CHECK_FALSE(over_share_admits(3, 4.5, 4.0));
  CHECK(over_share_admits(3, 4.5, 0.0));    // no bound
}

namespace {

// Runs `e` from time 0 to the step in flight at `arrival_s`, submits `r`
// there (the step is cut at its next boundary, as the replica and device
// actors do) and returns r's time to first token.
double ttft_at(sim_engine& e, generation_request r, double arrival_s) {
  double now_s = 0;
  step_result s = e.step();
  for (int i = 0; i < 100000 && now_s + s.duration_s < arrival_s; ++i) {
    now_s += s.duration_s;
    s = e.step();
  }
  REQUIRE(now_s + s.duration_s >= arrival_s);
  const seq_id id = r.id;
  REQUIRE(e.submit(std::move(r)));
  const auto cut = e.truncate_last_step(arrival_s - now_s);
  now_s += cut ? cut->duration_s : s.duration_s;
  for (int i = 0; i < 100000 && !e.idle(); ++i) {
    s = e.step();
    now_s += s.duration_s;
    for (const token_event& t : s.tokens)
      if (t.id == id) return now_s - arrival_s;
  }
  FAIL("the request produced no token");
  return 0;
}

// An engine where "light" and "heavy" were both served lately, the heavy
// one more, and then the heavy tenant sends sixteen prompts of 500 tokens
// (600 reserved each) and the light one a single one.
void heavy_backlog(sim_engine& e, const std::string& light_tenant) {
  REQUIRE(e.submit(sim_request(1, 500, 10, light_tenant)));
  REQUIRE(e.submit(sim_request(2, 500, 10, "heavy")));
  REQUIRE(e.submit(sim_request(3, 500, 10, "heavy")));
  for (int i = 0; i < 100 && !e.idle(); ++i) e.step();
  REQUIRE(e.idle());
  for (seq_id id = 10; id < 26; ++id) REQUIRE(e.submit(sim_request(id, 500, 100, "heavy")));
  REQUIRE(e.submit(sim_request(30, 500, 100, light_tenant)));
}

}  // namespace

TEST_CASE("sim engine: across tenants, a tenant over its share keeps only what a decode step within the budget reads",
          "[fair][sim]") {
  const sim_cost_model cost(llama2_13b_int4(), sim_device{});
  const double weights_s = cost.decode_step_s(0, 0);
  // The most sequences of 600 reserved tokens whose decode step fits 1.5
  // reads of the weights: 7 (2.73 ms of weights, 0.18 ms of KV each).
  std::uint32_t fit = 0;
  while (cost.decode_step_s(fit + 1, 600ull * (fit + 1)) <= 1.5 * weights_s) ++fit;
  REQUIRE(fit == 7);
  const auto most_running = [&](double budget, const std::string& light_tenant) {
    sim_engine_config cfg = sim_config();
    cfg.fair_step_budget = budget;
    sim_engine e(cost, cfg);
    heavy_backlog(e, light_tenant);
    std::uint32_t most = 0, finished = 0;
    for (int i = 0; i < 100000 && !e.idle(); ++i) {
      finished += static_cast<std::uint32_t>(e.step().finished.size());
      const engine_stats st = e.stats();
      most = std::max(most, st.running);
      // The running set's decode step, every sequence at its reserved
      // length, never exceeds the budget (the light tenant's one included).
      if (budget > 0 && light_tenant != "heavy")
        CHECK(cost.decode_step_s(st.running, st.kv_capacity_tokens - st.kv_free_tokens) <= budget * weights_s + 1e-12);
    }
    CHECK(finished == 17);  // every request served to its end
    return most;
  };
  CHECK(most_running(1.5, "light") == fit);  // the light one and six of the heavy tenant's
  CHECK(most_running(0, "light") == 17);     // no bound: all at once
  CHECK(most_running(1.5, "heavy") == 17);   // one tenant: first come, unbounded
}

TEST_CASE("sim engine: a light tenant's request waits out at most a step within the budget", "[fair][sim]") {
  // Arrivals every 0.3 ms over 6 ms, while the heavy tenant decodes (its
  // prefills are done by 0.3 s either way): with the budget the step in
  // flight is at most 1.5 reads of the weights; without it, sixteen
  // sequences of ~550 tokens take about twice that.
  const sim_cost_model cost(llama2_13b_int4(), sim_device{});
  const double weights_s = cost.decode_step_s(0, 0);
  const double own_s = cost.prefill_s(500);
  const auto longest_wait = [&](double budget) {
    double longest = 0;
    for (int k = 0; k < 20; ++k) {
      sim_engine_config cfg = sim_config();
      cfg.fair_step_budget = budget;
      sim_engine e(cost, cfg);
      heavy_backlog(e, "light");
      const double ttft = ttft_at(e, sim_request(40, 500, 10, "light"), 0.3 + 0.0003 * k);
      CHECK(ttft >= own_s * (1 - 1e-9));  // its own prefill, whole
      longest = std::max(longest, ttft - own_s);
    }
    return longest;
  };
  const double bounded = longest_wait(1.5);
  const double unbounded = longest_wait(0);
  INFO("longest wait before its prefill: " << bounded * 1e3 << " ms with the budget, " << unbounded * 1e3
                                           << " ms without");
  CHECK(bounded <= 1.5 * weights_s + 1e-9);
  CHECK(unbounded > 1.8 * weights_s);
}

TEST_CASE("sim engine: across tenants, random truncations never change what a request receives", "[fair][sim]") {
  // sim_engine_test's random truncation check with three tenants and two
  // priority classes: the replays of chunked, fair-ordered steps must be
  // exact, and so must steps stopped part way. Tokens depend on the
  // sequence only, so both engines agree.
  std::uint64_t stopped = 0;
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    CAPTURE(seed);
    std::uint64_t x = seed * 0x9E3779B97F4A7C15ull;
    const auto next = [&x](std::uint64_t n) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      return (x >> 33) % n;
    };
    std::map<std::size_t, std::vector<generation_request>> arrivals;
    for (seq_id id = 1; id <= 30; ++id) {
      generation_request r = sim_request(id, 1 + static_cast<std::uint32_t>(next(400)),
                                         1 + static_cast<std::uint32_t>(next(60)), "t" + std::to_string(next(3)));
      r.priority = next(4) == 0 ? request_priority::batch : request_priority::interactive;
      r.tenant_weight = 1.0 + static_cast<double>(next(3));
      if (next(3) == 0) r.stop_tokens = {static_cast<model::token_id>(35 + next(95))};
      arrivals[next(40)].push_back(std::move(r));
    }
    sim_engine_config cfg{.max_running = 6, .max_batch_tokens = 256, .kv_capacity_tokens = 1500, .horizon_s = 0.05};
    cfg.fair_prefill_chunk = 32 + static_cast<std::uint32_t>(next(64));
    cfg.prefill_ends_step = next(2) == 0;
    // Small enough to bind for these short sequences (a few hundred tokens
    // of KV beside the weights), or none.
    cfg.fair_step_budget = next(2) == 0 ? 1.02 + 0.01 * static_cast<double>(next(5)) : 0;
    cfg.usage.lately_tokens = 1;
    // Every other seed stops steps part way: the arrivals are offered, the
    // step cut, then they are submitted, as the replica and device do.
    cfg.layer_yield = seed % 2 == 0;
    // Of those, some stop as the CUDA engine does: a stage later, and
    // (some) only decode steps whose reads take a while (600 tokens of
    // context beside the weights: some of these steps' reads, not all).
    cfg.layer_yield_lag_stages = (seed / 2) % 2;
    cfg.layer_yield_min_decode_s =
        (seed / 4) % 2 ? sim_cost_model(llama2_13b_int4(), sim_device{}).decode_read_s(600) : 0;
    sim_engine plain(sim_cost_model(llama2_13b_int4(), sim_device{}), cfg);
    sim_engine cut(sim_cost_model(llama2_13b_int4(), sim_device{}), cfg);
    std::map<seq_id, std::vector<model::token_id>> a, b;
    std::map<seq_id, finish_event> fa, fb;
    const auto absorb = [](const step_result& r, auto& tokens, auto& finished) {
      for (const token_event& t : r.tokens) {
        REQUIRE(t.index == tokens[t.id].size());
        tokens[t.id].push_back(t.token);
      }
      for (const finish_event& f : r.finished) REQUIRE(finished.emplace(f.id, f).second);
    };
    std::size_t truncations = 0;
    for (const generation_request& r : arrivals[0]) REQUIRE(cut.submit(r));
    for (std::size_t i = 0; i < 100000 && (i < 40 || !plain.idle() || !cut.idle()); ++i) {
      if (const auto found = arrivals.find(i); found != arrivals.end())
        for (const generation_request& r : found->second) REQUIRE(plain.submit(r));
      absorb(plain.step(), a, fa);
      step_result r = cut.step();
      const auto soon = arrivals.find(i + 1);
      const auto submit_soon = [&] {
        if (soon != arrivals.end())
          for (const generation_request& q : soon->second) REQUIRE(cut.submit(q));
      };
      if (cfg.layer_yield && soon != arrivals.end())
        for (const generation_request& q : soon->second)
          cut.offer_arrival({q.id, q.tenant, q.tenant_weight, q.priority});
      else
        submit_soon();
      const double at = r.duration_s * static_cast<double>(next(1001)) / 1000.0;
      if (auto kept = cut.truncate_last_step(at)) {
        CHECK(kept->duration_s < r.duration_s);
        r = std::move(*kept);
        ++truncations;
      }
      if (cfg.layer_yield) submit_soon();
      absorb(r, b, fb);
    }
    CHECK(truncations > 5);
    if (cfg.layer_yield) stopped += cut.stats().yielded_steps;
    CHECK(a == b);
    REQUIRE(fa.size() == 30);
    REQUIRE(fb.size() == 30);
    for (const auto& [id, f] : fa) {
      CHECK(fb.at(id).reason == f.reason);
      CHECK(fb.at(id).generated == f.generated);
    }
    CHECK(cut.stats().kv_free_tokens == cut.stats().kv_capacity_tokens);
    CHECK(cut.stats().generated_tokens == plain.stats().generated_tokens);
    CHECK(cut.stats().prefill_tokens == plain.stats().prefill_tokens);  // a stopped chunk's counted once
  }
  CHECK(stopped > 10);
}
