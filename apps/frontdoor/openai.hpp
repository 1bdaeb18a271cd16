#pragma once
// The OpenAI-compatible wire format: parsing and validating request bodies
// into api::generate_request, and rendering responses, stream chunks and
// error objects. Pure functions, no I/O and no KJ, so they are easy to test.

#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/gateway.hpp"
#include "common/error.hpp"

namespace exa::door {

enum class api_kind { completion, chat };

/// A validated request, ready for the backend (request_id still empty).
struct openai_request {
  api_kind kind = api_kind::completion;
  api::generate_request gen;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a usage chunk before [DONE]
  /// ExaServe extension: each choice also carries "token_ids" (and, when
  /// streaming, "token_index", the index of the first), so a client can check
  /// that a resumed stream has no gap and no duplicate.
  bool return_token_ids = false;
};

/// An error about a request, with the field it concerns ("" if none) for the
/// OpenAI error object's "param".
struct request_error {
  error err;
  std::string param;
};

/// Parses a /v1/completions or /v1/chat/completions body. Unknown fields are
/// ignored (as OpenAI does); known ones are type- and range-checked and the
/// error names the field and what it must be.
std::expected<openai_request, request_error> parse_openai_request(api_kind kind, std::string_view body,
                                                                  const api::request_limits& limits);

/// Chat messages travel to the backend as they came (validated here); the
/// backend renders them with the model's own chat template.
using chat_message = api::chat_message;

/// What every response object of one request shares.
struct response_meta {
  api_kind kind = api_kind::completion;
  std::string id;     // "cmpl-..." / "chatcmpl-..."
  std::string model;
  std::int64_t created = 0;  // unix seconds
  bool return_token_ids = false;
  /// The request asked for logprobs: choices carry them in the endpoint's
  /// shape (completions: tokens/token_logprobs/top_logprobs/text_offset;
  /// chat: content[{token, logprob, bytes, top_logprobs}]); else null.
  bool logprobs = false;
};

/// "cmpl-<request id>" or "chatcmpl-<request id>".
std::string response_id(api_kind kind, const std::string& request_id);

/// "stop" or "length" (the reasons a successful request ends with).
std::string_view openai_finish_reason(api::finish_reason reason) noexcept;

/// The non-streaming response body.
std::string render_response(const response_meta& meta, std::string_view text, const api::generate_result& result,
                            const std::vector<api::token_id>* token_ids = nullptr,
                            const std::vector<api::token_logprob>* logprobs = nullptr);

/// One SSE event, "data: {...}\n\n", carrying text (completions: choices[0].text,
/// chat: choices[0].delta.content), and with meta.logprobs the logprobs of the
/// chunk's tokens. `text_offset` (completions) is where the chunk's first
/// token starts in the whole completion; it is advanced past the chunk.
std::string render_stream_text(const response_meta& meta, std::string_view text,
                               const api::token_chunk* tokens = nullptr, std::uint32_t* text_offset = nullptr);
/// The chat stream's opening event: delta {"role":"assistant","content":""}.
std::string render_stream_role(const response_meta& meta);
/// The closing event with finish_reason (and an empty text / delta).
std::string render_stream_finish(const response_meta& meta, api::finish_reason reason);
/// The usage event (choices: []), sent when stream_options.include_usage.
std::string render_stream_usage(const response_meta& meta, const api::token_usage& usage);
/// An error inside a stream that already started: "data: {"error":{...}}\n\n".
std::string render_stream_error(const error& e);
inline constexpr std::string_view sse_done = "data: [DONE]\n\n";

/// {"error":{"message","type","param","code"}}.
std::string render_error(const error& e, std::string_view param = {});

/// GET /v1/models: {"object":"list","data":[{"id","object":"model","created","owned_by":"exaserve",...}]}.
std::string render_model_list(const std::vector<api::model_info>& models, std::int64_t created);
/// GET /v1/models/{id}.
std::string render_model(const api::model_info& model, std::int64_t created);

}  // namespace exa::door
