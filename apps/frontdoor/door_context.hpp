#pragma once
// State shared by the HTTP and RPC front doors on the loop thread: the
// config, the backend, the timer, request ids, counters for /metrics, and the
// object that owns one generate request while it runs.

#include <kj/async.h>
#include <kj/timer.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <functional>
#include <memory>
#include <random>
#include <string>

#include "api/gateway.hpp"
#include "cross_thread.hpp"
#include "auth/tenant_limits.hpp"
#include "frontdoor.hpp"

namespace exa::door {

/// Process-unique request ids: "req-<counter>-<random hex>". The counter makes
/// them unique within the process (even across several front doors); the
/// random part keeps ids of different processes from looking alike in
/// merged logs.
class request_ids {
 public:
  request_ids();
  std::string next();

 private:
  std::mt19937_64 rng_;
};

/// Loop-thread-only counters, exposed on /metrics next to the backend's.
struct door_counters {
  std::map<unsigned, std::uint64_t> http_responses;  // by status code
  std::int64_t http_connections = 0;
  std::int64_t rpc_connections = 0;
  std::int64_t generate_in_flight = 0;  // HTTP and RPC together
  std::int64_t rpc_generate_in_flight = 0;
  std::uint64_t connections_refused = 0;  // over max_connections
  std::uint64_t backend_cancels = 0;
  std::uint64_t tenant_refusals = 0;  // requests a tenant's limits refused
  std::uint64_t tls_handshake_failures = 0;

  /// Prometheus text of the counters above.
  std::string render() const;
};

struct door_context {
  door_context(frontdoor_config c, std::shared_ptr<api::gateway_backend> b, kj::Timer& t)
      : config(std::move(c)), backend(std::move(b)), timer(t), limiter(config.quotas) {}

  frontdoor_config config;
  std::shared_ptr<api::gateway_backend> backend;
  kj::Timer& timer;
  request_ids ids;
  door_counters counters;
  bool stopping = false;  // set before teardown, so cancels are logged as such
  auth::shared_tenant_limiter limiter;  // per-tenant limits (keys file), front-door thread only
};

/// One generate request in flight, owned by the HTTP or RPC handler that
/// serves it. Destroying it (the handler finished, or its promise was dropped
/// because the client vanished or the front door stops) closes the channel
/// and, unless the backend already finished the request, cancels it there.
class generate_call {
 public:
  /// Assigns a request id and starts the request on the backend.
  static kj::Own<generate_call> start(std::shared_ptr<door_context> ctx, api::generate_request request);

  explicit generate_call(std::shared_ptr<door_context> ctx, std::string id);
  generate_call(const generate_call&) = delete;
  generate_call& operator=(const generate_call&) = delete;
  ~generate_call();

  const std::string& id() const noexcept { return id_; }
  /// Called once when the request ends (finished, failed, or dropped), with
  /// the tokens it used: the result's prompt + completion, or the tokens
  /// streamed so far when it never finished.
  void on_end(std::function<void(std::uint64_t tokens)> fn) { on_end_ = std::move(fn); }
  /// The next events; resolves as soon as at least one is pending. Must not
  /// be called again after a batch with `done`. A batch whose done is not
  /// `backend_finished` means the client fell behind (see request_channel).
  kj::Promise<request_channel::batch> next();
  /// Resolves when the client fell too far behind; the backend request is
  /// already cancelled then. Consumers stuck in a write use it to give up.
  kj::Promise<void> when_overflowed() { return overflow_.addBranch(); }

 private:
  void cancel_backend(const char* reason);

  std::shared_ptr<door_context> ctx_;
  std::string id_;
  std::shared_ptr<request_channel> channel_;
  bool backend_finished_ = false;
  bool cancel_sent_ = false;
  std::uint64_t tokens_seen_ = 0;
  std::function<void(std::uint64_t)> on_end_;
  void end(std::uint64_t tokens);
  kj::ForkedPromise<void> overflow_;
  kj::Promise<void> overflow_watch_;  // last: destroyed first, it points at this
};

/// Starts a generate call under the limits of `tenant` (its API key's; ""
/// or no keys file: none). A refusal names the limit -- overloaded with a
/// retry time, or invalid_argument for max_tokens -- and the request never
/// reaches the backend; an admitted one is settled when the call ends.
std::expected<kj::Own<generate_call>, auth::limit_refusal> start_limited(std::shared_ptr<door_context> ctx,
                                                                         api::generate_request request,
                                                                         const std::string& tenant);

/// Resolves to the promise's value, or to a deadline_exceeded error naming
/// `what` after `timeout_ms`, or to an internal error if the backend dropped
/// its callback without calling it.
template <class T>
kj::Promise<expected<T>> with_deadline(kj::Timer& timer, std::uint32_t timeout_ms, kj::Promise<expected<T>> p,
                                       std::string what) {
  auto on_drop = [what](kj::Exception&&) -> expected<T> {
    return make_error(errc::internal, "backend dropped its reply to " + what);
  };
  auto on_timeout = [timeout_ms, what]() -> expected<T> {
    return make_error(errc::deadline_exceeded,
                      "backend did not answer " + what + " within " + std::to_string(timeout_ms) + " ms");
  };
  return p.catch_(kj::mv(on_drop))
      .exclusiveJoin(timer.afterDelay(timeout_ms * kj::MILLISECONDS).then(kj::mv(on_timeout)));
}

}  // namespace exa::door
