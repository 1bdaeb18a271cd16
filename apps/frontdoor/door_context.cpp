#include "door_context.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>

#include "common/assert.hpp"

namespace exa::door {

namespace {
// Shared by every front door in the process, so ids stay unique even when
// tests run several.
std::atomic<std::uint64_t> request_counter{0};
}  // namespace

request_ids::request_ids() : rng_(std::random_device{}()) {}

std::string request_ids::next() {
  const auto n = request_counter.fetch_add(1, std::memory_order_relaxed) + 1;
  return fmt::format("req-{}-{:08x}", n, static_cast<std::uint32_t>(rng_()));
}

}  // namespace exa::door

namespace exa {

std::vector<std::pair<std::string, std::string>> frontdoor_metric_families() {
  // Read off what render() writes, so the list cannot drift from it.
  std::vector<std::pair<std::string, std::string>> out;
  const std::string text = door::door_counters{}.render();
  std::size_t pos = 0;
  while ((pos = text.find("# TYPE ", pos)) != std::string::npos) {
    pos += 7;
    const auto sp = text.find(' ', pos);
    const auto nl = text.find('\n', sp);
    out.emplace_back(text.substr(pos, sp - pos), text.substr(sp + 1, nl - sp - 1));
    pos = nl;
  }
  return out;
}

}  // namespace exa

namespace exa::door {

std::string door_counters::render() const {
  std::string out;
  out += "# HELP exaserve_frontdoor_http_responses_total HTTP responses sent, by status code.\n";
  out += "# TYPE exaserve_frontdoor_http_responses_total counter\n";
  for (const auto& [code, n] : http_responses)
    out += fmt::format("exaserve_frontdoor_http_responses_total{{code=\"{}\"}} {}\n", code, n);
  out += "# HELP exaserve_frontdoor_connections Open client connections.\n";
  out += "# TYPE exaserve_frontdoor_connections gauge\n";
  out += fmt::format("exaserve_frontdoor_connections{{protocol=\"http\"}} {}\n", http_connections);
  out += fmt::format("exaserve_frontdoor_connections{{protocol=\"rpc\"}} {}\n", rpc_connections);
  out += "# HELP exaserve_frontdoor_connections_refused_total Connections closed at once: over max_connections.\n";
  out += "# TYPE exaserve_frontdoor_connections_refused_total counter\n";
  out += fmt::format("exaserve_frontdoor_connections_refused_total {}\n", connections_refused);
  out += "# HELP exaserve_frontdoor_generate_in_flight Generate requests being served.\n";
  out += "# TYPE exaserve_frontdoor_generate_in_flight gauge\n";
  out += fmt::format("exaserve_frontdoor_generate_in_flight {}\n", generate_in_flight);
  out += "# HELP exaserve_frontdoor_backend_cancels_total Backend requests cancelled by the front door: client gone or fallen behind, or shutdown.\n";
  out += "# TYPE exaserve_frontdoor_backend_cancels_total counter\n";
  out += fmt::format("exaserve_frontdoor_backend_cancels_total {}\n", backend_cancels);
  out += "# HELP exaserve_frontdoor_tenant_refusals_total Requests refused by their tenant's limits (keys file).\n";
  out += "# TYPE exaserve_frontdoor_tenant_refusals_total counter\n";
  out += fmt::format("exaserve_frontdoor_tenant_refusals_total {}\n", tenant_refusals);
  out += "# HELP exaserve_frontdoor_tls_handshake_failures_total Connections closed because their TLS handshake failed.\n";
  out += "# TYPE exaserve_frontdoor_tls_handshake_failures_total counter\n";
  out += fmt::format("exaserve_frontdoor_tls_handshake_failures_total {}\n", tls_handshake_failures);
  return out;
}

generate_call::generate_call(std::shared_ptr<door_context> ctx, std::string id)
    : ctx_(std::move(ctx)),
      id_(std::move(id)),
      channel_(std::make_shared<request_channel>(ctx_->config.stream_buffer_chunks_max)),
      overflow_(channel_->when_overflowed().fork()),
      overflow_watch_(overflow_.addBranch().then([this] { cancel_backend("client_fell_behind"); }).eagerlyEvaluate(nullptr)) {
  ++ctx_->counters.generate_in_flight;
}

kj::Own<generate_call> generate_call::start(std::shared_ptr<door_context> ctx, api::generate_request request) {
  auto call = kj::heap<generate_call>(ctx, ctx->ids.next());
  request.request_id = call->id_;
  // The backend may call the sink synchronously from inside generate(); the
  // channel just queues it until the loop asks.
  ctx->backend->generate(std::move(request), std::make_shared<channel_sink>(call->channel_));
  return call;
}

void generate_call::end(std::uint64_t tokens) {
  if (!on_end_) return;
  auto fn = std::move(on_end_);
  on_end_ = nullptr;
  fn(tokens);
}

generate_call::~generate_call() {
  end(tokens_seen_);
  // Close first: a backend that answers cancel() synchronously (on this very
  // thread) then finds the channel closed instead of re-entering us.
  channel_->close();
  --ctx_->counters.generate_in_flight;
  cancel_backend(ctx_->stopping ? "shutdown" : "client_gone");
}

void generate_call::cancel_backend(const char* reason) {
  if (backend_finished_ || cancel_sent_) return;
  cancel_sent_ = true;
  ++ctx_->counters.backend_cancels;
  spdlog::info("event=request_cancel request_id={} reason={}", id_, reason);
  ctx_->backend->cancel(id_);
}

kj::Promise<request_channel::batch> generate_call::next() {
  return channel_->when_ready().then([this]() {
    auto b = channel_->take();
    if (b.backend_finished) backend_finished_ = true;
    for (const auto& ch : b.chunks) tokens_seen_ += ch.tokens.size();
    if (b.done) {
      const std::uint64_t used = std::uint64_t{b.done->usage.prompt_tokens} + b.done->usage.completion_tokens;
      end(used > 0 ? used : tokens_seen_);
    }
    return b;
  });
}

namespace {
std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

std::expected<kj::Own<generate_call>, auth::limit_refusal> start_limited(std::shared_ptr<door_context> ctx,
                                                                         api::generate_request request,
                                                                         const std::string& tenant) {
  if (!ctx->config.keys || tenant.empty()) return generate_call::start(std::move(ctx), std::move(request));
  const auth::tenant_limits limits = ctx->config.keys->current()->limits_for(tenant);
  request.tenant_weight = limits.weight;
  if (limits == auth::tenant_limits{}) return generate_call::start(std::move(ctx), std::move(request));
  auto admitted = ctx->limiter.admit(tenant, limits, steady_ns(), request.max_tokens);
  if (!admitted) {
    ++ctx->counters.tenant_refusals;
    spdlog::info("event=tenant_limited tenant={} limit={} retry_after_ms={}", tenant, admitted.error().limit,
                 admitted.error().retry_after_ms);
    return std::unexpected(admitted.error());
  }
  auto call = generate_call::start(ctx, std::move(request));
  call->on_end([ctx, a = *admitted](std::uint64_t tokens) { ctx->limiter.finish(a, tokens, steady_ns()); });
  return call;
}

}  // namespace exa::door
