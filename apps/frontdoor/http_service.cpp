#include "http_service.hpp"

#include <cctype>

#include <kj/debug.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <array>
#include <chrono>
#include <optional>
#include <string_view>

#include "error_mapping.hpp"
#include "validate.hpp"
#include "watched_stream.hpp"

namespace exa::door {

namespace {

using steady = std::chrono::steady_clock;

std::int64_t unix_now_s() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

enum class route_id { unknown, completions, chat, models, model, healthz, readyz, metrics };

struct route_match {
  route_id id = route_id::unknown;
  bool post = false;  // the one method it takes: POST, else GET (and HEAD)
  std::string arg;    // /v1/models/{arg}
};

route_match match_route(std::string_view path) {
  if (path == "/v1/completions") return {route_id::completions, true, {}};
  if (path == "/v1/chat/completions") return {route_id::chat, true, {}};
  if (path == "/v1/models") return {route_id::models, false, {}};
  constexpr std::string_view model_prefix = "/v1/models/";
  if (path.starts_with(model_prefix) && path.size() > model_prefix.size())
    return {route_id::model, false, std::string(path.substr(model_prefix.size()))};
  if (path == "/healthz") return {route_id::healthz, false, {}};
  if (path == "/readyz") return {route_id::readyz, false, {}};
  if (path == "/metrics") return {route_id::metrics, false, {}};
  return {};
}

/// The error a finished request reports, if it did not succeed.
std::optional<error> failure_of(const api::generate_result& r) {
  if (r.err) return *r.err;
  if (r.reason == api::finish_reason::error)
    return error{errc::internal, "the backend reported a failure without details"};
  if (r.reason == api::finish_reason::cancelled) return error{errc::cancelled, "the request was cancelled"};
  return std::nullopt;
}

/// Reads a request body, stopping as soon as it exceeds `max_bytes` (the
/// rest is never buffered).
struct body_reader {
  body_reader(kj::AsyncInputStream& in, std::size_t max_bytes) : in(in), max_bytes(max_bytes) {}
  kj::AsyncInputStream& in;
  std::size_t max_bytes;
  std::string data;
  bool too_large = false;
  bool timed_out = false;
  std::string malformed;  // why the body's framing could not be read (a bad chunk size)
  std::array<char, 16384> buffer{};

  kj::Promise<void> read() {
    return read_some().catch_([this](kj::Exception&& e) -> kj::Promise<void> {
      // The client's bytes, not the server, are at fault: a 400, not a 500.
      // A client that went away has no one to answer.
      if (e.getType() == kj::Exception::Type::DISCONNECTED) return kj::mv(e);
      malformed = e.getDescription().cStr();
      return kj::READY_NOW;
    });
  }

 private:
  kj::Promise<void> read_some() {
    return in.tryRead(buffer.data(), 1, buffer.size()).then([this](size_t n) -> kj::Promise<void> {
      if (n == 0) return kj::READY_NOW;
      if (data.size() + n > max_bytes) {
        too_large = true;
        return kj::READY_NOW;
      }
      data.append(buffer.data(), n);
      return read_some();
    });
  }
};

/// Owns one streaming response while it runs.
struct sse_stream {
  kj::Own<generate_call> call;
  kj::Own<kj::AsyncOutputStream> out;
  response_meta meta;
  bool include_usage = false;
  bool finished = false;
  std::string pending;  // the events of one batch, written at once
  std::uint32_t text_offset = 0;  // completions' logprobs.text_offset of the next token

  /// Renders a batch; sets `finished` when it ends the stream.
  void render(const request_channel::batch& b) {
    for (const auto& chunk : b.chunks)
      if (!chunk.text.empty() || ((meta.return_token_ids || meta.logprobs) && !chunk.tokens.empty()))
        pending += render_stream_text(meta, chunk.text, &chunk, &text_offset);
    if (!b.done) return;
    finished = true;
    if (auto failed = failure_of(*b.done)) {
      // Headers (200) are gone already: the error travels as an event.
      pending += render_stream_error(*failed);
    } else {
      pending += render_stream_finish(meta, b.done->reason);
      if (include_usage) pending += render_stream_usage(meta, b.done->usage);
    }
    pending += sse_done;
  }

