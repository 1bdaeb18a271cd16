#pragma once
// The status port of a process that has no front door (controller, node,
// metrics aggregator): plain HTTP GET /metrics, /healthz and /readyz on one
// thread running a KJ event loop; and, on the same loop, a bounded HTTP GET
// client for aggregators that scrape the processes below them.
//
// KJ-free header, as frontdoor.hpp.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace exa {

struct status_handlers {
  /// The Prometheus text served on /metrics. Called on the door's thread;
  /// must be safe to call from it (registry snapshots are).
  std::function<std::string()> metrics;
  /// Readiness for /readyz: an error (its message is the body, status 503)
  /// while the process cannot do its job yet. Empty: always ready.
  std::function<expected<void>()> ready;
};

class status_door {
 public:
  /// Binds HOST:PORT (0: an ephemeral port) and serves. unavailable, naming
  /// the address, when it cannot bind.
  static expected<std::unique_ptr<status_door>> start(const std::string& host, std::uint16_t port,
                                                      status_handlers handlers);
  status_door(const status_door&) = delete;
  status_door& operator=(const status_door&) = delete;
  ~status_door();

  std::uint16_t port() const;
  /// "http://host:port".
  std::string url() const;

  /// GETs every URL ("http://host:port/path"; https is unsupported here) at
  /// once on the door's loop, each bounded by `timeout_ms` and by
  /// `max_bytes` of body, and returns their bodies in order: an error per
  /// URL that failed (unavailable: connect or read failed, naming the URL;
  /// deadline_exceeded; invalid_argument: a non-200 status or a bad URL).
  /// Blocks the calling thread, which must not be the door's own.
  std::vector<expected<std::string>> fetch(const std::vector<std::string>& urls, std::uint32_t timeout_ms,
                                           std::size_t max_bytes = 64u << 20);

  /// Closes the listener and joins the thread. Idempotent.
  void stop();

  struct impl;

 private:
  explicit status_door(std::unique_ptr<impl> impl);
  std::unique_ptr<impl> impl_;
};

}  // namespace exa
