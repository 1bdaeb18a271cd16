#include "openai.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/json_syntax.hpp"
#include "error_mapping.hpp"

namespace exa::door {

namespace {

using json = nlohmann::json;
using check = std::optional<request_error>;  // nullopt: the field is fine

request_error field_error(std::string field, std::string message, errc code = errc::invalid_argument) {
  return request_error{error{code, std::move(message)}, std::move(field)};
}

std::expected<json, request_error> parse_body(std::string_view body) {
  json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    return std::unexpected(field_error("", "request body is not valid JSON: " + json_syntax_error(body)));
  }
  if (!parsed.is_object()) return std::unexpected(field_error("", "request body must be a JSON object"));
  return parsed;
}

/// Present and not null (OpenAI clients send null for "use the default").
const json* find_field(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

check read_int(const json& obj, const char* name, std::int64_t min, std::int64_t max, std::int64_t& out) {
  const json* v = find_field(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) return field_error(name, fmt::format("'{}' must be an integer", name));
  const bool too_big = v->is_number_unsigned() && v->get<std::uint64_t>() > static_cast<std::uint64_t>(max);
  if (too_big || v->get<std::int64_t>() < min || v->get<std::int64_t>() > max)
    return field_error(name, fmt::format("'{}' must be between {} and {} (got {})", name, min, max, v->dump()));
  out = v->get<std::int64_t>();
  return std::nullopt;
}

check read_number(const json& obj, const char* name, double min, double max, double& out) {
  const json* v = find_field(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) return field_error(name, fmt::format("'{}' must be a number", name));
  const double d = v->get<double>();
  if (!(d >= min && d <= max))
    return field_error(name, fmt::format("'{}' must be between {} and {} (got {})", name, min, max, v->dump()));
  out = d;
  return std::nullopt;
}

check read_bool(const json& obj, const char* name, bool& out) {
  const json* v = find_field(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) return field_error(name, fmt::format("'{}' must be a boolean", name));
  out = v->get<bool>();
  return std::nullopt;
}

check read_token_ids(const json& prompt, const api::request_limits& limits, api::generate_request& gen) {
  if (prompt.size() > limits.prompt_tokens_max)
    return field_error("prompt", fmt::format("'prompt' has {} token ids; at most {} are allowed", prompt.size(),
                                             limits.prompt_tokens_max));
  std::vector<api::token_id> ids;
  ids.reserve(prompt.size());
  for (const auto& v : prompt) {
    constexpr auto id_max = static_cast<std::int64_t>(std::numeric_limits<api::token_id>::max());
    const bool in_range = v.is_number_integer() && v.get<std::int64_t>() >= 0 &&
                          !(v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(id_max)) &&
                          v.get<std::int64_t>() <= id_max;
    if (!in_range)
      return field_error("prompt", fmt::format("'prompt' token ids must be integers in [0, {}] (got {})", id_max,
                                               v.dump()));
    ids.push_back(static_cast<api::token_id>(v.get<std::int64_t>()));
  }
  gen.prompt_ids = std::move(ids);
  return std::nullopt;
}

check read_prompt(const json& body, const api::request_limits& limits, api::generate_request& gen) {
  const json* p = find_field(body, "prompt");
  if (!p) return field_error("prompt", "'prompt' is required");
  if (p->is_string()) {
    if (p->get_ref<const std::string&>().size() > limits.prompt_bytes_max)
      return field_error("prompt", fmt::format("'prompt' is longer than {} bytes", limits.prompt_bytes_max));
    gen.prompt_text = p->get<std::string>();
    return std::nullopt;
  }
  if (!p->is_array()) return field_error("prompt", "'prompt' must be a string or an array of token ids");
  if (p->empty()) return field_error("prompt", "'prompt' must not be empty");
  if ((*p)[0].is_string() || (*p)[0].is_array())
    return field_error("prompt", "batched prompts are not supported: send one prompt per request",
                       errc::unsupported);
  return read_token_ids(*p, limits, gen);
}

/// OpenAI content is a string or an array of parts; only text parts exist here.
check read_content(const json& v, const std::string& where, std::string& out) {
  if (v.is_string()) {
    out = v.get<std::string>();
    return std::nullopt;
  }
  if (!v.is_array()) return field_error(where, fmt::format("'{}' must be a string", where));
  for (const auto& part : v) {
    const json* type = part.is_object() ? find_field(part, "type") : nullptr;
    const json* text = part.is_object() ? find_field(part, "text") : nullptr;
    if (!type || *type != "text" || !text || !text->is_string())
      return field_error(where, fmt::format("'{}' parts must be {{\"type\":\"text\",\"text\":...}}", where),
                         errc::unsupported);
    out += text->get_ref<const std::string&>();
  }
  return std::nullopt;
}

check read_messages(const json& body, const api::request_limits& limits, api::generate_request& gen) {
  const json* m = find_field(body, "messages");
  if (!m) return field_error("messages", "'messages' is required");
  if (!m->is_array()) return field_error("messages", "'messages' must be an array");
  if (m->empty()) return field_error("messages", "'messages' must not be empty");
  std::vector<chat_message> messages;
  std::size_t total_bytes = 0;
  for (std::size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!msg.is_object()) return field_error(where, fmt::format("'{}' must be an object", where));
    const json* role = find_field(msg, "role");
    // Templates decide which roles and orders they accept (and refuse the
    // rest with their own message); these are the roles OpenAI defines that
    // carry text.
    if (!role || !role->is_string() ||
        (*role != "system" && *role != "user" && *role != "assistant" && *role != "tool"))
      return field_error(where + ".role",
                         fmt::format("'{}.role' must be one of system, user, assistant, tool", where));
    const json* content = find_field(msg, "content");
    if (!content) return field_error(where + ".content", fmt::format("'{}.content' is required", where));
    chat_message out{role->get<std::string>(), {}};
    if (auto bad = read_content(*content, where + ".content", out.content)) return bad;
    total_bytes += out.role.size() + out.content.size();
    if (total_bytes > limits.prompt_bytes_max)
      return field_error("messages", fmt::format("'messages' hold more than {} bytes", limits.prompt_bytes_max));
    messages.push_back(std::move(out));
  }
  gen.messages = std::move(messages);
  // An extension vLLM also has: false renders the conversation without the
  // template's cue for the assistant's reply (to continue a given turn).
  if (const json* agp = find_field(body, "add_generation_prompt")) {
    if (!agp->is_boolean())
      return field_error("add_generation_prompt", "'add_generation_prompt' must be a boolean");
    gen.add_generation_prompt = agp->get<bool>();
  }
  return std::nullopt;
}

check read_stop(const json& body, const api::request_limits& limits, api::generate_request& gen) {
  const json* s = find_field(body, "stop");
  if (!s) return std::nullopt;
  std::vector<std::string> stops;
  if (s->is_string()) {
    stops.push_back(s->get<std::string>());
  } else if (s->is_array()) {
    if (s->size() > limits.stop_sequences_max)
      return field_error("stop", fmt::format("'stop' has {} sequences; at most {} are allowed", s->size(),
                                             limits.stop_sequences_max));
    for (const auto& v : *s) {
      if (!v.is_string()) return field_error("stop", "'stop' must be a string or an array of strings");
      stops.push_back(v.get<std::string>());
    }
  } else {
    return field_error("stop", "'stop' must be a string or an array of strings");
  }
  for (const auto& stop : stops) {
    if (stop.empty()) return field_error("stop", "'stop' sequences must not be empty");
    if (stop.size() > limits.stop_sequence_bytes_max)
      return field_error("stop", fmt::format("'stop' sequences must be at most {} bytes", limits.stop_sequence_bytes_max));
  }
  gen.stop = std::move(stops);
  return std::nullopt;
}

check read_sampling(const json& body, api::sampling_params& s) {
  double temperature = s.temperature, top_p = s.top_p;
  std::int64_t top_k = s.top_k, seed = static_cast<std::int64_t>(s.seed);
  if (auto bad = read_number(body, "temperature", 0.0, 2.0, temperature)) return bad;
  if (auto bad = read_number(body, "top_p", 0.0, 1.0, top_p)) return bad;
  if (top_p <= 0.0) return field_error("top_p", "'top_p' must be greater than 0 and at most 1");
  // -1 is how vLLM clients say "no top-k"; it means the same as 0 here.
  if (auto bad = read_int(body, "top_k", -1, std::numeric_limits<std::int32_t>::max(), top_k)) return bad;
  if (auto bad = read_int(body, "seed", 0, std::numeric_limits<std::int64_t>::max(), seed)) return bad;
  s.temperature = static_cast<float>(temperature);
  s.top_p = static_cast<float>(top_p);
  s.top_k = top_k < 0 ? 0 : static_cast<std::uint32_t>(top_k);
  s.seed = static_cast<std::uint64_t>(seed);
  return std::nullopt;
}

check read_max_tokens(api_kind kind, const json& body, const api::request_limits& limits, api::generate_request& gen) {
  // Chat clients send max_completion_tokens (the current name) or max_tokens.
  const char* name = "max_tokens";
  if (kind == api_kind::chat && find_field(body, "max_completion_tokens")) name = "max_completion_tokens";
  std::int64_t max_tokens = gen.max_tokens;
  if (auto bad = read_int(body, name, 1, limits.max_tokens_max, max_tokens)) return bad;
  gen.max_tokens = static_cast<std::uint32_t>(max_tokens);
  return std::nullopt;
}

check read_options(const json& body, openai_request& req) {
  if (auto bad = read_bool(body, "stream", req.stream)) return bad;
  if (auto bad = read_bool(body, "ignore_eos", req.gen.ignore_eos)) return bad;
  if (auto bad = read_bool(body, "return_token_ids", req.return_token_ids)) return bad;
  std::int64_t n = 1;
  if (auto bad = read_int(body, "n", 1, std::numeric_limits<std::int32_t>::max(), n)) return bad;
  if (n != 1) return field_error("n", "only n=1 is supported", errc::unsupported);
  if (const json* so = find_field(body, "stream_options")) {
    if (!so->is_object()) return field_error("stream_options", "'stream_options' must be an object");
    if (auto bad = read_bool(*so, "include_usage", req.include_usage)) return bad;
  }
  // ExaServe's own: "interactive" (default) or "batch", the order requests
  // wait in while replicas are full.
  if (const json* p = find_field(body, "priority")) {
    if (!p->is_string() || (*p != "interactive" && *p != "batch"))
      return field_error("priority", "'priority' must be \"interactive\" or \"batch\"");
    req.gen.priority = p->get<std::string>();
  }
  // OpenAI's end-user id: the conversation key that keeps one user on one
  // version during a rollout.
  if (const json* u = find_field(body, "user")) {
    if (!u->is_string() || u->get_ref<const std::string&>().size() > 256)
      return field_error("user", "'user' must be a string of at most 256 characters");
    req.gen.user = u->get<std::string>();
  }
  return std::nullopt;
}

// Completions take the legacy `logprobs: N` (alternatives per token); chat
// takes `logprobs: true` and `top_logprobs: N`. N is at most 20 in both
// (OpenAI allows 5 in completions; 20 keeps one bound and matches vLLM).
check read_logprobs(api_kind kind, const json& body, api::generate_request& gen) {
  std::int64_t top = 0;
  if (kind == api_kind::completion) {
    const json* v = find_field(body, "logprobs");
    if (!v) return std::nullopt;
    if (!v->is_number_integer())
      return field_error("logprobs", fmt::format("'logprobs' must be an integer between 0 and {} (the number of "
                                                 "alternatives per token)", api::max_top_logprobs));
    if (auto bad = read_int(body, "logprobs", 0, api::max_top_logprobs, top)) return bad;
    gen.logprobs = true;
    gen.top_logprobs = static_cast<std::uint32_t>(top);
    return std::nullopt;
  }
  if (auto bad = read_bool(body, "logprobs", gen.logprobs)) return bad;
  if (!find_field(body, "top_logprobs")) return std::nullopt;
  if (auto bad = read_int(body, "top_logprobs", 0, api::max_top_logprobs, top)) return bad;
  // 0 asks for nothing, and clients that send every field with its default
  // send it: only a real request for alternatives needs logprobs on.
  if (!gen.logprobs && top > 0) return field_error("top_logprobs", "'top_logprobs' requires 'logprobs': true");
  gen.top_logprobs = static_cast<std::uint32_t>(top);
  return std::nullopt;
}

check read_model(const json& body, api::generate_request& gen) {
  const json* m = find_field(body, "model");
  if (!m) return field_error("model", "'model' is required");
  if (!m->is_string() || m->get_ref<const std::string&>().empty())
    return field_error("model", "'model' must be a non-empty string");
  gen.model = m->get<std::string>();
  return std::nullopt;
}

// OpenAI's usage object. prompt_tokens_details is always there (0 cached
// when the prefix cache had nothing, or the engine has none), as OpenAI sends it.
json usage_json(const api::token_usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json chunk_envelope(const response_meta& meta) {
  return {{"id", meta.id},
          {"object", meta.kind == api_kind::chat ? "chat.completion.chunk" : "text_completion"},
          {"created", meta.created},
          {"model", meta.model}};
}

/// JSON has no -inf: like OpenAI, a token too unlikely to matter is -9999.
/// A float's shortest decimal (-0.31725305, not -0.3172530531883240), so the
/// JSON shows the precision the engine computed, no more.
double logprob_value(float lp) {
  if (!std::isfinite(lp) || lp <= -9999.0f) return -9999.0;
  char buf[32];
  const auto end = std::to_chars(buf, buf + sizeof buf, lp).ptr;
  return std::strtod(std::string(buf, end).c_str(), nullptr);
}

json token_bytes(const std::string& token) {
  json out = json::array();
  for (const unsigned char c : token) out.push_back(static_cast<int>(c));
  return out;
}

/// Characters (code points) in a token's text, as a Python client's len()
/// counts them for text_offset: every byte that does not continue one.
std::uint32_t code_points(const std::string& token) {
  std::uint32_t n = 0;
  for (const unsigned char c : token) n += (c & 0xC0) != 0x80;
  return n;
}

/// chat: {"content":[{"token","logprob","bytes","top_logprobs":[{"token","logprob","bytes"}]}],"refusal":null}.
json chat_logprobs(const std::vector<api::token_logprob>& lps) {
  json content = json::array();
  for (const auto& lp : lps) {
    json top = json::array();
    for (const auto& t : lp.top)
      top.push_back({{"token", t.token}, {"logprob", logprob_value(t.logprob)}, {"bytes", token_bytes(t.token)}});
    content.push_back({{"token", lp.token},
                       {"logprob", logprob_value(lp.logprob)},
                       {"bytes", token_bytes(lp.token)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

/// completions: {"tokens","token_logprobs","top_logprobs":[{token: logprob}],"text_offset"};
/// `offset` is where the first token starts and is advanced past the last.
json completion_logprobs(const std::vector<api::token_logprob>& lps, std::uint32_t& offset) {
  json tokens = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
  for (const auto& lp : lps) {
    tokens.push_back(lp.token);
    values.push_back(logprob_value(lp.logprob));
    json top = json::object();
    // Two ids with the same text share a key: the likelier (first) one keeps it.
    for (const auto& t : lp.top)
      if (!top.contains(t.token)) top[t.token] = logprob_value(t.logprob);
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += code_points(lp.token);
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(values)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

json logprobs_json(const response_meta& meta, const std::vector<api::token_logprob>* lps, std::uint32_t& offset) {
  if (!meta.logprobs) return nullptr;
  static const std::vector<api::token_logprob> none;
  const auto& list = lps ? *lps : none;
  return meta.kind == api_kind::chat ? chat_logprobs(list) : completion_logprobs(list, offset);
}

/// Text from the backend is valid UTF-8; `replace` keeps a broken byte from
/// turning a response into an exception.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

}  // namespace

std::expected<openai_request, request_error> parse_openai_request(api_kind kind, std::string_view body,
                                                                  const api::request_limits& limits) {
  auto parsed = parse_body(body);
  if (!parsed) return std::unexpected(std::move(parsed.error()));
  const json& j = *parsed;
  openai_request req;
  req.kind = kind;
  auto first_error = [&]() -> check {
    if (auto bad = read_model(j, req.gen)) return bad;
    if (auto bad = kind == api_kind::chat ? read_messages(j, limits, req.gen) : read_prompt(j, limits, req.gen))
      return bad;
    if (auto bad = read_max_tokens(kind, j, limits, req.gen)) return bad;
    if (auto bad = read_sampling(j, req.gen.sampling)) return bad;
    if (auto bad = read_stop(j, limits, req.gen)) return bad;
    if (auto bad = read_logprobs(kind, j, req.gen)) return bad;
    return read_options(j, req);
  }();
  if (first_error) return std::unexpected(std::move(*first_error));
  return req;
}

std::string response_id(api_kind kind, const std::string& request_id) {
  return (kind == api_kind::chat ? "chatcmpl-" : "cmpl-") + request_id;
}

std::string_view openai_finish_reason(api::finish_reason reason) noexcept {
  return reason == api::finish_reason::length ? "length" : "stop";
}

std::string render_response(const response_meta& meta, std::string_view text, const api::generate_result& result,
                            const std::vector<api::token_id>* token_ids,
                            const std::vector<api::token_logprob>* logprobs) {
  std::uint32_t offset = 0;
  json choice = {{"index", 0},
                 {"logprobs", logprobs_json(meta, logprobs, offset)},
                 {"finish_reason", openai_finish_reason(result.reason)}};
  if (meta.return_token_ids && token_ids) choice["token_ids"] = *token_ids;
  if (meta.kind == api_kind::chat)
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  else
    choice["text"] = text;
  json body = {{"id", meta.id},
               {"object", meta.kind == api_kind::chat ? "chat.completion" : "text_completion"},
               {"created", meta.created},
               {"model", meta.model},
               {"choices", json::array({std::move(choice)})},
               {"usage", usage_json(result.usage)}};
  return dump(body);
}

std::string render_stream_text(const response_meta& meta, std::string_view text, const api::token_chunk* tokens,
                               std::uint32_t* text_offset) {
  std::uint32_t local_offset = 0;
  json choice = {{"index", 0},
                 {"logprobs", logprobs_json(meta, tokens ? &tokens->logprobs : nullptr,
                                            text_offset ? *text_offset : local_offset)},
                 {"finish_reason", nullptr}};
  if (meta.return_token_ids && tokens) {
    choice["token_ids"] = tokens->tokens;
    choice["token_index"] = tokens->first_index;
  }
  if (meta.kind == api_kind::chat)
    choice["delta"] = {{"content", text}};
  else
    choice["text"] = text;
  json chunk = chunk_envelope(meta);
  chunk["choices"] = json::array({std::move(choice)});
  return sse(chunk);
}

std::string render_stream_role(const response_meta& meta) {
  json chunk = chunk_envelope(meta);
  chunk["choices"] = json::array({{{"index", 0},
                                   {"delta", {{"role", "assistant"}, {"content", ""}}},
                                   {"logprobs", nullptr},
                                   {"finish_reason", nullptr}}});
  return sse(chunk);
}

std::string render_stream_finish(const response_meta& meta, api::finish_reason reason) {
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", openai_finish_reason(reason)}};
  if (meta.kind == api_kind::chat)
    choice["delta"] = json::object();
  else
    choice["text"] = "";
  json chunk = chunk_envelope(meta);
  chunk["choices"] = json::array({std::move(choice)});
  return sse(chunk);
}

std::string render_stream_usage(const response_meta& meta, const api::token_usage& usage) {
  json chunk = chunk_envelope(meta);
  chunk["choices"] = json::array();
  chunk["usage"] = usage_json(usage);
  return sse(chunk);
}

namespace {
json error_json(const error& e, std::string_view param) {
  const auto cls = classify_http(e.code);
  return {{"error",
           {{"message", e.message},
            {"type", cls.openai_type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            // What OpenAI's own API answers, and clients look for.
            {"code", e.code == errc::unauthenticated ? std::string_view("invalid_api_key") : to_string(e.code)}}}};
}
}  // namespace

std::string render_stream_error(const error& e) { return sse(error_json(e, {})); }

std::string render_error(const error& e, std::string_view param) { return dump(error_json(e, param)); }

namespace {
json model_json(const api::model_info& m, std::int64_t created) {
  return {{"id", m.name},
          {"object", "model"},
          {"created", created},
          {"owned_by", "exaserve"},
          {"root", m.model_file},
          {"max_model_len", m.context_length},
          {"replicas_ready", m.replicas_ready},
          {"replicas_desired", m.replicas_desired},
          {"version", m.version},
          // What the file is: its architecture, llama.cpp's file type (or
          // the dominant weight type) and its tokenizer; null where unknown.
          {"architecture", m.architecture.empty() ? json(nullptr) : json(m.architecture)},
          {"quantization", m.quantization.empty() ? json(nullptr) : json(m.quantization)},
          {"tokenizer", m.tokenizer.empty() ? json(nullptr) : json(m.tokenizer)},
          // Speculative decoding: the draft model's file and its tokens per
          // step; null without a draft. Extra keys, like the ones above:
          // OpenAI clients read id/object/created/owned_by and ignore the rest.
          {"draft_model", m.draft_model.empty() ? json(nullptr) : json(m.draft_model)},
          {"draft_tokens", m.draft_model.empty() ? json(nullptr) : json(m.draft_tokens)},
          // Its routing policy (null where the cluster did not say), and
          // prefix_aware's load slack (null under any other policy).
          {"routing", m.routing.empty() ? json(nullptr) : json(m.routing)},
          {"prefix_slack", m.routing != "prefix_aware" ? json(nullptr)
                                                       : json{{"tokens", m.prefix_slack_tokens},
                                                              {"seconds", m.prefix_slack_s},
                                                              {"ratio", m.prefix_slack_ratio}}}};
}
}  // namespace

std::string render_model_list(const std::vector<api::model_info>& models, std::int64_t created) {
  json data = json::array();
  for (const auto& m : models) data.push_back(model_json(m, created));
  return dump(json{{"object", "list"}, {"data", std::move(data)}});
}

std::string render_model(const api::model_info& model, std::int64_t created) {
  return dump(model_json(model, created));
}

}  // namespace exa::door
