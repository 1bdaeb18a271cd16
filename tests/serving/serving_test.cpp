// End to end on loopback: the real embedded cluster (actors on real threads,
// CPU engine, tiny model) behind the real HTTP and RPC front doors. A streamed
// greedy completion must equal the engine's own greedy output for the same
// prompt, over HTTP and over RPC, alone and under concurrency.
//
// No sleeps: a request sent before the replicas are ready waits inside the
// cluster (its request actor retries until its deadline), so the tests just
// send and read.

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "actors/embedded_cluster.hpp"
#include "cluster/routing.hpp"
#include "engine/cpu_engine.hpp"
#include "engine/thread_pool.hpp"
#include "frontdoor.hpp"
#include "gpu/cpu_memory_pool.hpp"
#include "http_client.hpp"
#include "model/llama_model.hpp"
#include "model/model_gen.hpp"
#include "model/utf8.hpp"
#include "run_process.hpp"
#include "serve_config.hpp"
#include "serving_fixture.hpp"
#include "../common/poisoned_model.hpp"

using namespace exa;
using json = nlohmann::json;

namespace {

const std::string& model_path() { return test::tiny_model_path(); }

// The engine's own greedy tokens for a prompt, as the server would stream them.
std::vector<std::int32_t> engine_ids(const std::string& prompt, std::uint32_t max_tokens) {
  auto m = model::llama_model::load(model_path());
  REQUIRE(m.has_value());
  auto pool = gpu::cpu_memory_pool::create(engine::cpu_engine::kv_block_bytes((*m)->config(), 16), 64);
  engine::thread_pool threads(1);
  engine::cpu_engine eng(*m, **pool, threads);
  engine::generation_request req;
  req.prompt = *(*m)->tokenizer().encode(prompt, true);
  req.max_tokens = max_tokens;
  req.stop_tokens = {*(*m)->tokenizer().eos()};
  REQUIRE(eng.submit(req));
  std::vector<std::int32_t> ids;
  while (!eng.idle())
    for (const auto& t : eng.step().tokens) ids.push_back(t.token);
  return ids;
}

// The same as text.
std::string engine_text(const std::string& prompt, std::uint32_t max_tokens) {
  auto m = model::llama_model::load(model_path());
  REQUIRE(m.has_value());
  std::string bytes;
  for (auto id : engine_ids(prompt, max_tokens)) bytes += (*m)->tokenizer().decode_token(id);
  return model::sanitize_utf8(bytes);
}

struct server {
  std::unique_ptr<actors::embedded_cluster> cluster;
  std::unique_ptr<frontdoor> door;

  explicit server(const std::string& engine = "cpu", std::uint32_t replicas = 2,
                  const std::string& model_file = model_path()) {
    actors::cluster_options o;
    o.engine = engine;
    o.nodes = 1;
    o.devices_per_node = 2;
    o.device_memory_bytes = 64ull << 20;
    o.default_model_file = model_file;
    o.scheduler_threads = 2;
    api::deploy_request d;
    d.name = "tiny";
    d.replicas = replicas;
    o.deployments.push_back(d);
    auto c = actors::embedded_cluster::start(o);
    REQUIRE(c.has_value());
    cluster = std::move(*c);
    door = test::start_door(*cluster);
  }
  ~server() {
    door->stop();
    cluster->stop();
  }
};

// One server per test: an actor system must be gone before main() returns
// (CAF's own statics are destroyed at exit), so no static instance.

std::string completion_body(const std::string& prompt, std::uint32_t max_tokens, bool stream) {
  return json{{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"stream", stream}}.dump();
}

std::string streamed_text(const test::http_response& r) {
  REQUIRE(r.status == 200);
  const auto events = test::sse_events(r.body);
  REQUIRE_FALSE(events.empty());
  REQUIRE(events.back() == "[DONE]");
  std::string text;
  for (std::size_t i = 0; i + 1 < events.size(); ++i) {
    const auto j = json::parse(events[i]);
    REQUIRE_FALSE(j.contains("error"));
    text += j["choices"][0]["text"].get<std::string>();
  }
  return text;
}

// The request alone, without Catch macros: safe on a client thread (Catch2
// v2's assertions are not thread-safe).
test::http_response stream_request(std::uint16_t port, const std::string& prompt, std::uint32_t max_tokens) {
  return test::http_request(port, "POST", "/v1/completions", completion_body(prompt, max_tokens, true));
}

std::string streamed_text(std::uint16_t port, const std::string& prompt, std::uint32_t max_tokens) {
  return streamed_text(stream_request(port, prompt, max_tokens));
}

}  // namespace

