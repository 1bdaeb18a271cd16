// The OpenAI fields real models bring to the front door: logprobs and
// top_logprobs (parsing and validation, the two OpenAI shapes -- legacy
// completions, chat -- streamed and not, rendered from what the backend
// reports: the fake backend's documented numbers), and what /v1/models says
// of each deployment's file.

#include <catch2/catch.hpp>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "http_client.hpp"
#include "openai.hpp"
#include "test_server.hpp"

using namespace exa;
using namespace exa::test;
using json = nlohmann::json;

namespace {

api::request_limits limits() { return {}; }

// The request's parse error's field, or "" when it parsed.
std::string error_param(door::api_kind kind, const json& body) {
  auto r = door::parse_openai_request(kind, body.dump(), limits());
  return r ? std::string() : r.error().param;
}

json completion_body(json extra) {
  json b = {{"model", "fake"}, {"prompt", "hello"}, {"max_tokens", 3}};
  b.update(extra);
  return b;
}

json chat_body(json extra) {
  json b = {{"model", "fake"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 3}};
  b.update(extra);
  return b;
}

// The data events of an SSE body (not [DONE]), parsed.
std::vector<json> data_events(const std::string& body) {
  std::vector<json> out;
  for (const auto& e : sse_events(body))
    if (e != "[DONE]") out.push_back(json::parse(e));
  return out;
}

}  // namespace

TEST_CASE("logprobs fields are parsed per endpoint and errors name the field", "[logprobs]") {
  using door::api_kind;
  auto c = door::parse_openai_request(api_kind::completion, completion_body({{"logprobs", 5}}).dump(), limits());
  REQUIRE(c);
  CHECK(c->gen.logprobs);
  CHECK(c->gen.top_logprobs == 5);
  auto zero = door::parse_openai_request(api_kind::completion, completion_body({{"logprobs", 0}}).dump(), limits());
  REQUIRE(zero);
  CHECK(zero->gen.logprobs);  // 0: the chosen tokens' logprobs, no alternatives
  CHECK(zero->gen.top_logprobs == 0);
  auto none = door::parse_openai_request(api_kind::completion, completion_body({{"logprobs", nullptr}}).dump(), limits());
  REQUIRE(none);
  CHECK_FALSE(none->gen.logprobs);
  CHECK(error_param(api_kind::completion, completion_body({{"logprobs", 21}})) == "logprobs");
  CHECK(error_param(api_kind::completion, completion_body({{"logprobs", -1}})) == "logprobs");
  CHECK(error_param(api_kind::completion, completion_body({{"logprobs", true}})) == "logprobs");
  CHECK(error_param(api_kind::completion, completion_body({{"logprobs", 2.5}})) == "logprobs");

  auto chat = door::parse_openai_request(api_kind::chat, chat_body({{"logprobs", true}, {"top_logprobs", 20}}).dump(),
                                         limits());
  REQUIRE(chat);
  CHECK(chat->gen.logprobs);
  CHECK(chat->gen.top_logprobs == 20);
  auto off = door::parse_openai_request(api_kind::chat, chat_body({{"logprobs", false}}).dump(), limits());
  REQUIRE(off);
  CHECK_FALSE(off->gen.logprobs);
  CHECK(error_param(api_kind::chat, chat_body({{"logprobs", 3}})) == "logprobs");
  CHECK(error_param(api_kind::chat, chat_body({{"top_logprobs", 3}})) == "top_logprobs");
  CHECK(error_param(api_kind::chat, chat_body({{"logprobs", false}, {"top_logprobs", 3}})) == "top_logprobs");
  CHECK(error_param(api_kind::chat, chat_body({{"logprobs", true}, {"top_logprobs", 21}})) == "top_logprobs");
  CHECK(error_param(api_kind::chat, chat_body({{"top_logprobs", 0}})).empty());  // asks for nothing: fine
  CHECK(error_param(api_kind::chat, chat_body({{"logprobs", true}, {"top_logprobs", "3"}})) == "top_logprobs");
  auto msg = door::parse_openai_request(api_kind::chat, chat_body({{"top_logprobs", 3}}).dump(), limits());
  REQUIRE_FALSE(msg);
  CHECK(msg.error().err.message == "'top_logprobs' requires 'logprobs': true");
}

