// The OpenAI-compatible HTTP front door over real loopback sockets, against
// the fake backend.

#include <catch2/catch.hpp>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "error_mapping.hpp"
#include "http_client.hpp"
#include "test_server.hpp"

using namespace exa;
using namespace exa::test;
using json = nlohmann::json;

namespace {

json parse(const http_response& r) {
  INFO("body: " << r.body);
  REQUIRE(json::accept(r.body));
  return json::parse(r.body);
}

http_response post(std::uint16_t port, const std::string& path, const json& body) {
  return http_request(port, "POST", path, body.dump());
}

/// The text of a streamed completion or chat, from its SSE events.
std::string streamed_text(const std::vector<std::string>& events) {
  std::string text;
  for (const auto& e : events) {
    if (e == "[DONE]") break;
    auto j = json::parse(e);
    if (j.contains("error") || j["choices"].empty()) continue;
    const auto& c = j["choices"][0];
    if (c.contains("text")) text += c["text"].get<std::string>();
    if (c.contains("delta") && c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
  }
  return text;
}

/// Asserts the server still answers after whatever the test did to it.
// A keys file's path in an emptied directory of its own.
std::string fresh_keys_path(const std::string& name) {
  const std::string dir = std::string(EXA_TEST_TMPDIR) + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir + "/keys";
}

void require_still_serving(std::uint16_t port) {
  auto r = http_request(port, "GET", "/healthz");
  REQUIRE(r.status == 200);
  REQUIRE(r.body == "ok\n");
}

}  // namespace

TEST_CASE("completion: non-stream response has the OpenAI shape and the fake's text", "[http]") {
  test_server s;
  auto r = post(s.http_port(), "/v1/completions", {{"model", "fake"}, {"prompt", "hello"}, {"max_tokens", 3}});
  REQUIRE(r.status == 200);
  REQUIRE(r.header("content-type") == "application/json");
  auto j = parse(r);
  CHECK(j["id"].get<std::string>().rfind("cmpl-req-", 0) == 0);
  CHECK(j["id"] == "cmpl-" + r.header("x-request-id"));
  CHECK(j["object"] == "text_completion");
  CHECK(j["created"].get<std::int64_t>() > 1600000000);
  CHECK(j["model"] == "fake");
  REQUIRE(j["choices"].size() == 1);
  CHECK(j["choices"][0]["index"] == 0);
  CHECK(j["choices"][0]["text"] == "oll");
  CHECK(j["choices"][0]["finish_reason"] == "length");
  CHECK(j["choices"][0]["logprobs"].is_null());
  CHECK(j["usage"] == json{{"prompt_tokens", 5},
                            {"completion_tokens", 3},
                            {"total_tokens", 8},
                            {"prompt_tokens_details", {{"cached_tokens", 0}}}});

  auto seen = s.backend->requests();
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].model == "fake");
  CHECK(seen[0].prompt_text == std::optional<std::string>("hello"));
  CHECK(seen[0].max_tokens == 3);
  CHECK(seen[0].request_id == r.header("x-request-id"));
}

TEST_CASE("completion: defaults and sampling fields and stop and token-id prompts reach the backend", "[http]") {
  test_server s;
  auto r = post(s.http_port(), "/v1/completions",
                {{"model", "fake"},
                 {"prompt", "abc"},
                 {"temperature", 0.5},
                 {"top_p", 0.9},
                 {"top_k", 40},
                 {"seed", 7},
                 {"ignore_eos", false},
                 {"user", "conversation-9"},
                 {"frobnicate", {1, 2}}});
  REQUIRE(r.status == 200);
  auto j = parse(r);
  CHECK(j["choices"][0]["text"] == "cba");
  CHECK(j["choices"][0]["finish_reason"] == "stop");
  auto req = s.backend->requests().at(0);
  CHECK(req.max_tokens == 16);  // OpenAI's default
  CHECK(req.sampling.temperature == Approx(0.5));
  CHECK(req.sampling.top_p == Approx(0.9));
  CHECK(req.sampling.top_k == 40);
  CHECK(req.sampling.seed == 7);
  CHECK(req.user == "conversation-9");  // keeps a conversation on one version during a rollout

  r = post(s.http_port(), "/v1/completions", {{"model", "fake"}, {"prompt", "hello"}, {"stop", "l"}});
  j = parse(r);
  CHECK(j["choices"][0]["text"] == "o");
  CHECK(j["choices"][0]["finish_reason"] == "stop");
  CHECK(s.backend->requests().at(1).stop == std::vector<std::string>{"l"});

  r = post(s.http_port(), "/v1/completions", {{"model", "fake"}, {"prompt", {1, 2, 3}}, {"max_tokens", 5}});
  j = parse(r);
  CHECK(j["choices"][0]["text"] == "dcb");
  CHECK(j["usage"]["prompt_tokens"] == 3);
  CHECK(s.backend->requests().at(2).prompt_ids == std::optional<std::vector<api::token_id>>({1, 2, 3}));
  {
    http_connection c(s.http_port());
    c.send_request("POST", "/v1/completions", R"({"model":"fake","prompt":"abc"})", "X-Session-Id: chat-42\r\n");
    CHECK(c.read_response().status == 200);
    CHECK(s.backend->requests().back().user == "chat-42");  // the header, when the body names no user
  }
}

