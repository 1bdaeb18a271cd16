#include "door_context.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

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

generate_call::~generate_call() {
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
    return b;
  });
}

}  // namespace exa::door
