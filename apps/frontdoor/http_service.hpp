#pragma once
// The OpenAI-compatible HTTP API on KJ HTTP: routing, bounded body reading,
// completions (plain and server-sent events), models, health, readiness and
// metrics. One http_service per connection, so it can watch its connection
// for the client going away mid-request.

#include <kj/compat/http.h>

#include <memory>
#include <optional>

#include "door_context.hpp"
#include "openai.hpp"

namespace exa::door {

class watched_stream;

/// The extra header ids the front door sends, registered in the server's table.
struct http_header_ids {
  explicit http_header_ids(kj::HttpHeaderTable::Builder& builder)
      : retry_after(builder.add("Retry-After")),
        allow(builder.add("Allow")),
        request_id(builder.add("X-Request-Id")),
        cache_control(builder.add("Cache-Control")),
        authorization(builder.add("Authorization")),
        www_authenticate(builder.add("WWW-Authenticate")),
        session_id(builder.add("X-Session-Id")) {}
  kj::HttpHeaderId retry_after;
  kj::HttpHeaderId allow;
  kj::HttpHeaderId request_id;
  kj::HttpHeaderId cache_control;
  kj::HttpHeaderId authorization;
  kj::HttpHeaderId www_authenticate;
  kj::HttpHeaderId session_id;  // a conversation key, as the body's `user`
};

class http_service final : public kj::HttpService {
 public:
  http_service(std::shared_ptr<door_context> ctx, const kj::HttpHeaderTable& table, const http_header_ids& ids,
               watched_stream& connection)
      : ctx_(std::move(ctx)), table_(table), ids_(ids), connection_(connection) {}

  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url, const kj::HttpHeaders& headers,
                            kj::AsyncInputStream& body, Response& response) override;

 private:
  struct exchange;

  kj::Promise<void> route(exchange& ex, kj::HttpMethod method, const kj::HttpHeaders& headers,
                          kj::AsyncInputStream& body, Response& response);
  /// With keys configured: the error for a missing or unknown key (the
  /// exchange learns the key's tenant otherwise).
  std::optional<error> check_key(exchange& ex, const kj::HttpHeaders& headers);
  kj::Promise<void> handle_generate(exchange& ex, bool chat, kj::Maybe<uint64_t> content_length,
                                    kj::AsyncInputStream& body, Response& response);
  kj::Promise<void> complete(exchange& ex, kj::Own<generate_call> call, response_meta meta,
                             Response& response);
  kj::Promise<void> stream(exchange& ex, kj::Own<generate_call> call, response_meta meta,
                           bool include_usage, Response& response);
  kj::Promise<void> handle_models(exchange& ex, std::string one, Response& response);
  kj::Promise<void> handle_ready(exchange& ex, Response& response);
  kj::Promise<void> handle_metrics(exchange& ex, Response& response);

  kj::Promise<void> send_body(exchange& ex, Response& response, unsigned status, kj::StringPtr content_type,
                              std::string body, kj::HttpHeaders headers);
  kj::Promise<void> send_json(exchange& ex, Response& response, unsigned status, std::string body);
  /// `retry_after_ms`: the backend's suggested wait for an overloaded error
  /// (0: the default), sent as Retry-After in whole seconds.
  kj::Promise<void> send_error(exchange& ex, Response& response, const error& e, std::string_view param = {},
                               unsigned status = 0, std::uint32_t retry_after_ms = 0);

  std::shared_ptr<door_context> ctx_;
  const kj::HttpHeaderTable& table_;
  const http_header_ids& ids_;
  watched_stream& connection_;
};

/// Turns malformed requests and handler failures into OpenAI-style JSON
/// errors (KJ's default is a plain-text page), and keeps a client that
/// vanished from being logged as a server error.
class http_error_handler final : public kj::HttpServerErrorHandler {
 public:
  http_error_handler(std::shared_ptr<door_context> ctx, const kj::HttpHeaderTable& table)
      : ctx_(std::move(ctx)), table_(table) {}

  kj::Promise<void> handleClientProtocolError(kj::HttpHeaders::ProtocolError error,
                                              kj::HttpService::Response& response) override;
  kj::Promise<void> handleApplicationError(kj::Exception exception,
                                           kj::Maybe<kj::HttpService::Response&> response) override;
  kj::Promise<void> handleNoResponse(kj::HttpService::Response& response) override;

 private:
  kj::Promise<void> send(kj::HttpService::Response& response, unsigned status, const error& e);

  std::shared_ptr<door_context> ctx_;
  const kj::HttpHeaderTable& table_;
};

}  // namespace exa::door