TEST_CASE("completion: a stream is SSE with one event per chunk and equals the non-stream text", "[http]") {
  test_server s;
  const json body = {{"model", "fake"}, {"prompt", "stream me"}, {"max_tokens", 6}};
  auto plain = parse(post(s.http_port(), "/v1/completions", body));

  json streaming = body;
  streaming["stream"] = true;
  auto r = post(s.http_port(), "/v1/completions", streaming);
  REQUIRE(r.status == 200);
  CHECK(r.header("content-type") == "text/event-stream");
  CHECK(r.chunked);
  auto events = sse_events(r.body);
  REQUIRE(events.size() == 6 + 2);  // a token per chunk, the finish event, [DONE]
  CHECK(events.back() == "[DONE]");
  const auto id = "cmpl-" + r.header("x-request-id");
  for (std::size_t i = 0; i + 1 < events.size(); ++i) {
    auto e = json::parse(events[i]);
    CHECK(e["id"] == id);
    CHECK(e["object"] == "text_completion");
    CHECK(e["model"] == "fake");
    const bool last = i + 2 == events.size();
    CHECK(e["choices"][0]["finish_reason"] == (last ? json("length") : json(nullptr)));
    CHECK(e["choices"][0]["text"].get<std::string>().size() == (last ? 0u : 1u));
  }
  CHECK(streamed_text(events) == plain["choices"][0]["text"].get<std::string>());
  CHECK(streamed_text(events) == "em mae");

  streaming["stream_options"] = {{"include_usage", true}};
  events = sse_events(post(s.http_port(), "/v1/completions", streaming).body);
  REQUIRE(events.size() == 6 + 3);
  auto usage = json::parse(events[events.size() - 2]);
  CHECK(usage["choices"].empty());
  CHECK(usage["usage"] == json{{"prompt_tokens", 9},
                                {"completion_tokens", 6},
                                {"total_tokens", 15},
                                {"prompt_tokens_details", {{"cached_tokens", 0}}}});
}

TEST_CASE("chat: messages reach the backend as sent and responses have the chat shape", "[http]") {
  test_server s;
  const json body = {{"model", "fake"},
                     {"messages", {{{"role", "system"}, {"content", "be brief"}}, {{"role", "user"}, {"content", "hi"}}}},
                     {"max_completion_tokens", 5}};
  auto r = post(s.http_port(), "/v1/chat/completions", body);
  REQUIRE(r.status == 200);
  auto j = parse(r);
  // The door validates and forwards the conversation; the backend renders it
  // with the model's chat template (the fake joins "role: content\n").
  const api::generate_request sent = s.backend->requests().at(0);  // requests() returns a copy
  CHECK_FALSE(sent.prompt_text);
  CHECK_FALSE(sent.prompt_ids);
  REQUIRE(sent.messages);
  REQUIRE(sent.messages->size() == 2);
  CHECK(((*sent.messages)[0].role == "system" && (*sent.messages)[0].content == "be brief"));
  CHECK(((*sent.messages)[1].role == "user" && (*sent.messages)[1].content == "hi"));
  CHECK(sent.add_generation_prompt);
  json no_cue = body;
  no_cue["add_generation_prompt"] = false;
  REQUIRE(post(s.http_port(), "/v1/chat/completions", no_cue).status == 200);
  CHECK_FALSE(s.backend->requests().at(1).add_generation_prompt);
  CHECK(s.backend->requests().at(0).max_tokens == 5);
  CHECK(j["id"].get<std::string>().rfind("chatcmpl-req-", 0) == 0);
  CHECK(j["object"] == "chat.completion");
  CHECK(j["choices"][0]["message"] == json{{"role", "assistant"}, {"content", "\nih :"}});
  CHECK(j["choices"][0]["finish_reason"] == "length");
  CHECK(j["usage"]["completion_tokens"] == 5);

  json streaming = body;
  streaming["stream"] = true;
  r = post(s.http_port(), "/v1/chat/completions", streaming);
  REQUIRE(r.status == 200);
  auto events = sse_events(r.body);
  REQUIRE(events.size() == 1 + 5 + 2);  // role, 5 tokens, finish, [DONE]
  auto first = json::parse(events[0]);
  CHECK(first["object"] == "chat.completion.chunk");
  CHECK(first["choices"][0]["delta"] == json{{"role", "assistant"}, {"content", ""}});
  auto finish = json::parse(events[events.size() - 2]);
  CHECK(finish["choices"][0]["delta"] == json::object());
  CHECK(finish["choices"][0]["finish_reason"] == "length");
  CHECK(events.back() == "[DONE]");
  CHECK(streamed_text(events) == "\nih :");
}