TEST_CASE("logprobs render in OpenAI's shapes: bytes, -9999 for -inf, text_offset in characters", "[logprobs]") {
  // "é" is two bytes and one character; "\xE2" is a token holding the first
  // byte of a three-byte character (its text is not UTF-8 on its own).
  const std::vector<api::token_logprob> lps = {
      {10, "\xC3\xA9", -0.5f, {{10, "\xC3\xA9", -0.5f}, {11, "e", -INFINITY}}},
      {12, "\xE2", -1.5f, {}},
      {13, "x", -0.25f, {}},
  };
  api::generate_result result;
  result.reason = api::finish_reason::length;
  door::response_meta meta{door::api_kind::chat, "chatcmpl-1", "m", 1, false, true};
  const auto chat = json::parse(door::render_response(meta, "\xC3\xA9?x", result, nullptr, &lps));
  const auto& content = chat["choices"][0]["logprobs"]["content"];
  CHECK(chat["choices"][0]["logprobs"]["refusal"].is_null());
  REQUIRE(content.size() == 3);
  CHECK(content[0] == json{{"token", "é"},
                           {"logprob", -0.5},
                           {"bytes", {0xC3, 0xA9}},
                           {"top_logprobs",
                            {{{"token", "é"}, {"logprob", -0.5}, {"bytes", {0xC3, 0xA9}}},
                             {{"token", "e"}, {"logprob", -9999.0}, {"bytes", {0x65}}}}}});
  CHECK(content[1]["bytes"] == json{0xE2});  // the exact byte, whatever the text shows
  CHECK(content[1]["top_logprobs"] == json::array());

  meta.kind = door::api_kind::completion;
  const auto cmpl = json::parse(door::render_response(meta, "\xC3\xA9?x", result, nullptr, &lps));
  const auto& lp = cmpl["choices"][0]["logprobs"];
  CHECK(lp["tokens"].size() == 3);
  CHECK(lp["tokens"][0] == "é");
  CHECK(lp["token_logprobs"] == json{-0.5, -1.5, -0.25});
  CHECK(lp["top_logprobs"][0] == json{{"é", -0.5}, {"e", -9999.0}});
  CHECK(lp["top_logprobs"][2] == json::object());
  CHECK(lp["text_offset"] == json{0, 1, 2});

  // Without logprobs asked, the field stays null.
  meta.logprobs = false;
  CHECK(json::parse(door::render_response(meta, "x", result, nullptr, &lps))["choices"][0]["logprobs"].is_null());
}

TEST_CASE("streamed completion logprobs carry the chunk's tokens and text_offset runs on", "[logprobs]") {
  door::response_meta meta{door::api_kind::completion, "cmpl-1", "m", 1, false, true};
  api::token_chunk a{{1, 2}, "ab", 0, {{1, "a", -1.0f, {}}, {2, "b", -2.0f, {}}}};
  api::token_chunk b{{3}, "cd", 2, {{3, "cd", -3.0f, {}}}};
  std::uint32_t offset = 0;
  const auto ea = json::parse(door::render_stream_text(meta, a.text, &a, &offset).substr(6));
  const auto eb = json::parse(door::render_stream_text(meta, b.text, &b, &offset).substr(6));
  CHECK(ea["choices"][0]["logprobs"]["text_offset"] == json{0, 1});
  CHECK(eb["choices"][0]["logprobs"]["text_offset"] == json{2});
  CHECK(eb["choices"][0]["logprobs"]["tokens"] == json{"cd"});
  CHECK(offset == 4);
}

TEST_CASE("completions over HTTP: logprobs streamed and not, in the legacy shape", "[logprobs][http]") {
  test_server s;
  const json body = completion_body({{"logprobs", 2}});
  auto r = http_request(s.http_port(), "POST", "/v1/completions", body.dump());
  REQUIRE(r.status == 200);
  const auto j = json::parse(r.body);
  const json expected = {{"tokens", {"o", "l", "l"}},
                         {"token_logprobs", {-0.25, -0.5, -0.75}},
                         {"top_logprobs", {{{"o", -0.25}, {"p", -1.25}}, {{"l", -0.5}, {"m", -1.5}}, {{"l", -0.75}, {"m", -1.75}}}},
                         {"text_offset", {0, 1, 2}}};
  CHECK(j["choices"][0]["logprobs"] == expected);
  CHECK(s.backend->requests().back().logprobs);
  CHECK(s.backend->requests().back().top_logprobs == 2);

  // Streamed: each event carries its own tokens; together they are the same.
  json streamed_body = body;
  streamed_body["stream"] = true;
  auto st = http_request(s.http_port(), "POST", "/v1/completions", streamed_body.dump());
  REQUIRE(st.status == 200);
  json merged = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
                 {"text_offset", json::array()}};
  for (const auto& e : data_events(st.body)) {
    const auto& lp = e["choices"][0]["logprobs"];
    if (lp.is_null()) continue;  // the closing event
    for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
      for (const auto& v : lp[key]) merged[key].push_back(v);
  }
  CHECK(merged == expected);

  // Not asked: null, as before.
  auto plain = http_request(s.http_port(), "POST", "/v1/completions", completion_body(json::object()).dump());
  CHECK(json::parse(plain.body)["choices"][0]["logprobs"].is_null());
  // Asked wrongly: a 400 naming the field.
  auto bad = http_request(s.http_port(), "POST", "/v1/completions", completion_body({{"logprobs", 50}}).dump());
  CHECK(bad.status == 400);
  CHECK(json::parse(bad.body)["error"]["param"] == "logprobs");
}

