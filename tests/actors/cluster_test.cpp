// The embedded cluster's actors on CAF's deterministic test scheduler, in
// virtual time: lifecycle to ready, generation through the router equal to
// the engine's own output, cancellation freeing KV blocks, supervision.

#include <catch2/catch.hpp>

#include <caf/actor_registry.hpp>
#include <caf/actor_system.hpp>
#include <caf/send.hpp>

#include "actors/cluster_supervisor.hpp"
#include "actors/messages.hpp"
#include "../common/poisoned_model.hpp"
#include "cluster_fixture.hpp"
#include "engine/cpu_engine.hpp"
#include "engine/thread_pool.hpp"
#include "gpu/cpu_memory_pool.hpp"
#include "model/llama_model.hpp"

using namespace exa;

namespace {

api::generate_request request(std::string id, std::string prompt, std::uint32_t max_tokens) {
  api::generate_request r;
  r.request_id = std::move(id);
  r.model = "tiny";
  r.prompt_text = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

std::vector<std::int32_t> engine_greedy(const std::string& prompt, std::uint32_t max_tokens) {
  auto m = model::llama_model::load(test::tiny_model_path());
  REQUIRE(m.has_value());
  auto pool = gpu::cpu_memory_pool::create(engine::cpu_engine::kv_block_bytes((*m)->config(), 16), 64);
  engine::thread_pool threads(1);
  engine::cpu_engine eng(*m, **pool, threads);
  engine::generation_request req;
  req.prompt = *(*m)->tokenizer().encode(prompt, true);
  req.max_tokens = max_tokens;
  REQUIRE(eng.submit(req));
  std::vector<std::int32_t> out;
  while (!eng.idle())
    for (const auto& t : eng.step().tokens) out.push_back(t.token);
  return out;
}

std::size_t count_state(const api::cluster_status& s, const std::string& state) {
  std::size_t n = 0;
  for (const auto& r : s.replicas) n += r.state == state;
  return n;
}

}  // namespace

TEST_CASE("replicas walk the lifecycle to ready and the cluster reports ready", "[actors][lifecycle]") {
  test::cluster_fixture f(test::cluster_fixture::defaults(2));
  const auto s = f.status();
  CHECK(s.nodes.size() == 2);
  CHECK(s.devices.size() == 4);
  REQUIRE(s.replicas.size() == 2);
  CHECK(count_state(s, "ready") == 2);
  // Anti-affinity: the two replicas are on different nodes.
  CHECK(s.replicas[0].node != s.replicas[1].node);
  CHECK(f.ready());
  std::uint64_t used = 0;
  for (const auto& d : s.devices) used += d.memory_used_bytes;
  CHECK(used > 0);  // the ledger holds the replicas
}

TEST_CASE("a streamed greedy completion equals the engine's own output", "[actors][generate]") {
  test::cluster_fixture f(test::cluster_fixture::defaults(2));
  auto sink = f.generate(request("r1", "Hello there", 24));
  f.run();
  REQUIRE(sink->result.has_value());
  CHECK_FALSE(sink->result->err.has_value());
  CHECK(sink->result->reason == api::finish_reason::length);
  CHECK(sink->result->usage.completion_tokens == 24);
  CHECK(sink->tokens() == engine_greedy("Hello there", 24));
}

TEST_CASE("many concurrent requests all complete with their own output", "[actors][generate]") {
  test::cluster_fixture f(test::cluster_fixture::defaults(2));
  std::vector<std::shared_ptr<test::recording_sink>> sinks;
  for (int i = 0; i < 12; ++i) sinks.push_back(f.generate(request("r" + std::to_string(i), "prompt " + std::to_string(i % 3), 10)));
  f.run();
  for (int i = 0; i < 12; ++i) {
    REQUIRE(sinks[i]->result.has_value());
    CHECK(sinks[i]->tokens() == engine_greedy("prompt " + std::to_string(i % 3), 10));
  }
}

TEST_CASE("cancellation stops generation mid-stream and frees the KV blocks", "[actors][cancel]") {
  test::cluster_fixture f(test::cluster_fixture::defaults(1));
  auto sink = f.generate(request("long", "Hi", 400));
  f.run_some(60);  // part-way: some tokens streamed, far from 400
  REQUIRE_FALSE(sink->result.has_value());
  REQUIRE_FALSE(sink->chunks.empty());
  f.backend().cancel("long");  // as a vanished client would
  f.run();
  REQUIRE(sink->result.has_value());
  CHECK(sink->result->reason == api::finish_reason::cancelled);
  CHECK(sink->result->usage.completion_tokens < 400);
  const auto s = f.status();
  REQUIRE(s.replicas.size() == 1);
  CHECK(s.replicas[0].kv_used_tokens == 0);
  CHECK(s.replicas[0].running == 0);
}

TEST_CASE("a killed replica is restarted in place and serves again", "[actors][supervision]") {
  test::cluster_fixture f(test::cluster_fixture::defaults(1));
  auto s = f.status();
  REQUIRE(s.replicas.size() == 1);
  const auto id = std::stoull(s.replicas[0].id);
  const auto node = s.replicas[0].node;
  f.kill_replica(node, id);
  s = f.status();
  REQUIRE(s.replicas.size() == 1);
  CHECK(s.replicas[0].id == std::to_string(id));  // same slot, same replica, same node
  CHECK(s.replicas[0].node == node);
  CHECK(s.replicas[0].state == "ready");
  auto sink = f.generate(request("after", "Hello there", 8));
  f.run();
  REQUIRE(sink->result.has_value());
  CHECK(sink->tokens() == engine_greedy("Hello there", 8));
}

TEST_CASE("a crash-looping replica is quarantined and placed on another node", "[actors][supervision]") {
  test::cluster_fixture f(test::cluster_fixture::defaults(1));
  auto s = f.status();
  const auto id = std::stoull(s.replicas[0].id);
  const auto node = s.replicas[0].node;
  for (int i = 0; i < 4; ++i) f.kill_replica(node, id);  // the node allows 3 restarts per window
  s = f.status();
  REQUIRE(s.replicas.size() == 1);
  CHECK(s.replicas[0].node != node);                    // moved
  CHECK(s.replicas[0].id != std::to_string(id));        // a new replica fills the slot
  CHECK(s.replicas[0].epoch == 2);                      // under a new epoch
  CHECK(s.replicas[0].state == "ready");
  CHECK(f.ready());
}

TEST_CASE("a replica whose warm-up gives no finite logit never becomes ready, and a clean deployment serves",
          "[actors][errors]") {
  auto o = test::cluster_fixture::defaults(1);
  api::deploy_request bad;
  bad.name = "overflowing";
  bad.replicas = 1;
  bad.model_file = test::write_poisoned_copy(test::tiny_model_path(), 2);  // in the warm-up prompt {1, 2, 3, 4}
  REQUIRE(model::llama_model::load(bad.model_file));  // it loads: only its values are at fault
  o.deployments.push_back(bad);
  test::cluster_fixture f(o);
  f.advance(std::chrono::milliseconds(2000));
  const auto s = f.status();
  CHECK(test::replicas_up(s, "tiny") == 1);
  CHECK(test::replicas_up(s, "overflowing") == 0);  // restarted, moved, given up: never serving
  auto sink = f.generate_short("tiny");
  REQUIRE(sink->result);
  CHECK_FALSE(sink->result->err);
}

TEST_CASE("a request in flight survives its replica being killed", "[actors][resume]") {
  test::cluster_fixture f(test::cluster_fixture::defaults(2));
  const auto expected = engine_greedy("Resume me", 60);
  // Idle replicas tie on load, so the first request goes to replica 1 (lowest
  // id), which placement put on node 0.
  const auto s = f.status();
  REQUIRE(s.replicas.size() == 2);
  const auto node0 = f.node(0);
  auto sink = f.generate(request("survivor", "Resume me", 60));
  f.run_some(80);
  REQUIRE_FALSE(sink->result.has_value());
  const auto streamed_before = sink->tokens().size();
  REQUIRE(streamed_before > 0);
  REQUIRE(streamed_before < 60);
  caf::anon_send(node0, actors::kill_replica{1});
  f.run();
  REQUIRE(sink->result.has_value());
  CHECK_FALSE(sink->result->err.has_value());
  CHECK(sink->result->replica == "2");  // finished elsewhere
  CHECK(sink->tokens() == expected);    // one continuous stream, no gap, no duplicate
  // Chunk indices are contiguous.
  std::uint32_t next = 0;
  for (const auto& c : sink->chunks) {
    CHECK(c.first_index == next);
    next += static_cast<std::uint32_t>(c.tokens.size());
  }
}

TEST_CASE("requests that arrive during a step join the next one without touching the engine", "[actors][batching]") {
  // Steps take modeled time: one is out on the device while more requests
  // arrive. They wait, and when the step returns they are submitted with
  // stepping held off (the replica asserts it never touches its engine while
  // a step is out), so all of them join one next step.
  auto o = test::cluster_fixture::defaults(1);
  o.model_step_time = true;
  test::cluster_fixture f(o);
  f.advance(std::chrono::milliseconds(200));
  REQUIRE(f.ready());
  auto first = f.generate(request("first", "One", 6));
  f.run();  // submitted; its first step is now out on the device
  std::vector<std::shared_ptr<test::recording_sink>> later;
  for (int i = 0; i < 3; ++i) later.push_back(f.generate(request("later" + std::to_string(i), "Two", 6)));
  f.run();  // they reach the replica while the step is out
  REQUIRE_FALSE(first->result.has_value());
  for (const auto& s : later) CHECK(s->chunks.empty());
  f.advance(std::chrono::milliseconds(200));
  REQUIRE(first->result.has_value());
  CHECK_FALSE(first->result->err.has_value());
  CHECK(first->tokens() == engine_greedy("One", 6));
  const auto want = engine_greedy("Two", 6);
  for (const auto& s : later) {
    REQUIRE(s->result.has_value());
    CHECK_FALSE(s->result->err.has_value());
    CHECK(s->tokens() == want);
    // Sent together and admitted into the same step: the same virtual time
    // to first token. (One step each would space them a step apart.)
    CHECK(s->result->timings.ttft_ms == later.front()->result->timings.ttft_ms);
  }
  // The replica was never restarted (a touched engine would have crashed it).
  std::string text;
  f.backend().metrics([&](std::string t) { text = std::move(t); });
  CHECK_THAT(text, !Catch::Contains("exaserve_replica_restarts_total{node=\"0\"} 1"));
  CHECK_THAT(text, !Catch::Contains("exaserve_replica_restarts_total{node=\"1\"} 1"));
}

TEST_CASE("unknown models and oversized prompts get errors naming the problem", "[actors][errors]") {
  test::cluster_fixture f(test::cluster_fixture::defaults(1));
  auto r = request("x", "hi", 4);
  r.model = "nope";
  auto a = f.generate(r);
  auto b = f.generate(request("y", "hi", 100000));
  f.run();
  REQUIRE(a->result.has_value());
  REQUIRE(a->result->err.has_value());
  CHECK(a->result->err->code == errc::not_found);
  CHECK_THAT(a->result->err->message, Catch::Contains("unknown model 'nope'"));
  REQUIRE(b->result->err.has_value());
  CHECK(b->result->err->code == errc::invalid_argument);
  CHECK_THAT(b->result->err->message, Catch::Contains("context length"));
}

TEST_CASE("metrics count requests, tokens, latency and replicas by state", "[actors][metrics]") {
  test::cluster_fixture f(test::cluster_fixture::defaults(2));
  auto ok = f.generate(request("m1", "Hi", 7));
  auto r = request("m2", "Hi", 7);
  r.model = "missing";
  auto refused = f.generate(r);
  f.run();
  REQUIRE(ok->result.has_value());
  REQUIRE(refused->result.has_value());
  std::string text;
  f.backend().metrics([&](std::string t) { text = std::move(t); });
  CHECK_THAT(text, Catch::Contains("exaserve_requests_total{model=\"tiny\",tenant=\"\",outcome=\"completed\"} 1"));
  CHECK_THAT(text, Catch::Contains("exaserve_requests_total{model=\"unknown\",tenant=\"\",outcome=\"refused\"} 1"));
  CHECK_THAT(text, Catch::Contains("exaserve_generated_tokens_total{model=\"tiny\"} 7"));
  CHECK_THAT(text, Catch::Contains(
                       "exaserve_time_to_first_token_ms_count{model=\"tiny\",deployment=\"tiny\",version=\"1\",tenant=\"\"} 1"));
  CHECK_THAT(text, Catch::Contains("exaserve_replicas{state=\"ready\"} 2"));
  CHECK_THAT(text, Catch::Contains("exaserve_kv_capacity_tokens{replica=\"1\"}"));
  CHECK_THAT(text, Catch::Contains("# TYPE exaserve_time_to_first_token_ms histogram"));
}
