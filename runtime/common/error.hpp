#pragma once
// One error vocabulary for all of ExaServe. Every code says what the caller
// should do about it; front doors map codes to HTTP statuses, OpenAI error
// objects and RPC exceptions in exactly one place each.

#include <expected>
#include <string>
#include <string_view>
#include <utility>

namespace exa {

enum class errc {
  /// The caller sent something malformed or out of range; do not retry as is.
  invalid_argument,
  /// The named thing (model, deployment, request, tensor, key) does not exist.
  not_found,
  /// Too much work queued; retry later, not at once.
  overloaded,
  /// No capacity can serve this right now (no ready replica, device lost).
  unavailable,
  /// A message carried an epoch older than the current one for its slot.
  stale_epoch,
  /// A file or message is structurally broken (bad magic, truncated, hostile sizes).
  corrupt_data,
  /// Well-formed input asking for something not supported (yet).
  unsupported,
  /// A fixed-size resource (memory pool, KV blocks) cannot satisfy the request.
  out_of_memory,
  /// The request was cancelled by its client.
  cancelled,
  /// The request's deadline passed before it finished.
  deadline_exceeded,
  /// An operating-system call failed (open, mmap, read).
  io_error,
  /// A bug in ExaServe; report it.
  internal,
  /// No valid credentials came with the call (a missing or unknown API key).
  unauthenticated,
  /// Valid credentials that do not allow this call (an admin call without an admin key).
  permission_denied,
};

/// Stable lower-case name of a code, used in logs and error objects.
std::string_view to_string(errc code) noexcept;

/// An error value: a code a caller can act on plus a message naming the problem.
struct error {
  errc code = errc::internal;
  std::string message;

  friend bool operator==(const error&, const error&) = default;
};

template <class T>
using expected = std::expected<T, error>;

/// Builds the unexpected branch of an `expected<T>` in one expression.
inline std::unexpected<error> make_error(errc code, std::string message) {
  return std::unexpected<error>(error{code, std::move(message)});
}

/// Renders an error as "code: message".
std::string to_string(const error& e);

}  // namespace exa