TEST_CASE("a streamed greedy HTTP completion equals the engine's own output", "[serving][http]") {
  server s;
  const std::string expected = engine_text("Hello, ExaServe", 40);
  REQUIRE_FALSE(expected.empty());
  CHECK(streamed_text(s.door->http_port(), "Hello, ExaServe", 40) == expected);

  const auto r = test::http_request(s.door->http_port(), "POST", "/v1/completions",
                                    completion_body("Hello, ExaServe", 40, false));
  REQUIRE(r.status == 200);
  const auto j = json::parse(r.body);
  CHECK(j["choices"][0]["text"].get<std::string>() == expected);
  CHECK(j["usage"]["prompt_tokens"].get<int>() == 16);  // BOS + 15 bytes
}

TEST_CASE("concurrent HTTP streams each get their own exact output", "[serving][http]") {
  server s;
  constexpr int n = 12;
  std::vector<std::string> want(n);
  for (int i = 0; i < n; ++i) want[i] = engine_text("prompt number " + std::to_string(i), 24);
  std::vector<test::http_response> got(n);
  std::vector<std::string> errors(n);
  std::vector<std::thread> clients;
  for (int i = 0; i < n; ++i)
    clients.emplace_back([&, i] {
      try {  // a failure must reach the test, not terminate the process
        got[i] = stream_request(s.door->http_port(), "prompt number " + std::to_string(i), 24);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  for (auto& t : clients) t.join();
  CHECK(errors == std::vector<std::string>(n));
  for (int i = 0; i < n; ++i) CHECK(streamed_text(got[i]) == want[i]);
}

TEST_CASE("one replica under many concurrent clients answers every request", "[serving][http]") {
  // With the zero-cost engine, requests keep arriving while a step is out on
  // the device thread, on real threads. (The deterministic check of the same
  // rule, that nothing touches the engine while a step is out, is the actor
  // test "requests that arrive during a step join the next one...".)
  server s("null", 1);
  constexpr int clients = 16, per_client = 100;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&] {
      for (int i = 0; i < per_client; ++i) {
        try {  // counted as not ok, never a terminate on this thread
          const auto r =
              test::http_request(s.door->http_port(), "POST", "/v1/completions", completion_body("Hi", 2, false));
          if (r.status == 200 && json::parse(r.body)["usage"]["completion_tokens"] == 2) ++ok;
        } catch (const std::exception&) {
        }
      }
    });
  for (auto& t : threads) t.join();
  CHECK(ok == clients * per_client);
}

TEST_CASE("the RPC client streams the same greedy completion", "[serving][rpc]") {
  server s;
  const std::string expected = engine_text("Over RPC", 30);
  const std::string connect = "127.0.0.1:" + std::to_string(s.door->rpc_port());
  const auto r = test::run_process({std::string(EXA_BIN_DIR) + "/exaserve-cli", "--connect", connect, "generate",
                                    "--max-tokens", "30", "Over RPC"},
                                   std::chrono::seconds(60));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out == expected + (expected.empty() ? "" : "\n"));
  // A batch request is the same computation, only ordered later when busy.
  const auto batch = test::run_process({std::string(EXA_BIN_DIR) + "/exaserve-cli", "--connect", connect, "generate",
                                        "--max-tokens", "30", "--priority", "batch", "Over RPC"},
                                       std::chrono::seconds(60));
  REQUIRE(batch.exit_code == 0);
  CHECK(batch.out == r.out);
  const auto bad = test::run_process({std::string(EXA_BIN_DIR) + "/exaserve-cli", "--connect", connect, "generate",
                                      "--priority", "urgent", "Over RPC"},
                                     std::chrono::seconds(60));
  CHECK(bad.exit_code != 0);
  CHECK_THAT(bad.err, Catch::Contains("--priority must be interactive or batch, not 'urgent'"));

  const auto st = test::run_process({std::string(EXA_BIN_DIR) + "/exaserve-cli", "--connect", connect, "status"},
                                    std::chrono::seconds(60));
  REQUIRE(st.exit_code == 0);
  CHECK_THAT(st.out, Catch::Contains("tiny"));
  CHECK_THAT(st.out, Catch::Contains("ready"));
}