TEST_CASE("usage says how many prompt tokens came from the prefix cache, streamed and not", "[http]") {
  test_server s;
  s.backend->set_behavior("fake", {.cached_tokens = 4});
  const json completion = {{"model", "fake"}, {"prompt", "cached prompt"}, {"max_tokens", 3}};  // 13 tokens
  const json chat = {{"model", "fake"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 3}};
  const json want = {{"prompt_tokens", 13},
                     {"completion_tokens", 3},
                     {"total_tokens", 16},
                     {"prompt_tokens_details", {{"cached_tokens", 4}}}};
  CHECK(parse(post(s.http_port(), "/v1/completions", completion))["usage"] == want);
  auto j = parse(post(s.http_port(), "/v1/chat/completions", chat));  // "user: hi\n": 9 tokens
  CHECK(j["usage"]["prompt_tokens"] == 9);
  CHECK(j["usage"]["prompt_tokens_details"] == json{{"cached_tokens", 4}});

  // Streamed: only the usage event (with include_usage) carries it.
  for (const auto& [path, body] :
       {std::pair{"/v1/completions", completion}, std::pair{"/v1/chat/completions", chat}}) {
    INFO(path);
    json streaming = body;
    streaming["stream"] = true;
    streaming["stream_options"] = {{"include_usage", true}};
    auto events = sse_events(post(s.http_port(), path, streaming).body);
    REQUIRE(events.size() >= 3);
    CHECK(events.back() == "[DONE]");
    auto usage = json::parse(events[events.size() - 2]);
    CHECK(usage["choices"].empty());
    CHECK(usage["usage"]["prompt_tokens_details"] == json{{"cached_tokens", 4}});
    for (std::size_t i = 0; i + 2 < events.size(); ++i) CHECK_FALSE(json::parse(events[i]).contains("usage"));
  }

  // Never more than the prompt: a 2-token prompt reports 2.
  j = parse(post(s.http_port(), "/v1/completions", {{"model", "fake"}, {"prompt", "ab"}, {"max_tokens", 1}}));
  CHECK(j["usage"]["prompt_tokens_details"]["cached_tokens"] == 2);
}

TEST_CASE("models and health and readiness and metrics endpoints", "[http]") {
  test_server s;
  auto r = http_request(s.http_port(), "GET", "/v1/models");
  REQUIRE(r.status == 200);
  auto j = parse(r);
  CHECK(j["object"] == "list");
  REQUIRE(j["data"].size() == 1);
  CHECK(j["data"][0]["id"] == "fake");
  CHECK(j["data"][0]["object"] == "model");
  CHECK(j["data"][0]["owned_by"] == "exaserve");

  CHECK(parse(http_request(s.http_port(), "GET", "/v1/models/fake"))["id"] == "fake");
  r = http_request(s.http_port(), "GET", "/v1/models/nope");
  CHECK(r.status == 404);
  CHECK(parse(r)["error"]["type"] == "not_found_error");

  r = http_request(s.http_port(), "GET", "/healthz");
  CHECK(r.status == 200);
  CHECK(r.body == "ok\n");

  CHECK(http_request(s.http_port(), "GET", "/readyz").status == 200);
  s.backend->set_ready(false);
  r = http_request(s.http_port(), "GET", "/readyz");
  CHECK(r.status == 503);
  CHECK(r.body == "not ready\n");
  s.backend->set_ready(true);
  CHECK(http_request(s.http_port(), "GET", "/readyz").status == 200);

  post(s.http_port(), "/v1/completions", {{"model", "fake"}, {"prompt", "x"}});
  r = http_request(s.http_port(), "GET", "/metrics?format=text");
  REQUIRE(r.status == 200);
  CHECK(r.header("content-type").rfind("text/plain; version=0.0.4", 0) == 0);
  CHECK(r.body.find("fake_requests_total 1\n") != std::string::npos);
  CHECK(r.body.find("exaserve_frontdoor_http_responses_total{code=\"200\"}") != std::string::npos);
  CHECK(r.body.find("exaserve_frontdoor_connections{protocol=\"http\"} ") != std::string::npos);
}

namespace {
struct bad_case {
  const char* name;
  const char* path;
  std::string body;
  int status;
  const char* type;
  const char* message;  // a substring
  const char* param;    // "" for null
};
}  // namespace

