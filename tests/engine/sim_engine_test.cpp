// The simulated engine: its cost model against hand-computed figures, and
// its macro steps against what the actors rely on -- the same tokens as the
// zero-cost engine, exact resume, stop tokens, KV-limited admission, cancel,
// and truncation that, continued, equals the uninterrupted run.

#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <map>
#include <optional>

#include "engine/null_engine.hpp"
#include "engine/sim_engine.hpp"
#include "model/prefix_hash.hpp"

using namespace exa;
using namespace exa::engine;

namespace {

// Llama-2-7B at fp16 and Llama-2-13B at int4 (Q4_0) as
// cluster::model_shape_preset computes them (parameter_count(),
// computed_weight_bytes(), kv_bytes_per_token()); spelled out because
// runtime/engine must not depend on runtime/cluster.
sim_model llama2_7b_fp16() {
  sim_model m;
  m.parameters = 6'738'415'616;
  m.weight_bytes = 13'477'363'712;
  m.kv_bytes_per_token = 524'288;  // 2 × 32 layers × 4096 × 2 B
  m.n_layers = 32;
  m.dim = 4096;
  return m;
}

sim_model llama2_13b_int4() {
  sim_model m;
  m.parameters = 13'015'864'320;
  m.weight_bytes = 7'322'849'280;
  m.kv_bytes_per_token = 819'200;  // 2 × 40 layers × 5120 × 2 B
  m.n_layers = 40;
  m.dim = 5120;
  m.int8_compute = true;
  return m;
}

sim_cost_model h100_7b() { return sim_cost_model(llama2_7b_fp16(), sim_device{}); }

bool rel_close(double got, double want, double tol = 1e-9) { return std::abs(got - want) <= tol * std::abs(want); }

std::vector<model::token_id> prompt_of(std::uint32_t n, std::uint64_t salt, std::uint32_t vocab = 32000) {
  std::vector<model::token_id> p(n);
  for (std::uint32_t i = 0; i < n; ++i) p[i] = static_cast<model::token_id>((salt * 7919 + i * 131) % vocab);
  return p;
}

generation_request request(seq_id id, std::uint32_t prompt, std::uint32_t max_tokens, std::uint32_t vocab = 32000) {
  generation_request r;
  r.id = id;
  r.prompt = prompt_of(prompt, id, vocab);
  r.max_tokens = max_tokens;
  return r;
}

// Everything a run produced, per sequence; token indices are checked to be
// consecutive as they arrive.
struct streams {
  std::map<seq_id, std::vector<model::token_id>> tokens;
  std::map<seq_id, std::uint32_t> first_index;  // resume offset
  std::map<seq_id, finish_event> finished;
  double time_s = 0;

  void absorb(const step_result& r) {
    for (const token_event& e : r.tokens) {
      auto& t = tokens[e.id];
      REQUIRE(e.index == first_index[e.id] + t.size());
      REQUIRE_FALSE(finished.contains(e.id));
      t.push_back(e.token);
    }
    for (const finish_event& f : r.finished) {
      REQUIRE_FALSE(finished.contains(f.id));
      finished[f.id] = f;
    }
    time_s += r.duration_s;
  }
};

streams run_to_idle(inference_engine& e, streams s = {}, int max_steps = 100000) {
  for (int i = 0; i < max_steps && !e.idle(); ++i) s.absorb(e.step());
  REQUIRE(e.idle());
  return s;
}

sim_engine make_engine(sim_engine_config cfg = {}, sim_model m = llama2_7b_fp16()) {
  return sim_engine(sim_cost_model(m, sim_device{}), cfg);
}

}  // namespace

