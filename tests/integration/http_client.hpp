#pragma once
// A minimal blocking HTTP/1.1 client over raw sockets, so tests see exactly
// what goes over the wire (status line, headers, chunked framing, SSE events)
// and can misbehave on purpose (disconnect mid-stream, send garbage). Every
// read has a deadline; failures throw std::runtime_error, which Catch2
// reports as a failed test.

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace exa::test {

using namespace std::chrono_literals;

inline constexpr auto io_timeout = 20s;  // generous: only a hung server hits it

struct http_response {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;                            // de-chunked
  bool chunked = false;

  std::string header(const std::string& lower_name) const;
};

class http_connection {
 public:
  /// Connects to 127.0.0.1:port.
  explicit http_connection(std::uint16_t port);
  ~http_connection();
  http_connection(const http_connection&) = delete;
  http_connection& operator=(const http_connection&) = delete;

  void send(std::string_view bytes);
  /// Sends a request; `body` non-empty adds Content-Type: application/json.
  void send_request(std::string_view method, std::string_view path, std::string_view body = {},
                    std::string_view extra_headers = {});
  /// Reads one complete response.
  http_response read_response(std::chrono::milliseconds timeout = io_timeout);
  /// Reads until `needle` has arrived; returns all bytes read so far.
  std::string read_until(std::string_view needle, std::chrono::milliseconds timeout = io_timeout);
  /// Waits for the server to close the connection; true if it did.
  bool wait_closed(std::chrono::milliseconds timeout = io_timeout);
  void close();

 private:
  bool fill(std::chrono::steady_clock::time_point deadline);  // false on EOF
  std::string take_line(std::chrono::steady_clock::time_point deadline);
  std::string take(std::size_t n, std::chrono::steady_clock::time_point deadline);

  int fd_ = -1;
  std::string buffer_;
};

/// One request on a fresh connection.
http_response http_request(std::uint16_t port, std::string_view method, std::string_view path,
                           std::string_view body = {}, std::string_view extra_headers = {});

/// The payloads of "data: ..." events of a server-sent-event body, in order.
std::vector<std::string> sse_events(std::string_view body);

}  // namespace exa::test