TEST_CASE("bad input gets OpenAI-style errors naming the problem and the server keeps serving", "[http]") {
  test_server s;
  const std::vector<bad_case> cases = {
      {"malformed JSON", "/v1/completions", R"({"model": "fake", "prompt": })", 400, "invalid_request_error",
       "not valid JSON: parse error at line 1, column", ""},
      {"body not an object", "/v1/completions", "[1,2]", 400, "invalid_request_error", "must be a JSON object", ""},
      {"missing model", "/v1/completions", R"({"prompt":"x"})", 400, "invalid_request_error", "'model' is required",
       "model"},
      {"missing prompt", "/v1/completions", R"({"model":"fake"})", 400, "invalid_request_error",
       "'prompt' is required", "prompt"},
      {"prompt of wrong type", "/v1/completions", R"({"model":"fake","prompt":5})", 400, "invalid_request_error",
       "'prompt' must be a string or an array of token ids", "prompt"},
      {"batched string prompts", "/v1/completions", R"({"model":"fake","prompt":["a","b"]})", 400,
       "invalid_request_error", "batched prompts are not supported", "prompt"},
      {"batched token prompts", "/v1/completions", R"({"model":"fake","prompt":[[1],[2]]})", 400,
       "invalid_request_error", "batched prompts are not supported", "prompt"},
      {"empty token prompt", "/v1/completions", R"({"model":"fake","prompt":[]})", 400, "invalid_request_error",
       "'prompt' must not be empty", "prompt"},
      {"negative token id", "/v1/completions", R"({"model":"fake","prompt":[1,-2]})", 400, "invalid_request_error",
       "token ids must be integers", "prompt"},
      {"max_tokens as string", "/v1/completions", R"({"model":"fake","prompt":"x","max_tokens":"10"})", 400,
       "invalid_request_error", "'max_tokens' must be an integer", "max_tokens"},
      {"max_tokens fractional", "/v1/completions", R"({"model":"fake","prompt":"x","max_tokens":1.5})", 400,
       "invalid_request_error", "'max_tokens' must be an integer", "max_tokens"},
      {"max_tokens negative", "/v1/completions", R"({"model":"fake","prompt":"x","max_tokens":-1})", 400,
       "invalid_request_error", "'max_tokens' must be between 1 and 16384 (got -1)", "max_tokens"},
      {"max_tokens too big", "/v1/completions", R"({"model":"fake","prompt":"x","max_tokens":100000})", 400,
       "invalid_request_error", "'max_tokens' must be between 1 and 16384 (got 100000)", "max_tokens"},
      {"temperature type", "/v1/completions", R"({"model":"fake","prompt":"x","temperature":"hot"})", 400,
       "invalid_request_error", "'temperature' must be a number", "temperature"},
      {"temperature range", "/v1/completions", R"({"model":"fake","prompt":"x","temperature":5})", 400,
       "invalid_request_error", "'temperature' must be between 0 and 2", "temperature"},
      {"top_p zero", "/v1/completions", R"({"model":"fake","prompt":"x","top_p":0})", 400, "invalid_request_error",
       "'top_p' must be greater than 0", "top_p"},
      {"stream type", "/v1/completions", R"({"model":"fake","prompt":"x","stream":"yes"})", 400,
       "invalid_request_error", "'stream' must be a boolean", "stream"},
      {"stop type", "/v1/completions", R"({"model":"fake","prompt":"x","stop":42})", 400, "invalid_request_error",
       "'stop' must be a string or an array of strings", "stop"},
      {"too many stops", "/v1/completions", R"({"model":"fake","prompt":"x","stop":["a","b","c","d","e"]})", 400,
       "invalid_request_error", "'stop' has 5 sequences; at most 4 are allowed", "stop"},
      {"n above 1", "/v1/completions", R"({"model":"fake","prompt":"x","n":2})", 400, "invalid_request_error",
       "only n=1 is supported", "n"},
      {"priority unknown", "/v1/completions", R"({"model":"fake","prompt":"x","priority":"urgent"})", 400,
       "invalid_request_error", "'priority' must be \"interactive\" or \"batch\"", "priority"},
      {"priority type", "/v1/completions", R"({"model":"fake","prompt":"x","priority":1})", 400,
       "invalid_request_error", "'priority' must be \"interactive\" or \"batch\"", "priority"},
      {"user type", "/v1/completions", R"({"model":"fake","prompt":"x","user":7})", 400, "invalid_request_error",
       "'user' must be a string of at most 256 characters", "user"},
      {"chat without messages", "/v1/chat/completions", R"({"model":"fake"})", 400, "invalid_request_error",
       "'messages' is required", "messages"},
      {"chat bad role", "/v1/chat/completions", R"({"model":"fake","messages":[{"role":"robot","content":"x"}]})", 400,
       "invalid_request_error", "'messages[0].role' must be one of system, user, assistant, tool", "messages[0].role"},
      {"chat bad content", "/v1/chat/completions", R"({"model":"fake","messages":[{"role":"user","content":5}]})",
       400, "invalid_request_error", "'messages[0].content' must be a string", "messages[0].content"},
      {"chat add_generation_prompt type", "/v1/chat/completions",
       R"({"model":"fake","messages":[{"role":"user","content":"x"}],"add_generation_prompt":1})", 400,
       "invalid_request_error", "'add_generation_prompt' must be a boolean", "add_generation_prompt"},
      {"chat max_completion_tokens type", "/v1/chat/completions",
       R"({"model":"fake","messages":[{"role":"user","content":"x"}],"max_completion_tokens":"9"})", 400,
       "invalid_request_error", "'max_completion_tokens' must be an integer", "max_completion_tokens"},
      {"unknown model", "/v1/completions", R"({"model":"nope","prompt":"x"})", 404, "not_found_error",
       "model 'nope' is not deployed", ""},
  };
  for (const auto& c : cases) {
    SECTION(c.name) {
      auto r = http_request(s.http_port(), "POST", c.path, c.body);
      INFO(c.name << ": " << r.body);
      CHECK(r.status == c.status);
      auto j = parse(r);
      CHECK(j["error"]["type"] == c.type);
      CHECK(j["error"]["message"].get<std::string>().find(c.message) != std::string::npos);
      CHECK(j["error"]["param"] == (*c.param ? json(c.param) : json(nullptr)));
      CHECK(j["error"]["code"].is_string());
      require_still_serving(s.http_port());
    }
  }
}

