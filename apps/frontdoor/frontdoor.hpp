#pragma once
// The front doors of an ExaServe process: an OpenAI-compatible HTTP API and
// the Cap'n Proto RPC API (schemas/exaserve.capnp), served by one thread that
// runs a KJ event loop. Both turn client requests into calls on an
// api::gateway_backend and the backend's callbacks (from any thread) into
// responses.
//
// This header stays free of KJ and Cap'n Proto so that apps can include it
// cheaply; everything framework-specific lives in the .cpp files.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "api/gateway.hpp"
#include "auth/api_keys.hpp"
#include "auth/quota_board.hpp"
#include "common/error.hpp"

namespace exa {

struct frontdoor_config {
  std::string host = "127.0.0.1";
  std::uint16_t http_port = 8000;  // 0: an ephemeral port (see frontdoor::http_port())
  std::uint16_t rpc_port = 7000;   // 0: an ephemeral port (see frontdoor::rpc_port())
  /// Largest HTTP request body; a larger one gets 413.
  std::size_t max_body_bytes = 1 << 20;
  /// A client must send a request's complete headers within this time
  /// (slowloris protection); otherwise the connection is closed.
  std::uint32_t header_timeout_ms = 10000;
  /// ... and its body within this time after the headers (else 408), so a
  /// body trickled byte by byte cannot hold a connection forever either.
  std::uint32_t body_timeout_ms = 30000;
  /// Open connections allowed per protocol (HTTP and RPC counted apart);
  /// beyond it HTTP clients get 429 and RPC connections are closed.
  std::uint32_t max_connections = 1024;
  /// Chunks produced by the backend but not yet taken by a slow client that
  /// one request may buffer; beyond it the request is cancelled with an
  /// `overloaded` error rather than growing memory without bound.
  std::size_t stream_buffer_chunks_max = 1024;
  /// Backend calls other than generate (models, status, metrics, admin) that
  /// do not answer within this time fail with deadline_exceeded.
  std::uint32_t backend_call_timeout_ms = 30000;
  api::request_limits limits;
  /// API keys the /v1 endpoints require (Authorization: Bearer KEY); null:
  /// open, anyone who reaches the port may call them. Health, readiness and
  /// metrics stay open either way.
  std::shared_ptr<auth::key_store> keys;
  /// Tenant limits shared with other gateways: admission uses this
  /// gateway's share of each limit from the board its router keeps up to
  /// date (auth/quota_board.hpp). Null: whole limits, enforced here alone.
  std::shared_ptr<auth::quota_board> quotas;
  /// HTTPS and RPC over TLS (PEM files; both or neither). With a client CA,
  /// clients must also present a certificate it signed.
  std::string tls_cert, tls_key, tls_client_ca;
  bool tls() const noexcept { return !tls_cert.empty(); }
};

/// The metric families a front door exports on /metrics beside its
/// backend's (exaserve_frontdoor_*), as "name type" pairs.
std::vector<std::pair<std::string, std::string>> frontdoor_metric_families();

/// Owns the front-door thread. Thread-safe to stop from any thread but the
/// front door's own.
class frontdoor {
 public:
  /// Binds both ports and starts serving. Errors: unavailable (naming
  /// host:port) when a port cannot be bound, invalid_argument for a bad
  /// config.
  static expected<std::unique_ptr<frontdoor>> start(frontdoor_config config,
                                                     std::shared_ptr<api::gateway_backend> backend);

  frontdoor(const frontdoor&) = delete;
  frontdoor& operator=(const frontdoor&) = delete;
  ~frontdoor();

  /// The ports actually bound (the ephemeral ones when 0 was asked for).
  std::uint16_t http_port() const;
  std::uint16_t rpc_port() const;
  /// "http://host:port", for clients and logs.
  std::string http_url() const;

  /// Closes the listeners only: new connections are refused while the open
  /// ones (and their streams) finish. For draining before stop(). Idempotent.
  void stop_accepting();
  /// Re-reads the TLS certificate, key and client CA (SIGHUP) from any
  /// thread but the door's own: new connections use them, open ones keep
  /// theirs. On error (a file missing or malformed) the old ones stay.
  expected<void> reload_tls();
  bool tls_enabled() const;

  /// Closes the listeners and every connection, cancels in-flight requests
  /// through backend.cancel(), and joins the thread. Idempotent.
  void stop();

  struct impl;

 private:
  explicit frontdoor(std::unique_ptr<impl> impl);
  std::unique_ptr<impl> impl_;
};

}  // namespace exa
