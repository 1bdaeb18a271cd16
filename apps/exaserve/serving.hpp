#pragma once
// What the serving commands share (serve, gateway): loading the serve config
// from a file and flags, waiting for readiness, draining before a stop.

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include <csignal>

#include "api/gateway.hpp"
#include "args.hpp"
#include "auth/api_keys.hpp"
#include "serve_config.hpp"

namespace exa::app {


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

/// --keys-file and --no-auth, for the commands that run front doors
/// (functions: flag tables of other files are built during static
/// initialization, in no fixed order).
flag_spec keys_file_flag();
flag_spec no_auth_flag();
/// --door-tls-cert/--door-tls-key/--door-tls-client-ca: HTTPS and RPC over
/// TLS at the front doors ("door": a gateway's --tls-* already mean the
/// cluster's own mutual TLS).
std::vector<flag_spec> door_tls_flags();
/// Fills the front door's TLS files from those flags; both or neither of
/// cert and key, and a client CA only with them.
expected<void> door_tls_from_flags(const args& a, frontdoor_config& door);

/// The front door's keys from --keys-file (null with --no-auth or neither:
/// open). Says in the log which it is. Errors: both flags, or a keys file
/// that cannot be read or parsed.
expected<std::shared_ptr<auth::key_store>> keys_from_flags(const args& a);

/// Blocks SIGINT and SIGTERM in the calling thread and every thread it
/// starts afterwards (call it first), so only sigwait/sigtimedwait on the
/// returned set sees them.
sigset_t block_stop_signals();
/// Adds SIGHUP to a set of blocked stop signals (block before any thread
/// starts); wait_for_stop then reloads the keys on SIGHUP and waits on.
void block_reload_signal(sigset_t& s);
/// Waits for SIGINT or SIGTERM and returns it; a SIGHUP in between re-reads
/// `keys` (if any) and the door's TLS files (if it has TLS): a broken file
/// keeps what was loaded, and says why.
int wait_for_stop_signal(sigset_t& s, auth::key_store* keys, frontdoor* door = nullptr);

/// Polls readiness until it holds or `limit` passes.
bool wait_ready(api::gateway_backend& backend, std::chrono::seconds limit);

/// Lets requests in flight finish, up to a grace period.
void drain(api::gateway_backend& backend, std::chrono::seconds grace);

}  // namespace exa::app