TEST_CASE("sim cost model: decode steps of Llama-2-7B fp16 on an H100", "[sim]") {
  const sim_cost_model c = h100_7b();
  // Memory bound: 13.48 GB of weights over 80% of 3.35 TB/s ≈ 5.03 ms.
  CHECK(rel_close(c.decode_step_s(1, 0), 13'477'363'712.0 / (3.35e12 * 0.8)));
  CHECK(rel_close(c.decode_step_s(1, 0), 5.0289e-3, 1e-4));
  // 1000 tokens of context add 0.52 GB of KV reads.
  CHECK(rel_close(c.decode_step_s(1, 1000), (13'477'363'712.0 + 524'288.0 * 1000) / 2.68e12));
  // Batch 32 at 1000 tokens each: 16.8 GB of KV, 11.29 ms; compute (0.87 ms) hides under it.
  CHECK(rel_close(c.decode_step_s(32, 32'000), (13'477'363'712.0 + 524'288.0 * 32'000) / 2.68e12));
  CHECK(rel_close(c.decode_step_s(32, 32'000), 11.2890e-3, 1e-4));
  // Batch 512 with no context is compute bound: 2·P·512 over 50% of 989 TFLOP/s ≈ 13.95 ms.
  CHECK(rel_close(c.decode_step_s(512, 0), 2.0 * 6'738'415'616.0 * 512 / (989e12 * 0.5)));
  CHECK(c.decode_step_s(512, 0) > c.decode_step_s(1, 0) * 2);
  // int8 weights compute at the int8 rate.
  sim_model q = llama2_7b_fp16();
  q.int8_compute = true;
  const sim_cost_model c8(q, sim_device{});
  CHECK(rel_close(c8.decode_step_s(512, 0), 2.0 * 6'738'415'616.0 * 512 / (1979e12 * 0.5)));
}

TEST_CASE("sim cost model: prefill and load times", "[sim]") {
  const sim_cost_model c = h100_7b();
  const double p = 6'738'415'616.0;
  // 1000 prompt tokens: 2·P·1000 + 4·32·4096·1000·500 FLOPs at 494.5 TFLOP/s ≈ 27.8 ms.
  CHECK(rel_close(c.prefill_s(1000), (2 * p * 1000 + 4.0 * 32 * 4096 * 1000 * 500) / (989e12 * 0.5)));
  CHECK(rel_close(c.prefill_s(1000), 27.7845e-3, 1e-4));
  // A chunk after 500 earlier tokens attends to them too.
  CHECK(rel_close(c.prefill_s(1000, 500), (2 * p * 1000 + 4.0 * 32 * 4096 * 1000 * 1000) / (989e12 * 0.5)));
  CHECK(rel_close(c.prefill_s(1), (2 * p + 4.0 * 32 * 4096 * 0.5) / (989e12 * 0.5)));
  CHECK(rel_close(c.load_s(), 13'477'363'712.0 / 2e9));
}

TEST_CASE("sim cost model: the worked example of docs/SIMULATION.md", "[sim]") {
  const sim_cost_model c(llama2_13b_int4(), sim_device{});
  CHECK(rel_close(c.decode_step_s(1, 1000), 3.0381e-3, 1e-4));
  CHECK(rel_close(c.decode_step_s(32, 32'000), 12.5139e-3, 1e-4));
  CHECK(rel_close(c.prefill_s(1000), 26.7219e-3, 1e-4));
  CHECK(rel_close(c.load_s(), 3.6614, 1e-4));
  // The compute side of a batch-32 step, at the int8 rate.
  CHECK(rel_close(2.0 * 13'015'864'320.0 * 32 / (1979e12 * 0.5), 0.84185e-3, 1e-4));
  CHECK(rel_close(c.decode_step_s(32, 32'000, 2), 25.0278e-3, 1e-4));

  // The macro step of A (1000 + 3) and B (1000 + 5), and its cut at 55 ms.
  const auto make = [] {
    sim_engine e(sim_cost_model(llama2_13b_int4(), sim_device{}), {});
    REQUIRE(e.submit(request(1, 1000, 3)));
    REQUIRE(e.submit(request(2, 1000, 5)));
    return e;
  };
  sim_engine e = make();
  const step_result whole = e.step();
  CHECK(whole.tokens.size() == 6);
  CHECK(rel_close(whole.duration_s, 60.1332e-3, 1e-4));
  const step_result rest = e.step();
  CHECK(rest.tokens.size() == 2);
  CHECK(rel_close(rest.duration_s, 6.0783e-3, 1e-4));
  sim_engine cut = make();
  cut.step();
  const auto kept = cut.truncate_last_step(0.055);
  REQUIRE(kept);
  CHECK(kept->tokens.size() == 4);
  CHECK(rel_close(kept->duration_s, 56.7882e-3, 1e-4));
}

TEST_CASE("sim cost model: sharing the device halves bandwidth", "[sim]") {
  const sim_cost_model c = h100_7b();
  CHECK(rel_close(c.decode_step_s(8, 8000, 2), 2 * c.decode_step_s(8, 8000, 1)));
  CHECK(rel_close(c.decode_step_s(8, 8000, 3), 3 * c.decode_step_s(8, 8000, 1)));
  // Compute does not share bandwidth: a compute-bound step stays put.
  CHECK(c.decode_step_s(2048, 0, 2) == c.decode_step_s(2048, 0, 1));

  // The engine: same tokens, the decode part takes twice as long.
  sim_engine alone = make_engine();
  sim_engine shared = make_engine();
  shared.set_device_sharing(2);
  REQUIRE(alone.submit(request(1, 100, 20)));
  REQUIRE(shared.submit(request(1, 100, 20)));
  const streams a = run_to_idle(alone);
  const streams s = run_to_idle(shared);
  CHECK(a.tokens == s.tokens);
  const double prefill = c.prefill_s(100);
  CHECK(rel_close(s.time_s - prefill, 2 * (a.time_s - prefill)));
}

TEST_CASE("sim engine: a macro step runs until the first sequence finishes", "[sim]") {
  const sim_cost_model c = h100_7b();
  sim_engine e = make_engine();
  REQUIRE(e.submit(request(1, 100, 5)));
  REQUIRE(e.submit(request(2, 200, 9)));

  // Prefill of both, each emits its first token, then 4 decode steps of 2.
  const step_result s1 = e.step();
  CHECK(s1.prefill_tokens == 300);
  CHECK(s1.tokens.size() == 10);
  CHECK(s1.decode_tokens == 10);
  REQUIRE(s1.finished.size() == 1);
  CHECK(s1.finished[0].id == 1);
  CHECK(s1.finished[0].reason == finish_reason::length);
  CHECK(s1.finished[0].generated == 5);
  double want = c.prefill_s(100) + c.prefill_s(200);
  for (std::uint64_t k = 0; k < 4; ++k) want += c.decode_step_s(2, 101 + 201 + 2 * k);
  CHECK(rel_close(s1.duration_s, want, 1e-12));
  CHECK(e.stats().running == 1);
  CHECK(e.stats().kv_free_tokens == e.stats().kv_capacity_tokens - 209);

  // The survivor alone: 4 more tokens, indices 5..8.
  const step_result s2 = e.step();
  CHECK(s2.prefill_tokens == 0);
  REQUIRE(s2.tokens.size() == 4);
  CHECK(s2.tokens.front().index == 5);
  CHECK(s2.tokens.back().index == 8);
  REQUIRE(s2.finished.size() == 1);
  CHECK(s2.finished[0].generated == 9);
  want = 0;
  for (std::uint64_t k = 0; k < 4; ++k) want += c.decode_step_s(1, 205 + k);
  CHECK(rel_close(s2.duration_s, want, 1e-12));

  CHECK(e.idle());
  const step_result s3 = e.step();
  CHECK(s3.tokens.empty());
  CHECK(s3.duration_s == 0);
  const engine_stats st = e.stats();
  CHECK(st.steps == 2);
  CHECK(st.generated_tokens == 14);
  CHECK(st.prefill_tokens == 300);
  CHECK(st.kv_free_tokens == st.kv_capacity_tokens);
}

TEST_CASE("sim engine: tokens are the zero-cost engine's, and resume continues exactly", "[sim]") {
  for (const std::uint32_t vocab : {32000u, 200u}) {
    CAPTURE(vocab);
    sim_model m = llama2_7b_fp16();
    m.vocab_size = vocab;
    sim_engine sim = make_engine({}, m);
    null_engine null({vocab, 4096, 1 << 20, 256, 4096});
    for (seq_id id = 1; id <= 5; ++id) {
      REQUIRE(sim.submit(request(id, 10 + 7 * static_cast<std::uint32_t>(id), 12 + 3 * static_cast<std::uint32_t>(id), vocab)));
      REQUIRE(null.submit(request(id, 10 + 7 * static_cast<std::uint32_t>(id), 12 + 3 * static_cast<std::uint32_t>(id), vocab)));
    }
    const streams a = run_to_idle(sim);
    const streams b = run_to_idle(null);
    CHECK(a.tokens == b.tokens);
    REQUIRE(a.tokens.at(3).size() == 21);
    // Different sequences get different continuations: the check means something.
    CHECK(a.tokens.at(1) != std::vector<model::token_id>(a.tokens.at(2).begin(), a.tokens.at(2).begin() + 15));

    // Resume request 3 after 7 tokens: indices continue at 7, same tokens.
    sim_engine resumed = make_engine({}, m);
    generation_request r = request(3, 31, 21, vocab);
    r.resume_tokens.assign(a.tokens.at(3).begin(), a.tokens.at(3).begin() + 7);
    REQUIRE(resumed.submit(r));
    streams s;
    s.first_index[3] = 7;
    s = run_to_idle(resumed, s);
    CHECK(s.tokens.at(3) == std::vector<model::token_id>(a.tokens.at(3).begin() + 7, a.tokens.at(3).end()));
    CHECK(s.finished.at(3).generated == 21);
    // Its prefill covers the resumed tokens too.
    CHECK(resumed.stats().prefill_tokens == 31 + 7);

    // Resumed with everything: finished (length) at the next step, nothing emitted.
    sim_engine done = make_engine({}, m);
    r.resume_tokens = a.tokens.at(3);
    REQUIRE(done.submit(r));
    CHECK_FALSE(done.idle());
    const step_result f = done.step();
    CHECK(f.tokens.empty());
    REQUIRE(f.finished.size() == 1);
    CHECK(f.finished[0].reason == finish_reason::length);
    CHECK(f.finished[0].generated == 21);
    CHECK(done.idle());
  }
}

TEST_CASE("sim engine: a stop token ends its sequence and is not emitted", "[sim]") {
  sim_engine free_run = make_engine();
  REQUIRE(free_run.submit(request(1, 40, 30)));
  const std::vector<model::token_id> full = run_to_idle(free_run).tokens.at(1);
  // The first position whose token did not occur before it.
  std::size_t at = 1;
  while (std::find(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(at), full[at]) !=
         full.begin() + static_cast<std::ptrdiff_t>(at))
    ++at;
  REQUIRE(at < full.size());

  for (const std::size_t stop_at : {std::size_t{0}, at}) {
    CAPTURE(stop_at);
    sim_engine e = make_engine();
    generation_request r = request(1, 40, 30);
    r.stop_tokens = {full[stop_at]};
    REQUIRE(e.submit(r));
    const streams s = run_to_idle(e);
    CHECK(s.tokens.contains(1) == (stop_at > 0));
    if (stop_at > 0) CHECK(s.tokens.at(1) == std::vector<model::token_id>(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(stop_at)));
    CHECK(s.finished.at(1).reason == finish_reason::stop);
    CHECK(s.finished.at(1).generated == stop_at);
    CHECK(e.stats().kv_free_tokens == e.stats().kv_capacity_tokens);
  }
}

TEST_CASE("sim engine: KV capacity limits admission", "[sim]") {
  sim_engine e = make_engine({.kv_capacity_tokens = 300, .horizon_s = 0.1});
  REQUIRE(e.submit(request(1, 100, 100)));
  REQUIRE(e.submit(request(2, 100, 100)));
  const auto too_big = e.submit(request(3, 201, 100));
  REQUIRE_FALSE(too_big);
  CHECK(too_big.error().code == errc::invalid_argument);
  CHECK(too_big.error().message.find("KV cache capacity of 300") != std::string::npos);

  const step_result s1 = e.step();
  CHECK(s1.prefill_tokens == 100);
  CHECK(e.stats().running == 1);
  CHECK(e.stats().waiting == 1);
  CHECK(e.stats().kv_free_tokens == 100);
  for (const token_event& t : s1.tokens) CHECK(t.id == 1);

  // Request 2 gets its first token only after request 1 has finished.
  streams s;
  s.absorb(s1);
  bool one_done = !s1.finished.empty();
  CHECK_FALSE(one_done);
  while (!e.idle()) {
    const step_result r = e.step();
    for (const token_event& t : r.tokens)
      if (t.id == 2) CHECK(one_done);
    for (const finish_event& f : r.finished) one_done = one_done || f.id == 1;
    s.absorb(r);
  }
  CHECK(s.tokens.at(1).size() == 100);
  CHECK(s.tokens.at(2).size() == 100);
}

TEST_CASE("sim engine: bad requests get errors that name the problem", "[sim]") {
  sim_engine e = make_engine({.max_waiting = 2});
  const auto code = [&](generation_request r) { return e.submit(std::move(r)).error().code; };
  generation_request empty = request(1, 1, 4);
  empty.prompt.clear();
  CHECK(code(empty) == errc::invalid_argument);
  CHECK(code(request(1, 4000, 97)) == errc::invalid_argument);  // 4097 > context 4096
  generation_request resumed = request(1, 10, 2);
  resumed.resume_tokens = {5, 6, 7};
  CHECK(code(resumed) == errc::invalid_argument);
  generation_request outside = request(1, 10, 2);
  outside.prompt[3] = 32000;
  CHECK(e.submit(outside).error().message.find("outside the vocabulary") != std::string::npos);
  generation_request hot = request(1, 10, 2);
  hot.sampling.temperature = -1;
  CHECK(code(hot) == errc::invalid_argument);

  REQUIRE(e.submit(request(1, 10, 400)));
  CHECK(e.submit(request(1, 10, 4)).error().message.find("already active") != std::string::npos);
  REQUIRE(e.submit(request(2, 10, 400)));
  CHECK(code(request(3, 10, 4)) == errc::overloaded);
  e.step();  // both admitted: the queue has room again, ids still active
  CHECK(code(request(1, 10, 4)) == errc::invalid_argument);
  CHECK(e.submit(request(3, 10, 4)));
}

TEST_CASE("sim engine: admission respects the prefill token budget", "[sim]") {
  sim_engine e = make_engine({.max_batch_tokens = 100});
  REQUIRE(e.submit(request(1, 500, 3)));  // longer than the budget: admitted alone
  REQUIRE(e.submit(request(2, 60, 3)));
  REQUIRE(e.submit(request(3, 60, 3)));
  CHECK(e.step().prefill_tokens == 500);
  CHECK(e.stats().waiting == 2);
  // 60 fits, 60 + 60 does not.
  CHECK(e.step().prefill_tokens == 60);
  CHECK(e.stats().waiting == 1);
  CHECK(e.step().prefill_tokens == 60);

  sim_engine capped = make_engine({.max_running = 2});
  for (seq_id id = 1; id <= 3; ++id) REQUIRE(capped.submit(request(id, 10, 1000)));
  capped.step();
  CHECK(capped.stats().running == 2);
  CHECK(capped.stats().waiting == 1);
}

TEST_CASE("sim engine: the horizon caps a macro step", "[sim]") {
  const sim_cost_model c = h100_7b();
  sim_engine e = make_engine({.horizon_s = 0.05});
  REQUIRE(e.submit(request(1, 100, 1000)));
  const step_result s = e.step();
  CHECK(s.duration_s <= 0.05);
  // One more decode step would have crossed it.
  CHECK(s.duration_s + c.decode_step_s(1, 100 + s.tokens.size()) > 0.05);
  CHECK(s.tokens.size() == 10);  // 2.7 ms of prefill (first token), then 9 steps of ~5.05 ms

  // A prefill longer than the horizon ends its macro step; the next one
  // still makes progress.
  sim_engine tight = make_engine({.horizon_s = 0.001});
  REQUIRE(tight.submit(request(1, 100, 1000)));
  const step_result p = tight.step();
  CHECK(p.tokens.size() == 1);
  CHECK(rel_close(p.duration_s, c.prefill_s(100), 1e-12));
  const step_result d = tight.step();
  CHECK(d.tokens.size() == 1);
  CHECK(rel_close(d.duration_s, c.decode_step_s(1, 101), 1e-12));
}

TEST_CASE("sim engine: cancel frees KV at once and reports cancelled", "[sim]") {
  sim_engine e = make_engine({.kv_capacity_tokens = 300, .horizon_s = 0.02});
  REQUIRE(e.submit(request(1, 100, 100)));
  REQUIRE(e.submit(request(2, 100, 100)));
  REQUIRE(e.submit(request(3, 10, 10)));
  const step_result s1 = e.step();
  REQUIRE_FALSE(s1.tokens.empty());
  REQUIRE(e.stats().kv_free_tokens == 100);

  e.cancel(1);
  e.cancel(3);  // waiting
  e.cancel(3);  // twice: one event
  e.cancel(99);  // unknown: ignored
  CHECK(e.stats().kv_free_tokens == 300);
  CHECK(e.stats().running == 0);
  CHECK(e.stats().waiting == 1);
  const step_result s2 = e.step();
  streams seen;
  seen.absorb(s1);
  seen.absorb(s2);
  REQUIRE(s2.finished.size() == 2);
  CHECK(s2.finished[0].id == 1);
  CHECK(s2.finished[0].reason == finish_reason::cancelled);
  CHECK(s2.finished[0].generated == s1.tokens.size());
  CHECK(s2.finished[1].id == 3);
  CHECK(s2.finished[1].generated == 0);
  // The freed room admits the waiting request in the same step.
  CHECK(s2.prefill_tokens == 100);
  for (const token_event& t : s2.tokens) CHECK(t.id == 2);
  const streams rest = run_to_idle(e, seen);
  CHECK(rest.tokens.at(2).size() == 100);
  CHECK(rest.finished.at(2).reason == finish_reason::length);
  CHECK(e.stats().kv_free_tokens == 300);
}

TEST_CASE("sim engine: runs are deterministic", "[sim]") {
  const auto run = [] {
    sim_engine e = make_engine({.max_running = 8, .kv_capacity_tokens = 6000});
    std::vector<step_result> out;
    std::uint64_t x = 12345;
    for (seq_id id = 1; id <= 60; ++id) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      REQUIRE(e.submit(request(id, 20 + static_cast<std::uint32_t>(x >> 54), 5 + static_cast<std::uint32_t>((x >> 20) % 90))));
      if (id % 3 == 0) out.push_back(e.step());
    }
    while (!e.idle()) out.push_back(e.step());
    return out;
  };
  const auto a = run();
  const auto b = run();
  REQUIRE(a.size() == b.size());
  REQUIRE(a.size() > 30);
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].tokens.size() == b[i].tokens.size());
    for (std::size_t j = 0; j < a[i].tokens.size(); ++j) {
      CHECK(a[i].tokens[j].id == b[i].tokens[j].id);
      CHECK(a[i].tokens[j].token == b[i].tokens[j].token);
    }
    CHECK(a[i].finished.size() == b[i].finished.size());
    CHECK(a[i].duration_s == b[i].duration_s);  // bitwise
  }
}

namespace {

// Two requests prefilled together, then decoded until the shorter finishes:
// the boundaries of that first macro step, computed from the cost model.
std::vector<double> first_step_boundaries(const sim_cost_model& c) {
  std::vector<double> b{c.prefill_s(100) + c.prefill_s(120)};
  for (std::uint64_t k = 0; k < 5; ++k) b.push_back(b.back() + c.decode_step_s(2, 101 + 121 + 2 * k));
  return b;
}

sim_engine two_requests() {
  sim_engine e = make_engine();
  REQUIRE(e.submit(request(1, 100, 6)));
  REQUIRE(e.submit(request(2, 120, 11)));
  return e;
}

}  // namespace

TEST_CASE("sim engine: truncation keeps a prefix, and continuing equals the uninterrupted run", "[sim]") {
  const std::vector<double> b = first_step_boundaries(h100_7b());
  sim_engine whole = two_requests();
  const step_result full = whole.step();
  REQUIRE(full.tokens.size() == 12);
  REQUIRE(rel_close(full.duration_s, b.back(), 1e-12));
  CHECK_FALSE(whole.truncate_last_step(b.back()));  // its end: nothing to cut
  const streams uninterrupted = run_to_idle(whole, [&] { streams s; s.absorb(full); return s; }());

  const double mid = (b[1] + b[2]) / 2;
  for (const double at : {-1.0, 0.0, b[0] / 2, b[0], b[0] * (1 + 1e-12), mid, b[2], b[4], b[5] - 1e-9, b[5], 10.0}) {
    CAPTURE(at);
    sim_engine e = two_requests();
    const step_result first = e.step();
    const auto cut = static_cast<std::size_t>(std::lower_bound(b.begin(), b.end(), at) - b.begin());
    const std::optional<step_result> kept = e.truncate_last_step(at);
    if (cut + 1 >= b.size()) {
      CHECK_FALSE(kept);
      continue;
    }
    REQUIRE(kept);
    CHECK(rel_close(kept->duration_s, b[cut], 1e-12));
    // Both sequences emit at every boundary: 2 tokens per kept boundary.
    REQUIRE(kept->tokens.size() == 2 * (cut + 1));
    for (std::size_t i = 0; i < kept->tokens.size(); ++i) {
      CHECK(kept->tokens[i].id == first.tokens[i].id);
      CHECK(kept->tokens[i].token == first.tokens[i].token);
      CHECK(kept->tokens[i].index == first.tokens[i].index);
    }
    CHECK(kept->finished.empty());
    CHECK(kept->prefill_tokens == 220);
    CHECK(e.stats().generated_tokens == kept->tokens.size());
    CHECK(e.stats().steps == 1);

    streams s;
    s.absorb(*kept);
    s = run_to_idle(e, s);
    CHECK(s.tokens == uninterrupted.tokens);
    CHECK(s.finished.at(1).generated == 6);
    CHECK(s.finished.at(2).generated == 11);
    CHECK(rel_close(s.time_s, uninterrupted.time_s, 1e-12));
    CHECK(e.stats().kv_free_tokens == e.stats().kv_capacity_tokens);
  }
}

TEST_CASE("sim engine: truncation around arrivals, cancels and sharing changes", "[sim]") {
  const sim_cost_model c = h100_7b();
  const std::vector<double> b = first_step_boundaries(c);

  SECTION("a request submitted after the step waits for the cut") {
    sim_engine e = two_requests();
    e.step();
    REQUIRE(e.submit(request(3, 50, 4)));
    const auto kept = e.truncate_last_step((b[1] + b[2]) / 2);
    REQUIRE(kept);
    CHECK(kept->tokens.size() == 6);
    for (const token_event& t : kept->tokens) CHECK(t.id != 3);
    CHECK(e.stats().waiting == 1);
    CHECK(e.stats().running == 2);
    const step_result next = e.step();
    CHECK(next.prefill_tokens == 50);
    streams s;
    s.absorb(*kept);
    s.absorb(next);
    s = run_to_idle(e, s);
    CHECK(s.tokens.at(1).size() == 6);
    CHECK(s.tokens.at(2).size() == 11);
    CHECK(s.tokens.at(3).size() == 4);
  }
  SECTION("the step can be cut again, shorter") {
    sim_engine e = two_requests();
    e.step();
    REQUIRE(e.truncate_last_step(b[3]));
    const auto again = e.truncate_last_step(b[0]);
    REQUIRE(again);
    CHECK(again->tokens.size() == 2);
    CHECK(rel_close(again->duration_s, b[0], 1e-12));
  }
  SECTION("a cancel of a running sequence forbids the cut; of a waiting one, not") {
    sim_engine e = two_requests();
    e.step();
    e.cancel(2);
    CHECK_FALSE(e.truncate_last_step(b[1]));
    sim_engine w = two_requests();
    w.step();
    REQUIRE(w.submit(request(3, 50, 4)));
    w.cancel(3);
    CHECK(w.truncate_last_step(b[1]));
  }
  SECTION("reusing the id of a request the step finished forbids the cut") {
    sim_engine e = two_requests();
    REQUIRE(e.step().finished.size() == 1);  // request 1
    REQUIRE(e.submit(request(1, 30, 4)));
    CHECK_FALSE(e.truncate_last_step(b[1]));
    sim_engine other = two_requests();
    other.step();
    REQUIRE(other.submit(request(7, 30, 4)));
    CHECK(other.truncate_last_step(b[1]));
  }
  SECTION("the kept part ran under the old sharing") {
    sim_engine e = two_requests();
    e.step();
    e.set_device_sharing(4);
    const auto kept = e.truncate_last_step(b[2]);
    REQUIRE(kept);
    CHECK(rel_close(kept->duration_s, b[2], 1e-12));
    const step_result next = e.step();
    // The rest of it runs under the new one: a quarter of the bandwidth.
    CHECK(rel_close(next.duration_s, (b[5] - b[2]) * 4, 1e-9));
  }
  SECTION("finishes reported by the step are reported once") {
    sim_engine e = two_requests();
    REQUIRE(e.submit(request(3, 50, 4)));
    e.cancel(3);
    const step_result s = e.step();
    REQUIRE(s.finished.size() == 2);  // 3 cancelled, 1 finished
    const auto kept = e.truncate_last_step(b[1]);
    REQUIRE(kept);
    REQUIRE(kept->finished.size() == 1);
    CHECK(kept->finished[0].id == 3);
    CHECK(kept->finished[0].reason == finish_reason::cancelled);
    streams seen;
    seen.absorb(*kept);
    const streams rest = run_to_idle(e, seen);  // would fail on a second finish of 3
    CHECK(rest.finished.at(1).generated == 6);
    CHECK(rest.finished.at(2).generated == 11);
  }
  SECTION("a step without prefill is cut after its first decode step at the earliest") {
    sim_engine e = two_requests();
    e.step();  // request 1 finishes; request 2 has 6 of its 11 tokens
    const step_result second = e.step();
    REQUIRE(second.tokens.size() == 5);
    REQUIRE(second.prefill_tokens == 0);
    sim_engine f = two_requests();
    f.step();
    f.step();
    const auto kept = f.truncate_last_step(0);
    REQUIRE(kept);
    REQUIRE(kept->tokens.size() == 1);
    CHECK(kept->tokens[0].index == 6);
    CHECK(rel_close(kept->duration_s, c.decode_step_s(1, 120 + 6), 1e-12));
    const step_result rest = f.step();
    REQUIRE(rest.tokens.size() == 4);
    for (std::size_t i = 0; i < 4; ++i) CHECK(rest.tokens[i].token == second.tokens[i + 1].token);
    CHECK(rel_close(kept->duration_s + rest.duration_s, second.duration_s, 1e-12));
  }
}

TEST_CASE("sim engine: random truncations never change what a request receives", "[sim]") {
  // Requests arrive before given steps; the second engine receives each
  // arrival *during* the step before and cuts that step at a random time, as
  // the device does. Timing differs; every request's tokens and finish must not.
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    CAPTURE(seed);
    std::uint64_t x = seed * 0x9E3779B97F4A7C15ull;
    const auto next = [&x](std::uint64_t n) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      return (x >> 33) % n;
    };
    std::map<std::size_t, std::vector<generation_request>> arrivals;
    for (seq_id id = 1; id <= 30; ++id) {
      generation_request r = request(id, 1 + static_cast<std::uint32_t>(next(300)), 1 + static_cast<std::uint32_t>(next(60)));
      if (next(3) == 0) r.stop_tokens = {static_cast<model::token_id>(35 + next(95))};
      arrivals[next(40)].push_back(std::move(r));
    }
    const sim_engine_config cfg{.max_running = 6, .max_batch_tokens = 256, .kv_capacity_tokens = 1500, .horizon_s = 0.05};
    sim_engine plain = make_engine(cfg);
    sim_engine cut = make_engine(cfg);
    streams a;
    streams b;
    std::size_t truncations = 0;
    for (const generation_request& r : arrivals[0]) REQUIRE(cut.submit(r));
    for (std::size_t i = 0; i < 100000 && (i < 40 || !plain.idle() || !cut.idle()); ++i) {
      const auto found = arrivals.find(i);
      if (found != arrivals.end())
        for (const generation_request& r : found->second) REQUIRE(plain.submit(r));
      a.absorb(plain.step());
      step_result r = cut.step();
      const auto soon = arrivals.find(i + 1);
      if (soon != arrivals.end())
        for (const generation_request& q : soon->second) REQUIRE(cut.submit(q));
      const double at = r.duration_s * static_cast<double>(next(1001)) / 1000.0;
      if (auto kept = cut.truncate_last_step(at)) {
        // Shorter; not always fewer tokens (a last step may only hit stop tokens).
        CHECK(kept->duration_s < r.duration_s);
        CHECK(kept->tokens.size() <= r.tokens.size());
        r = std::move(*kept);
        ++truncations;
      }
      b.absorb(r);
    }
    CHECK(truncations > 5);
    CHECK(a.tokens == b.tokens);
    REQUIRE(a.finished.size() == 30);
    REQUIRE(b.finished.size() == 30);
    for (const auto& [id, f] : a.finished) {
      CHECK(b.finished.at(id).reason == f.reason);
      CHECK(b.finished.at(id).generated == f.generated);
    }
    CHECK(cut.stats().kv_free_tokens == cut.stats().kv_capacity_tokens);
    CHECK(cut.stats().generated_tokens == plain.stats().generated_tokens);
  }
}

TEST_CASE("sim engine: a macro step is cheap", "[sim]") {
  // 16 sequences in flight, finishes spread evenly (one every 4 decode
  // steps), each replaced on finishing: what one busy replica does.
  sim_engine e = make_engine({.max_running = 16});
  const std::uint32_t max_tokens = 64;
  seq_id id = 0;
  for (std::uint32_t i = 0; i < 16; ++i) REQUIRE(e.submit(request(++id, 100, 4 * (i + 1))));
  generation_request fresh = request(0, 100, max_tokens);
  constexpr int steps = 100'000;
  std::uint64_t tokens = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) {
    const step_result r = e.step();
    tokens += r.tokens.size();
    for (std::size_t f = 0; f < r.finished.size(); ++f) {
      fresh.id = ++id;
      REQUIRE(e.submit(fresh));
    }
  }
  const double elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  WARN("sim_engine: " << steps << " macro steps, " << tokens << " tokens in " << elapsed_s * 1e3 << " ms ("
                      << elapsed_s / steps * 1e9 << " ns per macro step)");
  CHECK(e.stats().steps == steps);
  // The last replacement waits for the next step.
  CHECK(e.stats().running + e.stats().waiting == 16);
  // 4 decode steps of 16, plus the newcomer's first token.
  CHECK(tokens >= std::uint64_t{steps} * 60);
}

TEST_CASE("sim engine: with prefill_ends_step the first tokens come out at the end of the prefill", "[sim]") {
  sim_engine_config cfg;
  cfg.prefill_ends_step = true;
  sim_engine e = make_engine(cfg);
  generation_request r;
  r.id = 1;
  r.prompt.assign(1000, 5);
  r.max_tokens = 50;
  REQUIRE(e.submit(r));
  const auto first = e.step();
  REQUIRE(first.tokens.size() == 1);  // only the first token
  CHECK(rel_close(first.duration_s, e.cost().prefill_s(1000), 1e-12));
  const auto rest = e.step();  // decoding runs in the next macro step
  CHECK(rest.tokens.size() == 49);
  REQUIRE(rest.finished.size() == 1);
  CHECK(rest.tokens.front().index == 1);
}

// ---- prefix cache ------------------------------------------------------------

namespace {

// A prompt of `shared` tokens every request of the test has, then `own` of
// the request's own.
generation_request shared_prefix_request(seq_id id, std::uint32_t shared, std::uint32_t own, std::uint32_t max_tokens) {
  generation_request r;
  r.id = id;
  r.prompt = prompt_of(shared, 1);
  const auto tail = prompt_of(own, 1000 + id);
  r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
  r.max_tokens = max_tokens;
  return r;
}

// One step, its events kept (run_to_idle checks token indices from 0).
step_result step_into(sim_engine& e, streams& s) {
  step_result r = e.step();
  s.absorb(r);
  return r;
}

sim_engine_config with_prefix_cache(std::uint64_t kv_capacity_tokens = 1 << 20) {
  sim_engine_config cfg;
  cfg.prefix_block_tokens = 16;
  cfg.kv_capacity_tokens = kv_capacity_tokens;
  cfg.prefill_ends_step = true;
  return cfg;
}

}  // namespace

TEST_CASE("sim prefix cache: a shared prefix is prefilled once, and reported", "[sim][prefix]") {
  auto e = make_engine(with_prefix_cache());
  streams s;
  REQUIRE(e.submit(shared_prefix_request(1, 1000, 200, 4)));
  const step_result first = step_into(e, s);
  CHECK(first.prefill_tokens == 1200);
  CHECK(rel_close(first.duration_s, e.cost().prefill_s(1200)));
  s = run_to_idle(e, s);
  // 1000 shared tokens are 62 full blocks (992 tokens); the rest is computed.
  REQUIRE(e.submit(shared_prefix_request(2, 1000, 300, 4)));
  const step_result second = step_into(e, s);
  CHECK(second.prefill_tokens == 1300 - 992);
  CHECK(rel_close(second.duration_s, e.cost().prefill_s(1300 - 992, 992)));
  s = run_to_idle(e, s);
  CHECK(s.finished.at(2).cached_tokens == 992);
  // Request 2's prompt again: all its 81 full blocks (1296 of 1300 tokens).
  auto r3 = shared_prefix_request(2, 1000, 300, 4);
  r3.id = 3;
  REQUIRE(e.submit(r3));
  CHECK(step_into(e, s).prefill_tokens == 1300 - (1299 / 16) * 16);
  const engine_stats st = e.stats();
  CHECK(st.prefix_lookup_tokens == 1200 + 1300 + 1300);
  CHECK(st.prefix_hit_tokens == 992 + 1296);
  // Requests 1 and 2 (75 and 81 blocks, 62 shared); request 3's enter at the next step.
  CHECK(st.prefix_cached_blocks == 75 + 81 - 62);
  CHECK(st.prefix_evicted_blocks == 0);  // room for all
  const prefix_summary sum = e.cached_prefixes(1000);
  CHECK(sum.block_tokens == 16);
  CHECK(sum.hashes.size() == st.prefix_cached_blocks);
  // Most recent first: the last prompt's first block (a chain's start is the
  // most recently used of it, so eviction takes chains from their ends).
  CHECK(sum.hashes.front() == model::prefix_block_hashes(r3.prompt, 16, 1).front());
  CHECK(e.cached_prefixes(5).hashes.size() == 5);
}

TEST_CASE("sim prefix cache: bounded by the KV capacity, least recently used out first", "[sim][prefix]") {
  auto e = make_engine(with_prefix_cache(1600));  // 100 blocks
  for (seq_id id = 1; id <= 4; ++id) {
    REQUIRE(e.submit(request(id, 800, 4)));  // 50 blocks each, nothing shared
    run_to_idle(e);
  }
  REQUIRE(e.submit(request(9, 16, 1)));  // a step after the last: its blocks enter the cache
  run_to_idle(e);
  CHECK(e.stats().prefix_cached_blocks == 100);
  CHECK(e.stats().prefix_evicted_blocks == 100);  // 200 blocks entered, 100 fit
  // Requests 3 and 4 are cached whole, 1 and 2 are gone.
  auto again = request(4, 800, 4);
  again.id = 10;
  REQUIRE(e.submit(again));
  streams s;
  CHECK(step_into(e, s).prefill_tokens == 800 - 784);
  s = run_to_idle(e, s);
  CHECK(e.stats().prefix_evicted_miss_tokens == 0);  // 4's blocks were found, not missed
  auto old = request(1, 800, 4);
  old.id = 11;
  REQUIRE(e.submit(old));
  CHECK(e.step().prefill_tokens == 800);
  CHECK(e.stats().prefix_evicted_miss_tokens == 784);  // all it could have reused (as 10 did), evicted lately
}

TEST_CASE("sim prefix cache: a prompt evicted, cached again and found whole misses nothing", "[sim][prefix]") {
  auto e = make_engine(with_prefix_cache(1600));  // 100 blocks, and the last 100 evicted remembered
  const auto send = [&](seq_id prompt, seq_id id) {
    auto r = request(prompt, 800, 4);  // 50 blocks
    r.id = id;
    REQUIRE(e.submit(r));
    run_to_idle(e);
  };
  send(1, 1);
  send(2, 2);
  send(3, 3);
  REQUIRE(e.submit(request(9, 16, 1)));  // a step after: 3's blocks enter, 1's go
  run_to_idle(e);
  CHECK(e.stats().prefix_evicted_blocks == 50);
  send(1, 11);  // missed, evicted lately: 49 usable blocks; 2's go when it enters
  CHECK(e.stats().prefix_evicted_miss_tokens == 784);
  send(9, 12);  // 1's blocks enter the cache again, and stay remembered as evicted
  send(1, 13);  // found whole (the last token computed): nothing missed
  CHECK(e.stats().prefix_evicted_miss_tokens == 784);
}

TEST_CASE("sim prefix cache: off unless configured, and requests admitted together share nothing", "[sim][prefix]") {
  auto off = make_engine();
  REQUIRE(off.submit(shared_prefix_request(1, 1000, 10, 2)));
  run_to_idle(off);
  REQUIRE(off.submit(shared_prefix_request(2, 1000, 10, 2)));
  CHECK(off.step().prefill_tokens == 1010);
  CHECK(off.cached_prefixes(10).block_tokens == 0);
  CHECK(off.stats().prefix_lookup_tokens == 0);
  // Two requests in one step: neither finds the other's blocks (they are
  // computed in the same batch), the next one finds them.
  auto on = make_engine(with_prefix_cache());
  REQUIRE(on.submit(shared_prefix_request(1, 512, 10, 2)));
  REQUIRE(on.submit(shared_prefix_request(2, 512, 10, 2)));
  streams s;
  CHECK(step_into(on, s).prefill_tokens == 1044);
  s = run_to_idle(on, s);
  REQUIRE(on.submit(shared_prefix_request(3, 512, 10, 2)));
  CHECK(on.step().prefill_tokens == 522 - 512);
}

TEST_CASE("sim prefix cache: a cut step replays with the same cache hits", "[sim][prefix]") {
  sim_engine_config cfg = with_prefix_cache();
  cfg.prefill_ends_step = false;
  auto a = make_engine(cfg);
  auto b = make_engine(cfg);
  for (auto* e : {&a, &b}) {
    REQUIRE(e->submit(shared_prefix_request(1, 640, 0, 2)));
    run_to_idle(*e);
    REQUIRE(e->submit(shared_prefix_request(2, 640, 100, 50)));
  }
  streams sa, sb;
  const step_result whole = step_into(a, sa);
  const step_result first = b.step();
  REQUIRE(first.duration_s == whole.duration_s);
  const auto cut = b.truncate_last_step(whole.duration_s / 2);
  REQUIRE(cut);
  sb.absorb(*cut);
  CHECK(cut->prefill_tokens == whole.prefill_tokens);
  CHECK(whole.prefill_tokens == 100);  // the shared 640 tokens are 40 whole blocks
  sa = run_to_idle(a, sa);
  sb = run_to_idle(b, sb);
  CHECK(sa.finished.at(2).cached_tokens == 640);
  CHECK(sb.finished.at(2).cached_tokens == 640);
  CHECK(a.stats().prefix_hit_tokens == b.stats().prefix_hit_tokens);
}