TEST_CASE("bad requests to the real cluster get clear errors and it keeps serving", "[serving][http]") {
  server s;
  const auto port = s.door->http_port();
  auto r = test::http_request(port, "POST", "/v1/completions",
                              json{{"model", "nope"}, {"prompt", "x"}, {"max_tokens", 4}}.dump());
  CHECK(r.status == 404);
  CHECK_THAT(r.body, Catch::Contains("unknown model 'nope'"));
  r = test::http_request(port, "POST", "/v1/completions",
                         json{{"model", "tiny"}, {"prompt", std::string(600, 'a')}, {"max_tokens", 4}}.dump());
  CHECK(r.status == 400);
  CHECK_THAT(r.body, Catch::Contains("context length"));
  r = test::http_request(port, "POST", "/v1/completions", "{\"model\": \"tiny\", \"prompt\": ");
  CHECK(r.status == 400);
  // Still serving.
  CHECK(streamed_text(port, "still here", 8) == engine_text("still here", 8));
  r = test::http_request(port, "GET", "/metrics");
  CHECK(r.status == 200);
  CHECK_THAT(r.body, Catch::Contains("exaserve_requests_total{model=\"tiny\",tenant=\"\",outcome=\"completed\"}"));
}

namespace {

// The engine's own greedy ids and logprobs for a prompt, as a replica makes them.
struct engine_logprobs_run {
  std::vector<std::int32_t> ids;
  std::vector<engine::token_logprobs> logprobs;
  std::size_t prompt_tokens = 0;
};

engine_logprobs_run engine_logprobs(const std::string& prompt, std::uint32_t max_tokens, std::uint32_t top_n) {
  auto m = model::llama_model::load(model_path());
  REQUIRE(m.has_value());
  auto pool = gpu::cpu_memory_pool::create(engine::cpu_engine::kv_block_bytes((*m)->config(), 16), 64);
  engine::thread_pool threads(1);
  engine::cpu_engine eng(*m, **pool, threads);
  engine::generation_request req;
  req.prompt = *(*m)->tokenizer().encode(prompt, true);
  req.max_tokens = max_tokens;
  req.stop_tokens = {*(*m)->tokenizer().eos()};
  req.logprobs = true;
  req.top_logprobs = top_n;
  REQUIRE(eng.submit(req));
  engine_logprobs_run out;
  out.prompt_tokens = req.prompt.size();
  while (!eng.idle())
    for (const auto& t : eng.step().tokens) {
      REQUIRE(t.logprobs.has_value());
      out.ids.push_back(t.token);
      out.logprobs.push_back(*t.logprobs);
    }
  return out;
}

json post_json(std::uint16_t port, const std::string& path, const json& body) {
  const auto r = test::http_request(port, "POST", path, body.dump());
  INFO(r.body);
  REQUIRE(r.status == 200);
  return json::parse(r.body);
}

}  // namespace