TEST_CASE("backend refusals map to statuses and overloaded carries Retry-After", "[http]") {
  test_server s;
  s.backend->set_behavior("busy", {.refuse = error{errc::overloaded, "all replicas are at capacity"}});
  s.backend->set_behavior("down", {.refuse = error{errc::unavailable, "no ready replica"}});
  s.backend->set_behavior("slow", {.refuse = error{errc::deadline_exceeded, "deadline passed"}});

  for (bool stream : {false, true}) {
    auto r = post(s.http_port(), "/v1/completions", {{"model", "busy"}, {"prompt", "x"}, {"stream", stream}});
    CHECK(r.status == 429);
    CHECK(r.header("retry-after") == "1");
    auto j = parse(r);
    CHECK(j["error"]["type"] == "overloaded_error");
    CHECK(j["error"]["code"] == "overloaded");
    CHECK(j["error"]["message"] == "all replicas are at capacity");
  }
  auto r = post(s.http_port(), "/v1/completions", {{"model", "down"}, {"prompt", "x"}});
  CHECK(r.status == 503);
  CHECK(parse(r)["error"]["message"] == "no ready replica");
  CHECK(post(s.http_port(), "/v1/completions", {{"model", "slow"}, {"prompt", "x"}}).status == 504);
  // A refused stream gets a real status, not a 200 stream carrying an error.
  r = post(s.http_port(), "/v1/chat/completions",
           {{"model", "nope"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}, {"stream", true}});
  CHECK(r.status == 404);
  require_still_serving(s.http_port());
}

TEST_CASE("a failure after the stream started ends it with an error event then DONE", "[http]") {
  test_server s;
  s.backend->set_behavior("flaky", {.fail_after = 2});
  auto r = post(s.http_port(), "/v1/completions", {{"model", "flaky"}, {"prompt", "abcdef"}, {"stream", true}});
  REQUIRE(r.status == 200);
  auto events = sse_events(r.body);
  REQUIRE(events.size() == 2 + 2);
  CHECK(streamed_text(events) == "fe");
  auto err = json::parse(events[2]);
  CHECK(err["error"]["type"] == "server_error");
  CHECK(err["error"]["code"] == "internal");
  CHECK(err["error"]["message"] == "replica fake/0 crashed mid-stream");
  CHECK(events[3] == "[DONE]");

  // Without streaming the partial text is dropped and the error is the answer.
  r = post(s.http_port(), "/v1/completions", {{"model", "flaky"}, {"prompt", "abcdef"}});
  CHECK(r.status == 500);
  CHECK(parse(r)["error"]["code"] == "internal");
}

TEST_CASE("method and path and body-size errors", "[http]") {
  frontdoor_config config = test_config();
  config.max_body_bytes = 4096;
  test_server s(config);

  auto r = http_request(s.http_port(), "GET", "/v1/completions");
  CHECK(r.status == 405);
  CHECK(r.header("allow") == "POST");
  CHECK(parse(r)["error"]["message"] == "method GET is not allowed on /v1/completions; use POST");
  r = http_request(s.http_port(), "DELETE", "/healthz");
  CHECK(r.status == 405);
  CHECK(r.header("allow") == "GET, HEAD");

  r = http_request(s.http_port(), "GET", "/v2/everything");
  CHECK(r.status == 404);
  CHECK(parse(r)["error"]["message"] == "no such endpoint: GET /v2/everything");

  // Declared too large: refused before the body is read.
  const std::string big = R"({"model":"fake","prompt":")" + std::string(5000, 'a') + R"("})";
  r = http_request(s.http_port(), "POST", "/v1/completions", big);
  CHECK(r.status == 413);
  CHECK(parse(r)["error"]["message"] == "request body is larger than 4096 bytes");
  // Chunked, so only reading finds out.
  {
    http_connection c(s.http_port());
    c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    for (int i = 0; i < 3; ++i) c.send("800\r\n" + std::string(0x800, 'a') + "\r\n");
    c.send("0\r\n\r\n");
    CHECK(c.read_response().status == 413);
  }
  require_still_serving(s.http_port());
  CHECK(s.backend->requests().empty());
}

