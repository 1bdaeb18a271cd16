// A request actor puts a replica's tokens back in order: chunks and the
// finish can overtake each other when the replica's route to the gateway
// changes mid-stream (through the controller, then direct). A gap that never
// fills makes it leave that replica and resume elsewhere, token-exact.
// Virtual time; the replica and the router are scripted.

#include <catch2/catch.hpp>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "actors/messages.hpp"
#include "actors/request_actor.hpp"
#include "cluster_fixture.hpp"
#include "engine/engine.hpp"
#include "model/llama_model.hpp"
#include "model/model_gen.hpp"

using namespace exa;
using namespace std::chrono_literals;

namespace {

struct replica_log {
  std::vector<actors::submit_msg> submits;
  std::vector<std::uint64_t> cancels;
};

// Accepts every submit and records it; its tokens are sent by the test.
caf::behavior scripted_replica(caf::event_based_actor*, std::shared_ptr<replica_log> log) {
  return {
      [=](const actors::submit_msg& m) -> actors::ok_atom {
        log->submits.push_back(m);
        return actors::ok_atom::value;
      },
      [=](const actors::cancel_msg& m) { log->cancels.push_back(m.request); },
  };
}

// Hands out the replicas in turn.
caf::behavior scripted_router(caf::event_based_actor*, std::vector<caf::actor> replicas,
                              std::shared_ptr<std::vector<actors::replica_outcome>> outcomes) {
  auto next = std::make_shared<std::size_t>(0);
  return {
      [=](const actors::pick_replica&) -> actors::picked_replica {
        const std::size_t i = std::min(*next, replicas.size() - 1);
        ++*next;
        return {static_cast<cluster::replica_id>(i + 1), 1, replicas[i]};
      },
      [=](const actors::replica_outcome& o) { outcomes->push_back(o); },
      [=](const actors::adopt_request&) {},
      [=](const actors::request_sample&) {},
  };
}

class config : public caf::actor_system_config {
 public:
  config() {
    set("scheduler.policy", caf::atom("testing"));
    set("logger.verbosity", caf::atom("quiet"));
    actors::register_message_types(*this);
  }
};

struct fixture {
  config cfg;
  caf::actor_system sys{cfg};
  caf::scheduler::test_coordinator& sched = dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  std::shared_ptr<replica_log> log_a = std::make_shared<replica_log>(), log_b = std::make_shared<replica_log>();
  caf::actor a = sys.spawn(scripted_replica, log_a), b = sys.spawn(scripted_replica, log_b);
  std::shared_ptr<std::vector<actors::replica_outcome>> outcomes =
      std::make_shared<std::vector<actors::replica_outcome>>();
  caf::actor router = sys.spawn(scripted_router, std::vector<caf::actor>{a, b}, outcomes);
  std::shared_ptr<test::recording_sink> sink = std::make_shared<test::recording_sink>();
  caf::actor request;

  // With logprobs the request needs a real model (a simulated one has no
  // logits, and the request refuses at once): the tiny one, for its tokenizer.
  // `model_file`: serve that file, ending at its end-of-generation tokens.
  explicit fixture(std::uint32_t max_tokens, bool logprobs = false, const std::string& model_file = {}) {
    actors::request_context ctx;
    if (logprobs || !model_file.empty()) {
      auto m = model::llama_model::load(model_file.empty() ? test::tiny_model_path() : model_file);
      REQUIRE(m.has_value());
      ctx.model = *m;
      ctx.request.logprobs = logprobs;
      ctx.request.top_logprobs = logprobs ? 1 : 0;
    }
    ctx.number = 7;
    ctx.request.request_id = "req-7";
    ctx.request.model = "m";
    ctx.request.prompt_ids = std::vector<std::int32_t>{1, 2, 3};
    ctx.request.max_tokens = max_tokens;
    ctx.request.ignore_eos = model_file.empty();
    ctx.sink = sink;
    ctx.vocab_size = 100;
    ctx.context_length = 256;
    ctx.router = router;
    ctx.reorder_timeout_ms = 500;
    request = sys.spawn(actors::request_actor, std::move(ctx));
    run();
  }
  ~fixture() {
    for (const auto& x : {a, b, router, request}) caf::anon_send_exit(x, caf::exit_reason::user_shutdown);
    run();
  }
  void run() {
    for (int guard = 0; sched.run() > 0; ++guard) REQUIRE(guard < 10000);
  }
  void tokens(const caf::actor& from, std::uint32_t first, std::vector<std::int32_t> ids) {
    caf::send_as(from, request, actors::token_msg{7, std::move(ids), first});
    run();
  }
  // Tokens with logprobs: token i's logprob is `lp[i]`, its one alternative itself.
  void tokens_lp(const caf::actor& from, std::uint32_t first, std::vector<std::int32_t> ids, std::vector<float> lp) {
    actors::token_msg m{7, ids, first, {}};
    for (std::size_t i = 0; i < ids.size(); ++i) m.logprobs.push_back({lp[i], {ids[i]}, {lp[i]}});
    caf::send_as(from, request, std::move(m));
    run();
  }
  void finished(const caf::actor& from, std::uint32_t generated, std::uint32_t cached_tokens = 0,
                engine::finish_reason reason = engine::finish_reason::length) {
    caf::send_as(from, request, actors::finish_msg{7, static_cast<std::uint8_t>(reason), generated, cached_tokens});
    run();
  }
};

}  // namespace

