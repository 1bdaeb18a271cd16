#include "chaos/sse_client.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

namespace exa::chaos {
namespace {

class connection {
 public:
  connection() : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {}
  ~connection() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

using clock_type = std::chrono::steady_clock;

// Reads more bytes into `buf`; false on EOF, error or timeout.
bool fill(int fd, std::string& buf, clock_type::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now()).count();
  if (left <= 0) return false;
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(left)) <= 0) return false;
  char tmp[16384];
  const ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
  if (n <= 0) return false;
  buf.append(tmp, static_cast<std::size_t>(n));
  return true;
}

// Splits complete SSE events off the front of `text`.
void drain_events(std::string& text, const std::function<void(std::string_view)>& on_event) {
  for (std::size_t end; (end = text.find("\n\n")) != std::string::npos;) {
    std::string_view ev(text.data(), end);
    if (ev.rfind("data: ", 0) == 0) on_event(ev.substr(6));
    text.erase(0, end + 2);
  }
}

}  // namespace

expected<http_result> post_sse(std::uint16_t port, std::string_view path, std::string_view json_body,
                               const std::function<void(std::string_view)>& on_event,
                               std::chrono::milliseconds timeout) {
  const auto deadline = clock_type::now() + timeout;
  connection c;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (c.fd() < 0 || ::connect(c.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    return make_error(errc::io_error, std::string("connect: ") + std::strerror(errno));
  std::string req = "POST " + std::string(path) + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
                    "Content-Length: " + std::to_string(json_body.size()) + "\r\nConnection: close\r\n\r\n";
  req += json_body;
  if (::send(c.fd(), req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size()))
    return make_error(errc::io_error, "send failed");
  std::string buf;
  std::size_t header_end;
  while ((header_end = buf.find("\r\n\r\n")) == std::string::npos)
    if (!fill(c.fd(), buf, deadline)) return make_error(errc::io_error, "no response headers");
  http_result r;
  r.status = std::atoi(buf.c_str() + buf.find(' ') + 1);
  const std::string head = buf.substr(0, header_end);
  buf.erase(0, header_end + 4);
  const bool chunked = head.find("chunked") != std::string::npos || head.find("Chunked") != std::string::npos;
  // A length-delimited body ends at its length, whether or not the server
  // closes the connection.
  std::optional<std::size_t> length;
  for (const char* name : {"Content-Length: ", "content-length: "})
    if (const auto p = head.find(name); p != std::string::npos) length = std::stoul(head.substr(p + std::strlen(name)));
  if (!chunked && length) {
    while (buf.size() < *length)
      if (!fill(c.fd(), buf, deadline)) return make_error(errc::io_error, "response body cut short");
    r.body = buf.substr(0, *length);
    std::string events = r.body;
    drain_events(events, on_event);
    return r;
  }
  std::string text;  // the de-chunked body not yet split into events
  bool eof = false;
  while (!eof) {
    if (chunked) {
      const auto line_end = buf.find("\r\n");
      if (line_end != std::string::npos) {
        const std::size_t size = std::stoul(buf.substr(0, line_end), nullptr, 16);
        if (size == 0) break;
        if (buf.size() >= line_end + 2 + size + 2) {
          text += buf.substr(line_end + 2, size);
          buf.erase(0, line_end + 2 + size + 2);
          drain_events(text, on_event);
          continue;
        }
      }
    } else {
      text += buf;
      buf.clear();
      drain_events(text, on_event);
    }
    eof = !fill(c.fd(), buf, deadline);
  }
  r.body = std::move(text);
  return r;
}

}  // namespace exa::chaos