TEST_CASE("logprobs through the real cluster are the engine's own, streamed and not", "[serving][http][logprobs]") {
  server s;
  const auto port = s.door->http_port();
  const std::string prompt = "Logprobs, please";
  const auto want = engine_logprobs(prompt, 12, 3);
  REQUIRE_FALSE(want.ids.empty());

  const json body = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 12}, {"logprobs", 3}};
  const auto j = post_json(port, "/v1/completions", body);
  const auto& lp = j["choices"][0]["logprobs"];
  REQUIRE(lp["token_logprobs"].size() == want.ids.size());
  for (std::size_t i = 0; i < want.ids.size(); ++i) {
    CHECK(lp["token_logprobs"][i].get<double>() == Approx(want.logprobs[i].logprob).margin(1e-6));
    CHECK(lp["top_logprobs"][i].size() <= 3);
    // Greedy: the chosen token is the most likely one.
    CHECK(want.logprobs[i].top_ids[0] == want.ids[i]);
  }
  CHECK(j["usage"]["prompt_tokens"] == want.prompt_tokens);
  CHECK(j["usage"]["completion_tokens"] == want.ids.size());

  // Streamed: the same values, spread over the chunks, offsets running on.
  json streamed = body;
  streamed["stream"] = true;
  streamed["stream_options"] = {{"include_usage", true}};
  const auto r = test::http_request(port, "POST", "/v1/completions", streamed.dump());
  REQUIRE(r.status == 200);
  std::vector<double> values;
  std::vector<int> offsets;
  json usage;
  for (const auto& e : test::sse_events(r.body)) {
    if (e == "[DONE]") break;
    const auto ev = json::parse(e);
    if (ev.contains("usage") && !ev["usage"].is_null()) usage = ev["usage"];
    if (ev["choices"].empty() || ev["choices"][0]["logprobs"].is_null()) continue;
    for (const auto& v : ev["choices"][0]["logprobs"]["token_logprobs"]) values.push_back(v.get<double>());
    for (const auto& v : ev["choices"][0]["logprobs"]["text_offset"]) offsets.push_back(v.get<int>());
  }
  REQUIRE(values.size() == want.ids.size());
  for (std::size_t i = 0; i < values.size(); ++i) CHECK(values[i] == Approx(want.logprobs[i].logprob).margin(1e-6));
  CHECK(offsets == lp["text_offset"].get<std::vector<int>>());
  CHECK(usage["prompt_tokens"] == want.prompt_tokens);
  CHECK(usage["completion_tokens"] == want.ids.size());

  // Chat: one entry per generated token, with its exact bytes.
  const auto c = post_json(port, "/v1/chat/completions",
                           {{"model", "tiny"},
                            {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                            {"max_tokens", 6},
                            {"logprobs", true},
                            {"top_logprobs", 2}});
  const auto& content = c["choices"][0]["logprobs"]["content"];
  CHECK(content.size() == c["usage"]["completion_tokens"].get<std::size_t>());
  for (const auto& entry : content) {
    REQUIRE(entry["top_logprobs"].size() == 2);
    CHECK(entry["top_logprobs"][0]["bytes"] == entry["bytes"]);  // greedy
    CHECK(entry["top_logprobs"][0]["logprob"] == entry["logprob"]);
    CHECK(entry["logprob"].get<double>() <= 0.0);
  }
}

TEST_CASE("a multi-token stop string ends the text before it, streamed and not", "[serving][http]") {
  server s;
  const auto port = s.door->http_port();
  const std::string prompt = "Stop right there";
  const std::string full = engine_text(prompt, 40);
  // Three ASCII bytes from the middle: three tokens of the byte vocabulary.
  std::string stop;
  for (std::size_t i = 4; i + 3 <= full.size() && stop.empty(); ++i)
    if (std::all_of(full.begin() + i, full.begin() + i + 3, [](char ch) { return ch > 0x20 && ch < 0x7f; }))
      stop = full.substr(i, 3);
  REQUIRE_FALSE(stop.empty());
  const std::string want = full.substr(0, full.find(stop));
  const json body = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 40}, {"stop", stop}};
  const auto j = post_json(port, "/v1/completions", body);
  CHECK(j["choices"][0]["text"] == want);
  CHECK(j["choices"][0]["finish_reason"] == "stop");
  json streamed = body;
  streamed["stream"] = true;
  const auto r = test::http_request(port, "POST", "/v1/completions", streamed.dump());
  std::string text, finish;
  for (const auto& e : test::sse_events(r.body)) {
    if (e == "[DONE]") break;
    const auto ev = json::parse(e);
    text += ev["choices"][0]["text"].get<std::string>();
    if (!ev["choices"][0]["finish_reason"].is_null()) finish = ev["choices"][0]["finish_reason"];
  }
  CHECK(text == want);
  CHECK(finish == "stop");
}