TEST_CASE("tokens that overtook earlier ones reach the client in order", "[actors][request]") {
  fixture f(5);
  REQUIRE(f.log_a->submits.size() == 1);
  f.tokens(f.a, 0, {10, 11});
  f.tokens(f.a, 3, {13, 14});  // came the direct way; 2 is still on its way through the controller
  CHECK(f.sink->tokens() == std::vector<std::int32_t>{10, 11});
  f.tokens(f.a, 2, {12});
  CHECK(f.sink->tokens() == std::vector<std::int32_t>{10, 11, 12, 13, 14});
  f.finished(f.a, 5);
  REQUIRE(f.sink->result);
  CHECK(f.sink->result->reason == api::finish_reason::length);
  CHECK(f.sink->result->usage.completion_tokens == 5);
  CHECK(f.log_b->submits.empty());
  for (std::size_t i = 1; i < f.sink->chunks.size(); ++i)  // chunk indices are contiguous
    CHECK(f.sink->chunks[i].first_index == f.sink->chunks[i - 1].first_index + f.sink->chunks[i - 1].tokens.size());
}

TEST_CASE("a finish that overtook its last tokens waits for them", "[actors][request]") {
  fixture f(4);
  f.tokens(f.a, 0, {10, 11});
  f.finished(f.a, 4);
  CHECK_FALSE(f.sink->result);  // two tokens are still on their way
  f.tokens(f.a, 2, {12, 13});
  REQUIRE(f.sink->result);
  CHECK(f.sink->result->reason == api::finish_reason::length);
  CHECK(f.sink->tokens() == std::vector<std::int32_t>{10, 11, 12, 13});
}

TEST_CASE("usage carries the replica's cached prompt tokens, also from a finish that waited", "[actors][request]") {
  fixture f(2);
  f.tokens(f.a, 0, {10});
  f.finished(f.a, 2, 2);  // overtook token 1
  CHECK_FALSE(f.sink->result);
  f.tokens(f.a, 1, {11});
  REQUIRE(f.sink->result);
  CHECK(f.sink->result->usage.prompt_tokens == 3);
  CHECK(f.sink->result->usage.cached_tokens == 2);
}

TEST_CASE("a resumed request reports the finishing replica's cached tokens, at most its prompt",
          "[actors][request]") {
  fixture f(3);
  f.tokens(f.a, 0, {10});
  f.tokens(f.a, 2, {12});  // token 1 was lost: replica a is left
  f.sched.advance_time(600ms);
  f.run();
  REQUIRE(f.log_b->submits.size() == 1);
  f.tokens(f.b, 1, {21, 22});
  f.finished(f.b, 3, 4);  // b found the prompt and the resumed token cached
  REQUIRE(f.sink->result);
  CHECK(f.sink->result->resumes == 1);
  CHECK(f.sink->result->usage.cached_tokens == 3);
}

TEST_CASE("a gap that never fills: the replica is left and the stream resumes elsewhere token-exact",
          "[actors][request]") {
  fixture f(4);
  f.tokens(f.a, 0, {10});
  f.tokens(f.a, 2, {12, 13});  // token 1 was lost on the way
  f.sched.advance_time(400ms);
  f.run();
  CHECK(f.log_b->submits.empty());  // still within reorder_timeout_ms
  f.sched.advance_time(200ms);
  f.run();
  CHECK(f.log_a->cancels == std::vector<std::uint64_t>{7});
  REQUIRE(f.log_b->submits.size() == 1);
  CHECK(f.log_b->submits[0].resume == std::vector<std::int32_t>{10});  // only what arrived in order
  REQUIRE_FALSE(f.outcomes->empty());
  CHECK_FALSE(f.outcomes->front().ok);
  f.tokens(f.a, 1, {11});  // the old replica's late token is not taken
  f.tokens(f.b, 1, {21, 22, 23});
  f.finished(f.b, 4);
  REQUIRE(f.sink->result);
  CHECK(f.sink->result->reason == api::finish_reason::length);
  CHECK(f.sink->tokens() == std::vector<std::int32_t>{10, 21, 22, 23});
  CHECK(f.sink->result->resumes == 1);
}