  kj::Promise<void> flush_and_continue() {
    auto text = kj::heap<std::string>(std::move(pending));
    pending.clear();
    // A client that stops reading blocks the write while the backend fills
    // the buffer; once it overflows, close the connection (the error event
    // could not get through either).
    // The last write (which may carry that very error) is not cut short.
    auto write = out->write(text->data(), text->size()).attach(kj::mv(text));
    if (!finished) {
      write = write.exclusiveJoin(call->when_overflowed().then([]() -> kj::Promise<void> {
        return KJ_EXCEPTION(DISCONNECTED, "client stopped reading its stream");
      }));
    }
    return write.then([this]() -> kj::Promise<void> {
      if (finished) {
        // Ends the chunked body now, before the handler returns, so the
        // terminating chunk is flushed with the response.
        out = nullptr;
        return kj::READY_NOW;
      }
      return call->next().then([this](request_channel::batch b) {
        render(b);
        return flush_and_continue();
      });
    });
  }
};

}  // namespace

struct http_service::exchange {
  exchange(std::shared_ptr<door_context> c, std::string m, std::string p)
      : ctx(std::move(c)), method(std::move(m)), path(std::move(p)), start(steady::now()) {}
  exchange(const exchange&) = delete;
  exchange& operator=(const exchange&) = delete;
  ~exchange() {
    // No status: the handler was dropped before responding, which only
    // happens when the client went away (499, as nginx logs it).
    const unsigned code = status != 0 ? status : 499;
    ++ctx->counters.http_responses[code];
    const double ms = std::chrono::duration<double, std::milli>(steady::now() - start).count();
    // Probes (load balancers, Prometheus) would drown the log at info.
    const bool probe = code == 200 && (path == "/healthz" || path == "/readyz" || path == "/metrics");
    spdlog::log(probe ? spdlog::level::debug : spdlog::level::info,
                "event=http_request method={} path={} status={} ms={:.2f} request_id={} tenant={}", method, path, code,
                ms, request_id.empty() ? "-" : request_id, tenant_label.empty() ? "-" : tenant_label);
  }