TEST_CASE("malformed HTTP is answered with a 4xx naming the problem, never a 5xx", "[http]") {
  frontdoor_config config = test_config();
  config.body_timeout_ms = 1000;  // a chunk that never comes ends in a 408
  test_server s(config);
  struct bad {
    const char* what;
    std::string bytes;
    int status = 400;
  };
  const std::string body = json{{"model", "fake"}, {"prompt", "ab"}}.dump();
  const std::vector<bad> requests = {
      {"a garbage request line", "GARBAGE\r\n\r\n"},
      {"an unknown method", "FROB /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n"},
      {"no HTTP version", "GET /healthz\r\nHost: x\r\n\r\n"},
      {"a header line without a colon", "GET /healthz HTTP/1.1\r\nHost x\r\n\r\n"},
      {"a chunk size that is not hex",
       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n" + body + "\r\n0\r\n\r\n"},
      {"a chunk size out of range",
       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\nab\r\n",
       408},  // KJ waits for the chunk; the body timeout ends it
      {"an unknown transfer encoding",
       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n" + body},
      {"a Content-Length that is not a number",
       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ten\r\n\r\n" + body},
  };
  for (const auto& b : requests) {
    INFO(b.what);
    http_connection c(s.http_port());
    c.send(b.bytes);
    const auto r = c.read_response();
    CHECK(r.status == b.status);
    const auto j = json::parse(r.body, nullptr, false);
    REQUIRE_FALSE(j.is_discarded());
    if (b.status == 400) CHECK(j["error"]["type"] == "invalid_request_error");
    CHECK_FALSE(j["error"]["message"].get<std::string>().empty());
  }
  require_still_serving(s.http_port());
  CHECK(s.backend->requests().empty());  // none of them reached the backend
}

TEST_CASE("KJ's messages about a client's framing are told apart from server failures", "[http]") {
  using exa::door::client_framing_error;
  CHECK(client_framing_error("invalid Content-Length header value; *cl = ten") == "invalid Content-Length header value");
  CHECK(client_framing_error("kj/compat/http.c++:1017: failed: invalid HTTP chunk size; text = zz") ==
        "invalid HTTP chunk size");
  CHECK(client_framing_error("unknown transfer encoding") == "unknown transfer encoding");
  CHECK(client_framing_error("null pointer dereference").empty());
  CHECK(client_framing_error("").empty());
}

TEST_CASE("keep-alive and pipelined requests on one connection are answered in order", "[http]") {
  test_server s;
  http_connection c(s.http_port());
  const std::string a = json{{"model", "fake"}, {"prompt", "ab"}}.dump();
  const std::string b = json{{"model", "fake"}, {"prompt", "xyz"}}.dump();
  c.send_request("POST", "/v1/completions", a);
  CHECK(parse(c.read_response())["choices"][0]["text"] == "ba");
  // Both requests in one write: the second arrives while the first is served.
  std::string both = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(a.size()) +
                     "\r\n\r\n" + a + "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                     std::to_string(b.size()) + "\r\n\r\n" + b;
  c.send(both);
  CHECK(parse(c.read_response())["choices"][0]["text"] == "ba");
  CHECK(parse(c.read_response())["choices"][0]["text"] == "zyx");
  c.send_request("GET", "/healthz");
  CHECK(c.read_response().body == "ok\n");
}

TEST_CASE("a client that disconnects mid-stream gets its request cancelled on the backend", "[http]") {
  test_server s;
  s.backend->set_behavior("hang", {.hang_after = 2});
  http_connection c(s.http_port());
  c.send_request("POST", "/v1/completions", json{{"model", "hang"}, {"prompt", "abcdef"}, {"stream", true}}.dump());
  // Two tokens arrive, then the backend stalls; the client leaves.
  const std::string seen = c.read_until("\"text\":\"e\"");
  CHECK(seen.find("\"text\":\"f\"") != std::string::npos);
  const auto requests = s.backend->requests();
  REQUIRE(requests.size() == 1);
  const std::string id = requests[0].request_id;
  CHECK(seen.find("X-Request-Id: " + id) != std::string::npos);
  c.close();
  CHECK(s.backend->wait_for_cancel(id, 20s));
  CHECK(s.backend->wait_idle(20s));
  require_still_serving(s.http_port());
}

TEST_CASE("a client that disconnects while waiting for a non-stream answer gets it cancelled", "[http]") {
  test_server s;
  s.backend->set_behavior("hang", {.hang_after = 0});
  http_connection c(s.http_port());
  c.send_request("POST", "/v1/chat/completions",
                 json{{"model", "hang"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}}.dump());
  REQUIRE(s.backend->wait_for_requests(1, 20s));
  const std::string id = s.backend->requests().at(0).request_id;
  c.close();
  CHECK(s.backend->wait_for_cancel(id, 20s));
  CHECK(s.backend->wait_idle(20s));
}

TEST_CASE("stopping the front door cancels in-flight requests and stop() twice is fine", "[http]") {
  test_server s;
  s.backend->set_behavior("hang", {.hang_after = 1});
  http_connection c(s.http_port());
  c.send_request("POST", "/v1/completions", json{{"model", "hang"}, {"prompt", "abc"}, {"stream", true}}.dump());
  c.read_until("\"text\":\"c\"");
  const std::string id = s.backend->requests().at(0).request_id;
  s.door->stop();
  CHECK(s.backend->wait_for_cancel(id, 20s));
  CHECK(c.wait_closed());
  s.door->stop();
}

TEST_CASE("64 concurrent clients all complete with their own answers", "[http]") {
  test_server s;
  s.backend->set_behavior("paced", {.token_delay = 2ms});
  constexpr int clients = 64;
  std::vector<std::string> texts(clients), expected(clients);
  std::vector<int> statuses(clients, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    const std::string prompt = "client-" + std::to_string(i);
    expected[i] = std::string(prompt.rbegin(), prompt.rend()).substr(0, 6);
    threads.emplace_back([&, i, prompt] {
      const bool stream = i % 2 == 0;
      auto r = http_request(s.http_port(), "POST", "/v1/completions",
                            json{{"model", "paced"}, {"prompt", prompt}, {"max_tokens", 6}, {"stream", stream}}.dump());
      statuses[i] = r.status;
      texts[i] = stream ? streamed_text(sse_events(r.body)) : json::parse(r.body)["choices"][0]["text"].get<std::string>();
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < clients; ++i) {
    INFO("client " << i);
    CHECK(statuses[i] == 200);
    CHECK(texts[i] == expected[i]);
  }
  CHECK(s.backend->requests().size() == clients);
}

TEST_CASE("callbacks made on the loop thread itself (inside generate) work too", "[http]") {
  test_server s;
  s.backend->set_behavior("inline", {.synchronous = true});
  auto r = post(s.http_port(), "/v1/completions", {{"model", "inline"}, {"prompt", "sync"}, {"stream", true}});
  CHECK(streamed_text(sse_events(r.body)) == "cnys");
  r = post(s.http_port(), "/v1/completions", {{"model", "inline"}, {"prompt", "sync"}});
  CHECK(parse(r)["choices"][0]["text"] == "cnys");
}

TEST_CASE("slow clients: header timeout and the connection limit", "[http]") {
  frontdoor_config config = test_config();
  config.header_timeout_ms = 300;
  config.body_timeout_ms = 300;
  config.max_connections = 2;
  test_server s(config);

  SECTION("a client that never finishes its headers is disconnected") {
    http_connection c(s.http_port());
    c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\n");
    CHECK(c.wait_closed());
  }
  SECTION("a client that never finishes its body gets 408") {
    http_connection c(s.http_port());
    c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"model\":");
    auto r = c.read_response();
    CHECK(r.status == 408);
    CHECK(parse(r)["error"]["message"] == "request body not received within 300 ms");
    CHECK(s.backend->requests().empty());
  }
  SECTION("connections beyond the limit get 429; the others keep working") {
    http_connection a(s.http_port());
    http_connection b(s.http_port());
    a.send_request("GET", "/healthz");
    CHECK(a.read_response().status == 200);  // both accepted before the third arrives
    http_connection c(s.http_port());
    auto r = c.read_response();
    CHECK(r.status == 429);
    CHECK(r.header("retry-after") == "1");
    CHECK(parse(r)["error"]["type"] == "overloaded_error");
    CHECK(c.wait_closed());
    b.send_request("GET", "/healthz");
    CHECK(b.read_response().status == 200);
  }
}

TEST_CASE("a port in use is reported as unavailable naming host and port", "[http]") {
  test_server s;
  frontdoor_config config = test_config();
  config.http_port = s.http_port();
  auto second = frontdoor::start(config, s.backend);
  REQUIRE_FALSE(second.has_value());
  CHECK(second.error().code == errc::unavailable);
  CHECK(second.error().message.find("127.0.0.1:" + std::to_string(s.http_port())) != std::string::npos);
  require_still_serving(s.http_port());
}

TEST_CASE("a request KJ cannot parse gets a JSON error and the connection is closed", "[http]") {
  test_server s;
  http_connection c(s.http_port());
  c.send("this is not http\r\n\r\n");
  auto r = c.read_response();
  CHECK(r.status >= 400);
  CHECK(r.status < 600);
  CHECK(r.header("content-type") == "application/json");
  CHECK(parse(r)["error"]["type"] == "invalid_request_error");
  CHECK(c.wait_closed());
  require_still_serving(s.http_port());
}

TEST_CASE("with a keys file the /v1 endpoints need a valid Bearer key, and a reload revokes", "[http][auth]") {
  const std::string path = fresh_keys_path("http-auth");
  exa::auth::key_set keys;
  const std::string acme = *keys.add("acme", false, 1), beta = *keys.add("beta", false, 2);
  REQUIRE(exa::auth::save_keys(path, keys));
  frontdoor_config config = test_config();
  auto store = exa::auth::key_store::open(path);
  REQUIRE(store);
  config.keys = *store;
  test_server s(config);
  const std::string body = json{{"model", "fake"}, {"prompt", "ab"}}.dump();
  const auto call = [&](std::string_view extra) {
    return http_request(s.http_port(), "POST", "/v1/completions", body, extra);
  };

  struct refused {
    const char* what;
    std::string header;
    const char* says;
  };
  for (const auto& r : std::vector<refused>{
           {"no key", "", "no API key"},
           {"another scheme", "Authorization: Basic " + acme + "\r\n", "must be 'Bearer <key>'"},
           {"an unknown key", "Authorization: Bearer exa-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\r\n", "not valid"},
           {"a key cut short", "Authorization: Bearer " + acme.substr(0, acme.size() - 1) + "\r\n", "not valid"},
       }) {
    INFO(r.what);
    auto resp = call(r.header);
    CHECK(resp.status == 401);
    CHECK(resp.header("www-authenticate") == "Bearer");
    const auto j = parse(resp);
    CHECK(j["error"]["type"] == "invalid_request_error");
    CHECK(j["error"]["code"] == "invalid_api_key");
    CHECK_THAT(j["error"]["message"].get<std::string>(), Catch::Matchers::Contains(r.says));
  }
  CHECK(s.backend->requests().empty());  // nothing refused reached the backend
  CHECK(http_request(s.http_port(), "GET", "/v1/models").status == 401);

  auto ok = call("Authorization: Bearer " + acme + "\r\n");
  CHECK(ok.status == 200);
  CHECK(parse(ok)["choices"][0]["text"] == "ba");
  CHECK(call("authorization: bearer  " + beta + " \r\n").status == 200);  // scheme case and spaces as RFC 7235 allows
  CHECK(http_request(s.http_port(), "GET", "/v1/models", {}, "Authorization: Bearer " + beta + "\r\n").status == 200);
  // Probes stay open.
  CHECK(http_request(s.http_port(), "GET", "/healthz").status == 200);
  CHECK(http_request(s.http_port(), "GET", "/metrics").status == 200);

  // Revoked in the file: refused once the store re-reads it (SIGHUP does this).
  REQUIRE(keys.revoke(keys.find(acme)->id));
  REQUIRE(exa::auth::save_keys(path, keys));
  CHECK(call("Authorization: Bearer " + acme + "\r\n").status == 200);  // not re-read yet
  REQUIRE((*store)->reload());
  CHECK(call("Authorization: Bearer " + acme + "\r\n").status == 401);
  CHECK(call("Authorization: Bearer " + beta + "\r\n").status == 200);
}

TEST_CASE("a tenant over its limits gets a 429 naming the limit, with Retry-After", "[http][auth]") {
  const std::string path = fresh_keys_path("http-limits");
  exa::auth::key_set keys;
  const std::string acme = *keys.add("acme", false, 1), beta = *keys.add("beta", false, 2);
  REQUIRE(keys.set_limits("acme", {1, 0, 0, 8}));  // 1 request a second, 8 tokens a request
  REQUIRE(keys.set_limits("beta", {0, 0, 1, 0}));  // one request in flight
  REQUIRE(exa::auth::save_keys(path, keys));
  frontdoor_config config = test_config();
  config.keys = *exa::auth::key_store::open(path);
  test_server s(config);
  const auto as = [&](const std::string& key, const json& body) {
    return http_request(s.http_port(), "POST", "/v1/completions", body.dump(), "Authorization: Bearer " + key + "\r\n");
  };
  const json small{{"model", "fake"}, {"prompt", "ab"}, {"max_tokens", 4}};

  CHECK(as(acme, small).status == 200);
  auto over = as(acme, small);  // the same second
  CHECK(over.status == 429);
  CHECK(over.header("retry-after") == "1");
  CHECK_THAT(parse(over)["error"]["message"].get<std::string>(), Catch::Matchers::Contains("1 requests per second"));
  auto big = as(acme, json{{"model", "fake"}, {"prompt", "ab"}, {"max_tokens", 16}});
  CHECK(big.status == 400);
  CHECK(parse(big)["error"]["param"] == "max_tokens");
  CHECK_THAT(parse(big)["error"]["message"].get<std::string>(), Catch::Matchers::Contains("limit of 8 tokens"));

  // beta: one stream holds its only slot until it ends.
  s.backend->set_behavior("hang", {.hang_after = 1});
  {
    http_connection c(s.http_port());
    c.send_request("POST", "/v1/completions", json{{"model", "hang"}, {"prompt", "abcdef"}, {"stream", true}}.dump(),
                   "Authorization: Bearer " + beta + "\r\n");
    (void)c.read_until("\"text\"");
    auto second = as(beta, small);
    CHECK(second.status == 429);
    CHECK_THAT(parse(second)["error"]["message"].get<std::string>(), Catch::Matchers::Contains("max_concurrent"));
    CHECK_THAT(http_request(s.http_port(), "GET", "/metrics").body,
               Catch::Matchers::Contains("exaserve_frontdoor_tenant_refusals_total 3"));
    c.close();
  }
  const auto ids = s.backend->requests();
  REQUIRE_FALSE(ids.empty());
  CHECK(s.backend->wait_for_cancel(ids.back().request_id, 20s));
  // The slot is free again once the stream is gone.
  bool admitted = false;
  for (int i = 0; i < 100 && !admitted; ++i) {
    admitted = as(beta, small).status == 200;
    if (!admitted) std::this_thread::sleep_for(20ms);
  }
  CHECK(admitted);
}
