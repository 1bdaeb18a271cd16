#pragma once
// A small blocking HTTP/1.1 client for the chaos workload: POSTs a JSON body
// to 127.0.0.1 and hands each server-sent event to a callback as it arrives
// (chunked or length-delimited bodies). One request per connection.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "common/error.hpp"

namespace exa::chaos {

struct http_result {
  int status = 0;
  std::string body;  // non-SSE responses (errors)
};

/// Sends the request; calls on_event(data) for every "data: ..." event of an
/// event-stream response. Errors: io_error (connect, read, timeout).
expected<http_result> post_sse(std::uint16_t port, std::string_view path, std::string_view json_body,
                               const std::function<void(std::string_view)>& on_event,
                               std::chrono::milliseconds timeout);

}  // namespace exa::chaos
