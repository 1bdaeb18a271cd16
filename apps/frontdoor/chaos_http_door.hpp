#pragma once
// The real front door as the chaos driver's HTTP door: a real-time chaos
// run sends its workload through it (chaos/ itself does not link the front
// door).

#include <memory>

#include "chaos/driver.hpp"
#include "frontdoor.hpp"

namespace exa {

/// Starts the front door on an ephemeral port of 127.0.0.1 (HTTP only).
inline chaos::http_door_factory chaos_http_door() {
  struct door final : chaos::http_door {
    std::unique_ptr<frontdoor> impl;
    std::uint16_t http_port() const override { return impl->http_port(); }
    void stop() override { impl->stop(); }
  };
  return [](std::shared_ptr<api::gateway_backend> backend) -> expected<std::unique_ptr<chaos::http_door>> {
    frontdoor_config fc;
    fc.http_port = 0;
    fc.rpc_port = 0;
    auto started = frontdoor::start(fc, std::move(backend));
    if (!started) return std::unexpected(started.error());
    auto d = std::make_unique<door>();
    d->impl = std::move(*started);
    return d;
  };
}

}  // namespace exa