TEST_CASE("an engine without logits refuses logprobs naming it", "[serving][http][logprobs]") {
  server s("null", 1);
  const auto r = test::http_request(s.door->http_port(), "POST", "/v1/completions",
                                    json{{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 2}, {"logprobs", 1}}.dump());
  CHECK(r.status == 400);
  CHECK_THAT(r.body, Catch::Contains("null engine has none"));
}

namespace {

// A counter or gauge's value in /metrics text (the exact series), or -1.
double metric_value(const std::string& text, const std::string& series) {
  const auto at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

}  // namespace

TEST_CASE("a prompt sent again is served from the replica's prefix cache: usage and metrics say so, text unchanged",
          "[serving][http][prefix]") {
  server s("cpu", 1);  // one replica: the second request lands where the first one's KV is
  const auto port = s.door->http_port();
  // Over 256 tokens (a byte each, about): at least one full KV block at any
  // block size a replica picks (at most 256 tokens), within the context.
  std::string prompt;
  while (prompt.size() < 290) prompt += "Every request of this test shares this preamble. ";
  const json body = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 8}};
  const auto cold = post_json(port, "/v1/completions", body);
  const auto prompt_tokens = cold["usage"]["prompt_tokens"].get<std::uint32_t>();
  REQUIRE(prompt_tokens > 256);
  CHECK(cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0);

  const auto warm = post_json(port, "/v1/completions", body);
  const auto cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"].get<std::uint32_t>();
  CHECK(cached > 0);
  CHECK(cached < prompt_tokens);  // at least the last prompt token is computed for its logits
  CHECK(warm["choices"][0]["text"] == cold["choices"][0]["text"]);
  CHECK(warm["choices"][0]["text"] == engine_text(prompt, 8));

  // Streamed, the usage event says the same.
  json streamed = body;
  streamed["stream"] = true;
  streamed["stream_options"] = {{"include_usage", true}};
  const auto r = test::http_request(port, "POST", "/v1/completions", streamed.dump());
  REQUIRE(r.status == 200);
  json usage;
  std::string text;
  for (const auto& e : test::sse_events(r.body)) {
    if (e == "[DONE]") break;
    const auto ev = json::parse(e);
    if (ev.contains("usage")) usage = ev["usage"];
    if (!ev["choices"].empty()) text += ev["choices"][0]["text"].get<std::string>();
  }
  CHECK(text == cold["choices"][0]["text"].get<std::string>());
  CHECK(usage["prompt_tokens_details"]["cached_tokens"] == cached);

  // Chat: the same conversation again reuses its rendered prompt.
  const json chat = {{"model", "tiny"},
                     {"messages", {{{"role", "system"}, {"content", prompt}}, {{"role", "user"}, {"content", "hi"}}}},
                     {"max_tokens", 4}};
  const auto chat_cold = post_json(port, "/v1/chat/completions", chat);
  const auto chat_warm = post_json(port, "/v1/chat/completions", chat);
  CHECK(chat_cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0);  // rendered, it starts otherwise
  CHECK(chat_warm["usage"]["prompt_tokens_details"]["cached_tokens"].get<std::uint32_t>() > 0);
  CHECK(chat_warm["choices"][0]["message"] == chat_cold["choices"][0]["message"]);

  // The replica exported the engine's counters when it went idle after each
  // request, so everything up to the streamed one is counted by now: three
  // prompts looked up, two of them hits.
  const auto m = test::http_request(port, "GET", "/metrics");
  REQUIRE(m.status == 200);
  const double lookup = metric_value(m.body, "exaserve_prefix_cache_lookup_tokens_total{model=\"tiny\"}");
  const double hit = metric_value(m.body, "exaserve_prefix_cache_hit_tokens_total{model=\"tiny\"}");
  INFO(m.body);
  CHECK(lookup >= 3.0 * prompt_tokens);
  CHECK(hit >= 2.0 * cached);
  CHECK(hit < lookup);
  CHECK_THAT(m.body, Catch::Contains("exaserve_prefix_cache_blocks{replica="));
}

