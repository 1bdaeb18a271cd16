#pragma once
// What the serving commands share (serve, gateway): loading the serve config
// from a file and flags, waiting for readiness, draining before a stop.

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "api/gateway.hpp"
#include "serve_config.hpp"

namespace exa::app {

class args;

// Asks the backend something and waits for the callback (off the loop).
template <class T, class Call>
std::optional<T> ask(Call call, std::chrono::milliseconds timeout) {
  auto state = std::make_shared<std::pair<std::mutex, std::optional<T>>>();
  auto cv = std::make_shared<std::condition_variable>();
  call([state, cv](T v) {
    std::lock_guard lock(state->first);
    state->second = std::move(v);
    cv->notify_all();
  });
  std::unique_lock lock(state->first);
  cv->wait_for(lock, timeout, [&] { return state->second.has_value(); });
  return state->second;
}

/// The default config, then --config FILE, then the flags; fills in the
/// default model where a deployment names no file.
expected<serve_config> load_serve_config(const args& a);

/// Polls readiness until it holds or `limit` passes.
bool wait_ready(api::gateway_backend& backend, std::chrono::seconds limit);

/// Lets requests in flight finish, up to a grace period.
void drain(api::gateway_backend& backend, std::chrono::seconds grace);

}  // namespace exa::app