  std::shared_ptr<door_context> ctx;
  std::string method;
  std::string path;
  std::string request_id;
  std::string tenant;  // of the API key, when keys are checked and it is not an admin key
  std::string tenant_label;  // the key's tenant, admin or not, for the log line
  std::string session;       // X-Session-Id: the conversation, when the body names no `user`
  unsigned status = 0;
  steady::time_point start;
};

// Headers need nothing beyond KJ's own checks: Content-Length reaches us as
// the body's length.
kj::Promise<void> http_service::request(kj::HttpMethod method, kj::StringPtr url, const kj::HttpHeaders& headers,
                                        kj::AsyncInputStream& body, Response& response) {
  const std::string_view full(url.cStr(), url.size());
  auto ex = kj::heap<exchange>(ctx_, kj::str(method).cStr(), std::string(full.substr(0, full.find('?'))));
  auto& ref = *ex;
  return route(ref, method, headers, body, response).attach(kj::mv(ex));
}

std::optional<error> http_service::check_key(exchange& ex, const kj::HttpHeaders& headers) {
  const auto& store = ctx_->config.keys;
  if (!store) return std::nullopt;
  std::string_view value;
  KJ_IF_MAYBE(v, headers.get(ids_.authorization)) { value = std::string_view(v->cStr(), v->size()); }
  if (value.empty())
    return error{errc::unauthenticated, "no API key: send it as 'Authorization: Bearer <key>' (exaserve keys add makes one)"};
  constexpr std::string_view scheme = "bearer ";
  const bool bearer = value.size() > scheme.size() &&
                      std::equal(scheme.begin(), scheme.end(), value.begin(),
                                 [](char a, char b) { return a == std::tolower(static_cast<unsigned char>(b)); });
  if (!bearer) return error{errc::unauthenticated, "the Authorization header must be 'Bearer <key>'"};
  std::string_view key = value.substr(scheme.size());
  while (!key.empty() && key.front() == ' ') key.remove_prefix(1);
  while (!key.empty() && key.back() == ' ') key.remove_suffix(1);
  const auto keys = store->current();
  const auth::key_entry* e = keys->find(key);
  if (!e) return error{errc::unauthenticated, "the API key is not valid: it was revoked or never issued"};
  // Never the key: logs and metrics see the tenant only. An admin key sees
  // every tenant's deployments, so it is scoped to none.
  ex.tenant = e->admin ? std::string() : e->tenant;
  ex.tenant_label = e->tenant;
  return std::nullopt;
}

kj::Promise<void> http_service::route(exchange& ex, kj::HttpMethod method, const kj::HttpHeaders& headers,
                                      kj::AsyncInputStream& body, Response& response) {
  auto r = match_route(ex.path);
  if (r.id == route_id::unknown)
    return send_error(ex, response, error{errc::not_found, fmt::format("no such endpoint: {} {}", ex.method, ex.path)});
  const bool allowed = r.post ? method == kj::HttpMethod::POST
                              : method == kj::HttpMethod::GET || method == kj::HttpMethod::HEAD;
  if (!allowed) {
    const char* allow = r.post ? "POST" : "GET, HEAD";
    kj::HttpHeaders extra(table_);
    extra.set(ids_.allow, allow);
    error e{errc::unsupported, fmt::format("method {} is not allowed on {}; use {}", ex.method, ex.path, allow)};
    return send_body(ex, response, 405, "application/json", render_error(e), kj::mv(extra));
  }
  const bool v1 = r.id == route_id::completions || r.id == route_id::chat || r.id == route_id::models ||
                  r.id == route_id::model;
  if (v1)
    if (auto denied = check_key(ex, headers)) return send_error(ex, response, *denied);
  KJ_IF_MAYBE(v, headers.get(ids_.session_id)) {
    if (v->size() > 256)
      return send_error(ex, response, error{errc::invalid_argument, "X-Session-Id has more than 256 characters"});
    ex.session = std::string(v->cStr(), v->size());
  }
  switch (r.id) {
    case route_id::completions:
    case route_id::chat:
      return handle_generate(ex, r.id == route_id::chat, body.tryGetLength(), body, response);
    case route_id::models: return handle_models(ex, {}, response);
    case route_id::model: return handle_models(ex, r.arg, response);
    case route_id::healthz: return send_body(ex, response, 200, "text/plain; charset=utf-8", "ok\n", kj::HttpHeaders(table_));
    case route_id::readyz: return handle_ready(ex, response);
    case route_id::metrics: return handle_metrics(ex, response);
    case route_id::unknown: break;
  }
  return send_error(ex, response, error{errc::internal, "unrouted path"});
}

kj::Promise<void> http_service::handle_generate(exchange& ex, bool chat, kj::Maybe<uint64_t> content_length,
                                                kj::AsyncInputStream& body, Response& response) {
  const std::size_t max = ctx_->config.max_body_bytes;
  const error too_large{errc::invalid_argument, fmt::format("request body is larger than {} bytes", max)};
  KJ_IF_MAYBE(length, content_length) {
    // Refuse before reading a byte of it.
    if (*length > max) return send_error(ex, response, too_large, {}, 413);
  }
  auto reader = kj::heap<body_reader>(body, max);
  auto& r = *reader;
  const auto timeout_ms = ctx_->config.body_timeout_ms;
  auto read = r.read().exclusiveJoin(ctx_->timer.afterDelay(timeout_ms * kj::MILLISECONDS).then([&r] { r.timed_out = true; }));
  return read.then([this, &ex, &r, chat, too_large, timeout_ms, &response]() -> kj::Promise<void> {
    if (r.timed_out)
      return send_error(ex, response,
                        error{errc::deadline_exceeded, fmt::format("request body not received within {} ms", timeout_ms)},
                        {}, 408);
    if (r.too_large) return send_error(ex, response, too_large, {}, 413);
    if (!r.malformed.empty()) {
      spdlog::info("event=http_malformed_body path={} detail=\"{}\"", ex.path, r.malformed);
      return send_error(ex, response,
                        error{errc::invalid_argument, "the request body could not be read: its HTTP framing is "
                                                      "malformed (for example a bad chunk size)"},
                        {}, 400);
    }
    auto kind = chat ? api_kind::chat : api_kind::completion;
    auto req = parse_openai_request(kind, r.data, ctx_->config.limits);
    if (!req) return send_error(ex, response, req.error().err, req.error().param);
    if (auto bad = validate_generate(req->gen, ctx_->config.limits)) return send_error(ex, response, *bad);
    req->gen.tenant = ex.tenant;  // the backend answers another tenant's deployment as unknown
    if (req->gen.user.empty()) req->gen.user = ex.session;  // keeps a conversation on one version
    response_meta meta{kind, {}, req->gen.model, unix_now_s(), req->return_token_ids, req->gen.logprobs};
    auto started = start_limited(ctx_, std::move(req->gen), ex.tenant_label);
    if (!started) {
      const auto& why = started.error();
      return send_error(ex, response, error{why.code, why.message}, why.code == errc::invalid_argument ? "max_tokens" : "",
                        0, why.retry_after_ms);
    }
    auto call = kj::mv(*started);
    ex.request_id = call->id();
    meta.id = response_id(kind, call->id());
    auto work = req->stream ? stream(ex, kj::mv(call), std::move(meta), req->include_usage, response)
                            : complete(ex, kj::mv(call), std::move(meta), response);
    // A client that hangs up drops the work, and with it the call, which
    // cancels the request on the backend.
    auto gone = connection_.when_peer_closed().then(
        []() -> kj::Promise<void> { return KJ_EXCEPTION(DISCONNECTED, "client closed the connection"); });
    return work.exclusiveJoin(kj::mv(gone));
  }).attach(kj::mv(reader));
}

kj::Promise<void> http_service::complete(exchange& ex, kj::Own<generate_call> call, response_meta meta,
                                         Response& response) {
  struct collected {
    kj::Own<generate_call> call;
    response_meta meta;
    std::string text;
    std::vector<api::token_id> token_ids;
    std::vector<api::token_logprob> logprobs;
    kj::Promise<api::generate_result> run() {
      return call->next().then([this](request_channel::batch b) -> kj::Promise<api::generate_result> {
        for (const auto& chunk : b.chunks) {
          text += chunk.text;
          token_ids.insert(token_ids.end(), chunk.tokens.begin(), chunk.tokens.end());
          logprobs.insert(logprobs.end(), chunk.logprobs.begin(), chunk.logprobs.end());
        }
        if (b.done) return kj::mv(*b.done);
        return run();
      });
    }
  };
  auto state = kj::heap<collected>(collected{kj::mv(call), std::move(meta), {}, {}, {}});
  auto& s = *state;
  return s.run()
      .then([this, &ex, &s, &response](api::generate_result result) -> kj::Promise<void> {
        if (auto failed = failure_of(result)) return send_error(ex, response, *failed, {}, 0, result.retry_after_ms);
        return send_json(ex, response, 200, render_response(s.meta, s.text, result, &s.token_ids, &s.logprobs));
      })
      .attach(kj::mv(state));
}

kj::Promise<void> http_service::stream(exchange& ex, kj::Own<generate_call> call, response_meta meta,
                                       bool include_usage, Response& response) {
  auto state = kj::heap<sse_stream>();
  state->call = kj::mv(call);
  state->meta = std::move(meta);
  state->include_usage = include_usage;
  auto& s = *state;
  // Wait for the first event before choosing the status: a request refused
  // outright (unknown model, overloaded) gets a real 404/429, not a 200
  // stream that carries an error.
  return s.call->next()
      .then([this, &ex, &s, &response](request_channel::batch first) -> kj::Promise<void> {
        if (first.chunks.empty() && first.done) {
          if (auto failed = failure_of(*first.done))
            return send_error(ex, response, *failed, {}, 0, first.done->retry_after_ms);
        }
        kj::HttpHeaders headers(table_);
        headers.set(kj::HttpHeaderId::CONTENT_TYPE, "text/event-stream");
        headers.set(ids_.cache_control, "no-cache");
        headers.set(ids_.request_id, ex.request_id);
        ex.status = 200;
        // No size given: the body is chunked and each write goes out at once.
        s.out = response.send(200, "OK", headers);
        if (s.meta.kind == api_kind::chat) s.pending += render_stream_role(s.meta);
        s.render(first);
        return s.flush_and_continue();
      })
      .attach(kj::mv(state));
}

kj::Promise<void> http_service::handle_models(exchange& ex, std::string one, Response& response) {
  auto cb = make_cross_thread_callback<std::vector<api::model_info>>();
  ctx_->backend->models(std::move(cb.callback));
  auto listed = cb.promise.then([](std::vector<api::model_info> m) { return expected<std::vector<api::model_info>>(std::move(m)); });
  return with_deadline(ctx_->timer, ctx_->config.backend_call_timeout_ms, kj::mv(listed), "models")
      .then([this, &ex, &response, one = std::move(one)](expected<std::vector<api::model_info>> models) {
        if (!models) return send_error(ex, response, models.error());
        // Another tenant's deployments are not listed: to this caller they do not exist.
        std::erase_if(*models, [&](const api::model_info& m) { return !auth::visible_to(ex.tenant, m.tenant); });
        const auto created = unix_now_s();
        if (one.empty()) return send_json(ex, response, 200, render_model_list(*models, created));
        for (const auto& m : *models)
          if (m.name == one) return send_json(ex, response, 200, render_model(m, created));
        return send_error(ex, response, error{errc::not_found, fmt::format("model '{}' does not exist", one)}, "model");
      });
}

kj::Promise<void> http_service::handle_ready(exchange& ex, Response& response) {
  auto cb = make_cross_thread_callback<bool>();
  ctx_->backend->ready(std::move(cb.callback));
  auto asked = cb.promise.then([](bool ready) { return expected<bool>(ready); });
  return with_deadline(ctx_->timer, ctx_->config.backend_call_timeout_ms, kj::mv(asked), "ready")
      .then([this, &ex, &response](expected<bool> ready) {
        const bool ok = ready && *ready;
        std::string body = ok ? "ready\n" : ready ? "not ready\n" : "not ready: " + to_string(ready.error()) + "\n";
        return send_body(ex, response, ok ? 200 : 503, "text/plain; charset=utf-8", std::move(body),
                         kj::HttpHeaders(table_));
      });
}

kj::Promise<void> http_service::handle_metrics(exchange& ex, Response& response) {
  auto cb = make_cross_thread_callback<std::string>();
  ctx_->backend->metrics(std::move(cb.callback));
  auto text = cb.promise.then([](std::string t) { return expected<std::string>(std::move(t)); });
  return with_deadline(ctx_->timer, ctx_->config.backend_call_timeout_ms, kj::mv(text), "metrics")
      .then([this, &ex, &response](expected<std::string> backend_text) {
        if (!backend_text) return send_error(ex, response, backend_text.error());
        std::string body = std::move(*backend_text);
        if (!body.empty() && body.back() != '\n') body += '\n';
        body += ctx_->counters.render();
        return send_body(ex, response, 200, "text/plain; version=0.0.4; charset=utf-8", std::move(body),
                         kj::HttpHeaders(table_));
      });
}

kj::Promise<void> http_service::send_body(exchange& ex, Response& response, unsigned status,
                                          kj::StringPtr content_type, std::string body, kj::HttpHeaders headers) {
  headers.set(kj::HttpHeaderId::CONTENT_TYPE, content_type);
  if (!ex.request_id.empty()) headers.set(ids_.request_id, ex.request_id);
  ex.status = status;
  const auto reason = http_reason(status);
  auto owned = kj::heap<std::string>(std::move(body));  // heap: the write keeps pointing into it
  auto out = response.send(status, kj::heapString(reason.data(), reason.size()), headers, owned->size());
  auto write = out->write(owned->data(), owned->size());
  return write.attach(kj::mv(out), kj::mv(owned));
}

kj::Promise<void> http_service::send_json(exchange& ex, Response& response, unsigned status, std::string body) {
  return send_body(ex, response, status, "application/json", std::move(body), kj::HttpHeaders(table_));
}

kj::Promise<void> http_service::send_error(exchange& ex, Response& response, const error& e, std::string_view param,
                                           unsigned status, std::uint32_t retry_after_ms) {
  const auto cls = classify_http(e.code);
  if (status == 0) status = cls.status;
  kj::HttpHeaders headers(table_);
  if (e.code == errc::overloaded) {
    const unsigned seconds = retry_after_ms ? (retry_after_ms + 999) / 1000 : retry_after_s;
    headers.set(ids_.retry_after, kj::str(seconds));
  }
  if (e.code == errc::unauthenticated) headers.set(ids_.www_authenticate, "Bearer");
  spdlog::debug("event=http_error path={} status={} code={} message=\"{}\"", ex.path, status, to_string(e.code),
                e.message);
  return send_body(ex, response, status, "application/json", render_error(e, param), kj::mv(headers));
}

// ---------------------------------------------------------------------------

kj::Promise<void> http_error_handler::send(kj::HttpService::Response& response, unsigned status, const error& e) {
  ++ctx_->counters.http_responses[status];
  kj::HttpHeaders headers(table_);
  headers.set(kj::HttpHeaderId::CONTENT_TYPE, "application/json");
  auto body = kj::heap<std::string>(render_error(e));
  const auto reason = http_reason(status);
  auto out = response.send(status, kj::heapString(reason.data(), reason.size()), headers, body->size());
  auto write = out->write(body->data(), body->size());
  return write.attach(kj::mv(out), kj::mv(body));
}

kj::Promise<void> http_error_handler::handleClientProtocolError(kj::HttpHeaders::ProtocolError error,
                                                                kj::HttpService::Response& response) {
  spdlog::info("event=http_protocol_error status={} description=\"{}\"", error.statusCode, error.description.cStr());
  // KJ answers a request line it cannot parse as a method with 501 (Not
  // Implemented); whatever the client sent, it is the client's error.
  const unsigned status = error.statusCode >= 400 && error.statusCode < 500 ? error.statusCode : 400;
  return send(response, status,
              exa::error{errc::invalid_argument, std::string("malformed HTTP request: ") + error.description.cStr()});
}

kj::Promise<void> http_error_handler::handleApplicationError(kj::Exception exception,
                                                             kj::Maybe<kj::HttpService::Response&> response) {
  // A client that went away is not a server error, and there is no one to
  // answer; the request's own log line records it.
  if (exception.getType() == kj::Exception::Type::DISCONNECTED) return kj::READY_NOW;
  KJ_IF_MAYBE(r, response) {
    const std::string_view description = exception.getDescription().cStr();
    if (const auto phrase = client_framing_error(description); !phrase.empty()) {
      spdlog::info("event=http_protocol_error status=400 description=\"{}\"", description);
      return send(*r, 400, exa::error{errc::invalid_argument, "malformed HTTP request: " + std::string(phrase)});
    }
    spdlog::error("event=http_handler_exception description=\"{}\"", description);
    return send(*r, 500, exa::error{errc::internal, "the server failed to handle the request"});
  }
  // Answered already: what failed is the connection after it (KJ skipping
  // the rest of a body whose framing was malformed), and it is closed.
  spdlog::info("event=http_connection_closed reason=\"{}\"", exception.getDescription().cStr());
  return kj::READY_NOW;
}

kj::Promise<void> http_error_handler::handleNoResponse(kj::HttpService::Response& response) {
  spdlog::error("event=http_no_response");
  return send(response, 500, exa::error{errc::internal, "the server produced no response"});
}

}  // namespace exa::door