namespace {

// A [cluster] boolean key: `initially` by default, the other value when set,
// and a clear error naming the key, its line and the values it takes for
// anything else.
void check_cluster_boolean(const std::string& key, bool initially, bool actors::cluster_options::*field) {
  app::serve_config c = app::default_serve_config();
  CHECK(c.cluster.*field == initially);
  REQUIRE(app::apply_config_text("[cluster]\n" + key + " = " + (initially ? "false" : "true") + "\n", c));
  CHECK(c.cluster.*field == !initially);
  auto r = app::apply_config_text("[cluster]\n" + key + " = maybe\n", c);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::invalid_argument);
  CHECK(r.error().message.find("line 2") != std::string::npos);
  CHECK(r.error().message.find(key) != std::string::npos);
  CHECK(r.error().message.find("true or false") != std::string::npos);
}

}  // namespace

TEST_CASE("serve config: [cluster] consolidate is a boolean, off by default", "[serving][config][consolidation]") {
  check_cluster_boolean("consolidate", false, &actors::cluster_options::consolidate);
}

TEST_CASE("serve config: [cluster] step_stop is a boolean, on by default",
          "[serving][config][fair]") {
  check_cluster_boolean("step_stop", true, &actors::cluster_options::step_stop);
}

TEST_CASE("serve config: a deployment's prefix_slack_tokens, prefix_slack_ratio and prefix_slack_s, range-checked",
          "[serving][config][prefix]") {
  using Catch::Matchers::Contains;
  app::serve_config c = app::default_serve_config();
  c.cluster.deployments.clear();
  REQUIRE(app::apply_config_text("[deployment a]\nrouting = prefix_aware\nprefix_slack_tokens = 512\n"
                                 "prefix_slack_ratio = 0.5\nprefix_slack_s = 0.05\n[deployment b]\nreplicas = 1\n",
                                 c));
  REQUIRE(c.cluster.deployments.size() == 2);
  CHECK(c.cluster.deployments[0].prefix_slack_tokens == 512);
  CHECK(c.cluster.deployments[0].prefix_slack_ratio == 0.5);
  CHECK(c.cluster.deployments[0].prefix_slack_s == 0.05);
  CHECK(c.cluster.deployments[1].prefix_slack_s == cluster::prefix_aware_config{}.load_slack_s);
  CHECK(c.cluster.deployments[1].prefix_slack_tokens == cluster::prefix_aware_config{}.load_slack_tokens);
  CHECK(c.cluster.deployments[1].prefix_slack_ratio == cluster::prefix_aware_config{}.load_slack_ratio);
  for (const auto& [text, words] : std::vector<std::pair<std::string, std::string>>{
           {"prefix_slack_ratio = -1", "line 2: prefix_slack_ratio must be a number in [0, 100], got '-1'"},
           {"prefix_slack_ratio = 101", "in [0, 100], got '101'"},
           {"prefix_slack_ratio = nan", "in [0, 100], got 'nan'"},
           {"prefix_slack_ratio = half", "in [0, 100], got 'half'"},
           {"prefix_slack_tokens = -5", "line 2: prefix_slack_tokens must be an integer, got '-5'"},
           {"prefix_slack_tokens = 4294967297", "must be in [0, 4294967296]"},
           {"prefix_slack_s = -0.1", "line 2: prefix_slack_s must be a number of seconds in [0, 3600], got '-0.1'"},
           {"prefix_slack_s = 4000", "in [0, 3600], got '4000'"},
           {"prefix_slack_s = inf", "got 'inf'"},
           {"prefix_slack_s = 200ms", "got '200ms'"}}) {
    auto r = app::apply_config_text("[deployment a]\n" + text + "\n", c);
    INFO(text);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == errc::invalid_argument);
    CHECK_THAT(r.error().message, Contains(words));
  }
}