TEST_CASE("logprobs follow their tokens through reordering and a resume, each exactly once", "[actors][request][logprobs]") {
  fixture f(4, true);
  REQUIRE(f.log_a->submits.size() == 1);
  CHECK(f.log_a->submits[0].logprobs);
  CHECK(f.log_a->submits[0].top_logprobs == 1);
  f.tokens_lp(f.a, 0, {10}, {-1.0f});
  f.tokens_lp(f.a, 2, {12, 13}, {-3.0f, -4.0f});  // token 1 was lost on the way
  f.sched.advance_time(600ms);
  f.run();
  REQUIRE(f.log_b->submits.size() == 1);
  CHECK(f.log_b->submits[0].logprobs);  // the resumed replica computes its own tokens' logprobs
  f.tokens_lp(f.a, 1, {11}, {-2.0f});   // the old replica's late token is not taken, nor its logprob
  f.tokens_lp(f.b, 1, {21, 22, 23}, {-21.0f, -22.0f, -23.0f});
  f.finished(f.b, 4);
  REQUIRE(f.sink->result);
  CHECK(f.sink->result->reason == api::finish_reason::length);
  std::vector<std::int32_t> ids;
  std::vector<float> values;
  for (const auto& c : f.sink->chunks) {
    REQUIRE(c.logprobs.size() == c.tokens.size());  // one per token, chunk by chunk
    for (std::size_t i = 0; i < c.tokens.size(); ++i) {
      CHECK(c.logprobs[i].id == c.tokens[i]);
      REQUIRE(c.logprobs[i].top.size() == 1);
      CHECK(c.logprobs[i].top[0].id == c.tokens[i]);
      ids.push_back(c.logprobs[i].id);
      values.push_back(c.logprobs[i].logprob);
    }
  }
  CHECK(ids == std::vector<std::int32_t>{10, 21, 22, 23});
  CHECK(values == std::vector<float>{-1.0f, -21.0f, -22.0f, -23.0f});
}

TEST_CASE("a replica that sends tokens without the logprobs asked for ends the request with an error",
          "[actors][request][logprobs]") {
  fixture f(4, true);
  f.tokens(f.a, 0, {10});
  REQUIRE(f.sink->result);
  CHECK(f.sink->result->reason == api::finish_reason::error);
  REQUIRE(f.sink->result->err);
  CHECK(f.sink->result->err->code == errc::internal);
}

TEST_CASE("a replica whose model gave no finite logit ends the request with an error naming it, and no resume",
          "[actors][request]") {
  fixture f(8);
  f.tokens(f.a, 0, {10, 11});
  f.finished(f.a, 3, 0, engine::finish_reason::nonfinite_logits);  // overtook its last token: waits for it
  CHECK_FALSE(f.sink->result);
  f.tokens(f.a, 2, {12});
  REQUIRE(f.sink->result);
  CHECK(f.sink->result->reason == api::finish_reason::error);
  REQUIRE(f.sink->result->err);
  CHECK(f.sink->result->err->code == errc::internal);
  CHECK(f.sink->result->err->message.find("no finite logit for generated token 3") != std::string::npos);
  CHECK(f.sink->tokens() == std::vector<std::int32_t>{10, 11, 12});  // what came before is kept
  CHECK(f.sink->result->usage.completion_tokens == 3);
  CHECK(f.log_b->submits.empty());  // the same file would give the same NaNs elsewhere
  REQUIRE(f.outcomes->size() == 1);
  CHECK(f.outcomes->back().ok);  // the replica itself did not fail
}

TEST_CASE("every end-of-generation token of the file stops the request, not just eos", "[actors][request]") {
  // A SentencePiece-style vocabulary with eos, an eot id, and <|im_end|>
  // (end of generation by its text, as llama.cpp decides).
  model::vocab v;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.kinds = {model::token_kind::unknown, model::token_kind::control, model::token_kind::control};
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(fmt::format("<0x{:02X}>", b));
    v.kinds.push_back(model::token_kind::byte);
  }
  v.tokens.push_back("<|im_end|>");
  v.tokens.push_back("<|eot_id|>");
  v.kinds.push_back(model::token_kind::control);
  v.kinds.push_back(model::token_kind::control);
  v.scores.assign(v.tokens.size(), 0.0f);
  v.ids.bos = 1;
  v.ids.eos = 2;
  v.ids.eot = 260;
  auto spec = *model::preset_spec("tiny");
  spec.vocab_size = static_cast<std::uint32_t>(v.tokens.size());
  spec.vocabulary = v;
  const std::string path = std::string(EXA_TEST_TMPDIR) + "/eog_vocab.gguf";
  REQUIRE(model::generate_model(spec, path));

  fixture f(4, false, path);
  REQUIRE(f.log_a->submits.size() == 1);
  auto stops = f.log_a->submits[0].stop_tokens;
  std::sort(stops.begin(), stops.end());
  CHECK(stops == std::vector<std::int32_t>{2, 259, 260});
}