TEST_CASE("chat over HTTP: logprobs.content streamed and not", "[logprobs][http]") {
  test_server s;
  const json body = chat_body({{"logprobs", true}, {"top_logprobs", 1}});
  auto r = http_request(s.http_port(), "POST", "/v1/chat/completions", body.dump());
  REQUIRE(r.status == 200);
  const auto j = json::parse(r.body);
  const auto& content = j["choices"][0]["logprobs"]["content"];
  const std::string text = j["choices"][0]["message"]["content"];
  REQUIRE_FALSE(text.empty());
  REQUIRE(content.size() == text.size());  // the fake: one byte per token
  for (std::size_t i = 0; i < content.size(); ++i) {
    const std::string tok(1, text[i]);
    CHECK(content[i]["token"] == tok);
    CHECK(content[i]["logprob"] == Approx(-0.25 * (i + 1)));
    CHECK(content[i]["bytes"] == json{static_cast<unsigned char>(text[i])});
    CHECK(content[i]["top_logprobs"] ==
          json{{{"token", tok}, {"logprob", -0.25 * (i + 1)}, {"bytes", {static_cast<unsigned char>(text[i])}}}});
  }

  json streamed_body = body;
  streamed_body["stream"] = true;
  auto st = http_request(s.http_port(), "POST", "/v1/chat/completions", streamed_body.dump());
  REQUIRE(st.status == 200);
  json merged = json::array();
  for (const auto& e : data_events(st.body)) {
    const auto& c = e["choices"][0];
    if (c["delta"].contains("content") && !c["delta"]["content"].get<std::string>().empty()) {
      REQUIRE(c["logprobs"]["content"].size() == 1);  // one token per chunk from the fake
      CHECK(c["logprobs"]["content"][0]["token"] == c["delta"]["content"]);
    }
    if (!c["logprobs"].is_null())
      for (const auto& entry : c["logprobs"]["content"]) merged.push_back(entry);
  }
  CHECK(merged == content);
}

TEST_CASE("/v1/models shows each deployment's architecture, quantization, tokenizer and draft model", "[openai]") {
  api::model_info m;
  m.name = "llama3";
  m.model_file = "/models/llama3.gguf";
  m.context_length = 8192;
  m.architecture = "llama";
  m.quantization = "Q4_K_M";
  m.tokenizer = "gpt2";
  m.draft_model = "/models/llama3-draft.gguf";
  m.draft_tokens = 4;
  const auto one = json::parse(door::render_model(m, 1));
  CHECK(one["draft_model"] == "/models/llama3-draft.gguf");
  CHECK(one["draft_tokens"] == 4);
  CHECK(one["architecture"] == "llama");
  CHECK(one["quantization"] == "Q4_K_M");
  CHECK(one["tokenizer"] == "gpt2");
  CHECK(one["max_model_len"] == 8192);
  const auto unknown = json::parse(door::render_model_list({api::model_info{}}, 1));
  CHECK(unknown["data"][0]["architecture"].is_null());  // not known: null, not ""
  CHECK(unknown["data"][0]["quantization"].is_null());
  CHECK(unknown["data"][0]["tokenizer"].is_null());
  CHECK(unknown["data"][0]["draft_model"].is_null());  // no draft: null
  CHECK(unknown["data"][0]["draft_tokens"].is_null());
  CHECK(unknown["data"][0]["routing"].is_null());
  CHECK(unknown["data"][0]["prefix_slack"].is_null());
}

TEST_CASE("/v1/models shows each deployment's routing, and prefix_aware's slack", "[openai][prefix]") {
  api::model_info m;
  m.name = "chat";
  m.routing = "prefix_aware";
  m.prefix_slack_tokens = 512;
  m.prefix_slack_ratio = 0.5;
  m.prefix_slack_s = 0.05;
  auto one = json::parse(door::render_model(m, 1));
  CHECK(one["routing"] == "prefix_aware");
  CHECK(one["prefix_slack"]["tokens"] == 512);
  CHECK(one["prefix_slack"]["seconds"] == 0.05);
  CHECK(one["prefix_slack"]["ratio"] == 0.5);
  m.routing = "least_outstanding";  // the slack is kept but not read: not shown
  one = json::parse(door::render_model(m, 1));
  CHECK(one["routing"] == "least_outstanding");
  CHECK(one["prefix_slack"].is_null());
}

TEST_CASE("logprobs show the float the engine computed, at its own precision", "[logprobs]") {
  const std::vector<api::token_logprob> lps = {{1, "a", -0.31725305f, {}}};
  api::generate_result result;
  door::response_meta meta{door::api_kind::chat, "chatcmpl-1", "m", 1, false, true};
  const std::string body = door::render_response(meta, "a", result, nullptr, &lps);
  CHECK_THAT(body, Catch::Contains("\"logprob\":-0.31725305"));
  CHECK_THAT(body, !Catch::Contains("-0.317253053"));
}
