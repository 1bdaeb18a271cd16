#include "http_client.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace exa::test {

namespace {
std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}
}  // namespace

std::string http_response::header(const std::string& lower_name) const {
  auto it = headers.find(lower_name);
  return it == headers.end() ? std::string() : it->second;
}

http_connection::http_connection(std::uint16_t port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw std::runtime_error("socket(): " + std::string(std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd_);
    fd_ = -1;
    throw std::runtime_error("connect to port " + std::to_string(port) + ": " + why);
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

http_connection::~http_connection() { close(); }

void http_connection::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void http_connection::send(std::string_view bytes) {
  while (!bytes.empty()) {
    const auto n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("send(): " + std::string(std::strerror(errno)));
    }
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
}

void http_connection::send_request(std::string_view method, std::string_view path, std::string_view body,
                                   std::string_view extra_headers) {
  std::string req = std::string(method) + " " + std::string(path) + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  if (!body.empty() || method == "POST") {
    req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  req += extra_headers;
  req += "\r\n";
  req += body;
  send(req);
}

bool http_connection::fill(std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) throw std::runtime_error("timed out waiting for the server");
    pollfd p{fd_, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;  // the deadline check above ends it
    char buf[16384];
    const auto n = ::recv(fd_, buf, sizeof buf, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == ECONNRESET) return false;
      throw std::runtime_error("recv(): " + std::string(std::strerror(errno)));
    }
    if (n == 0) return false;
    buffer_.append(buf, static_cast<std::size_t>(n));
    return true;
  }
}

std::string http_connection::take_line(std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    if (auto pos = buffer_.find("\r\n"); pos != std::string::npos) {
      std::string line = buffer_.substr(0, pos);
      buffer_.erase(0, pos + 2);
      return line;
    }
    if (!fill(deadline)) throw std::runtime_error("connection closed in the middle of a line");
  }
}

std::string http_connection::take(std::size_t n, std::chrono::steady_clock::time_point deadline) {
  while (buffer_.size() < n)
    if (!fill(deadline)) throw std::runtime_error("connection closed in the middle of a body");
  std::string out = buffer_.substr(0, n);
  buffer_.erase(0, n);
  return out;
}

http_response http_connection::read_response(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  http_response r;
  const std::string status_line = take_line(deadline);
  if (status_line.rfind("HTTP/1.1 ", 0) != 0) throw std::runtime_error("bad status line: " + status_line);
  r.status = std::stoi(status_line.substr(9, 3));
  for (std::string line = take_line(deadline); !line.empty(); line = take_line(deadline)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) throw std::runtime_error("bad header line: " + line);
    std::string value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(' '));
    r.headers[lower(line.substr(0, colon))] = value;
  }
  if (lower(r.header("transfer-encoding")) == "chunked") {
    r.chunked = true;
    for (;;) {
      const std::size_t size = std::stoul(take_line(deadline), nullptr, 16);
      if (size == 0) {
        take_line(deadline);  // the blank line after the last chunk
        break;
      }
      r.body += take(size, deadline);
      take_line(deadline);
    }
  } else if (!r.header("content-length").empty()) {
    r.body = take(std::stoul(r.header("content-length")), deadline);
  }
  return r;
}

std::string http_connection::read_until(std::string_view needle, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (buffer_.find(needle) == std::string::npos)
    if (!fill(deadline)) throw std::runtime_error("connection closed before '" + std::string(needle) + "'");
  return buffer_;
}

bool http_connection::wait_closed(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  try {
    while (fill(deadline)) {
    }
    return true;
  } catch (const std::runtime_error&) {
    return false;
  }
}

http_response http_request(std::uint16_t port, std::string_view method, std::string_view path, std::string_view body,
                           std::string_view extra_headers) {
  http_connection c(port);
  c.send_request(method, path, body, extra_headers);
  return c.read_response();
}

std::vector<std::string> sse_events(std::string_view body) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos < body.size()) {
    const auto end = body.find("\n\n", pos);
    if (end == std::string_view::npos) throw std::runtime_error("SSE event not terminated by a blank line");
    std::string_view event = body.substr(pos, end - pos);
    if (event.rfind("data: ", 0) != 0) throw std::runtime_error("SSE event without 'data: ': " + std::string(event));
    out.emplace_back(event.substr(6));
    pos = end + 2;
  }
  return out;
}

}  // namespace exa::test