TEST_CASE("a model file that overflows: the requests it reaches end with an error naming it, the rest are served",
          "[serving][http]") {
  auto clean = model::llama_model::load(model_path());
  REQUIRE(clean.has_value());
  const auto& tok = (*clean)->tokenizer();
  const std::string good = "The quick brown fox", story = "Once upon a time";
  const auto good_prompt = tok.encode(good, true), story_prompt = tok.encode(story, true);
  REQUIRE(good_prompt.has_value());
  REQUIRE(story_prompt.has_value());
  const auto good_ids = engine_ids(good, 6), story_ids = engine_ids(story, 8);
  // Poison a token the story's completion reaches at k >= 1 and nothing
  // else holds: the good request never meets it.
  const auto absent = [](const std::vector<std::int32_t>& v, std::int32_t t) {
    return std::find(v.begin(), v.end(), t) == v.end();
  };
  std::size_t k = 1;
  while (k < story_ids.size() &&
         !(absent(*good_prompt, story_ids[k]) && absent(good_ids, story_ids[k]) && absent(*story_prompt, story_ids[k]) &&
           absent({story_ids.begin(), story_ids.begin() + static_cast<std::ptrdiff_t>(k)}, story_ids[k])))
    ++k;
  REQUIRE(k < story_ids.size());
  const std::int32_t poison = story_ids[k];
  server s("cpu", 1, test::write_poisoned_copy(model_path(), poison));
  const auto port = s.door->http_port();

  // The token in the prompt, not streamed: a 500 whose message names the problem.
  auto in_prompt = *good_prompt;
  in_prompt.insert(in_prompt.begin() + 2, poison);
  const json body = {{"model", "tiny"}, {"prompt", in_prompt}, {"max_tokens", 6}};
  auto r = test::http_request(port, "POST", "/v1/completions", body.dump());
  INFO(r.body);
  CHECK(r.status == 500);
  CHECK_THAT(r.body, Catch::Contains("no finite logit for generated token 0"));

  // Generated mid-stream: the tokens up to it (itself included) stream, then an error event.
  r = stream_request(port, story, 8);
  REQUIRE(r.status == 200);
  const auto events = test::sse_events(r.body);
  REQUIRE(events.size() >= 2);
  std::string text;
  bool error_seen = false;
  for (const auto& e : events) {
    if (e == "[DONE]") continue;
    const auto j = json::parse(e);
    if (j.contains("error")) {
      error_seen = true;
      CHECK_THAT(j["error"]["message"].get<std::string>(),
                 Catch::Contains("no finite logit for generated token " + std::to_string(k + 1)));
    } else if (!j["choices"].empty()) {
      text += j["choices"][0]["text"].get<std::string>();
    }
  }
  CHECK(error_seen);
  std::string expected;
  for (std::size_t i = 0; i <= k; ++i) expected += tok.decode_token(story_ids[i]);
  CHECK(text == model::sanitize_utf8(expected));

  // The same replica goes on serving what the poison does not reach, exactly.
  CHECK(streamed_text(port, good, 6) == engine_text(good, 6));
  const auto m = test::http_request(port, "GET", "/metrics");
  REQUIRE(m.status == 200);
  INFO(m.body);
  CHECK(metric_value(m.body, "exaserve_engine_nonfinite_logits_total{model=\"tiny\"}") == 2.0);
}
