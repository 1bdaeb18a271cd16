#pragma once
// The one place where an exa::errc becomes an HTTP status, an OpenAI error
// type, or a KJ exception type for RPC. Everything the front doors send to a
// client about an error goes through here.

#include <kj/exception.h>

#include <string_view>

#include "common/error.hpp"

namespace exa::door {

struct http_error_class {
  unsigned status = 500;
  std::string_view reason;       // HTTP reason phrase
  std::string_view openai_type;  // OpenAI error object "type"
};

/// invalid_argument/unsupported -> 400, not_found -> 404, overloaded -> 429
/// (sent with Retry-After), unavailable/out_of_memory/stale_epoch -> 503,
/// deadline_exceeded -> 504, cancelled -> 499 (client closed request),
/// everything else -> 500.
http_error_class classify_http(errc code) noexcept;

/// What a client should wait before retrying an overloaded request.
inline constexpr unsigned retry_after_s = 1;

/// Reason phrase of every status the front door sends, the HTTP-only ones
/// (405, 408, 413 ...) included; "Error" for any other.
std::string_view http_reason(unsigned status) noexcept;

/// The phrase of KJ's HTTP layer in `description` that says the client's
/// framing is malformed (a bad Content-Length, chunk size or transfer
/// encoding, an invalid header), or empty when it says no such thing: such
/// an exception is the client's 400, not the server's 500.
std::string_view client_framing_error(std::string_view description) noexcept;

/// overloaded -> OVERLOADED (retry later), unsupported -> UNIMPLEMENTED,
/// everything else -> FAILED; the description is "<code>: <message>".
kj::Exception::Type rpc_exception_type(errc code) noexcept;
kj::Exception to_rpc_exception(const error& e);

}  // namespace exa::door
