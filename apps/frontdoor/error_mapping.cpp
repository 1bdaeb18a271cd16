#include "error_mapping.hpp"

#include <kj/string.h>

#include <string>

namespace exa::door {

http_error_class classify_http(errc code) noexcept {
  switch (code) {
    case errc::invalid_argument:
    case errc::unsupported:
      return {400, "Bad Request", "invalid_request_error"};
    case errc::not_found:
      return {404, "Not Found", "not_found_error"};
    case errc::overloaded:
      return {429, "Too Many Requests", "overloaded_error"};
    case errc::unavailable:
    case errc::out_of_memory:
    case errc::stale_epoch:
      return {503, "Service Unavailable", "service_unavailable_error"};
    case errc::deadline_exceeded:
      return {504, "Gateway Timeout", "timeout_error"};
    case errc::cancelled:
      return {499, "Client Closed Request", "cancelled_error"};
    case errc::unauthenticated:
      return {401, "Unauthorized", "invalid_request_error"};
    case errc::permission_denied:
      return {403, "Forbidden", "permission_error"};
    case errc::corrupt_data:
    case errc::io_error:
    case errc::internal:
      return {500, "Internal Server Error", "server_error"};
  }
  return {500, "Internal Server Error", "server_error"};
}

std::string_view http_reason(unsigned status) noexcept {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Error";
  }
}

kj::Exception::Type rpc_exception_type(errc code) noexcept {
  switch (code) {
    case errc::overloaded: return kj::Exception::Type::OVERLOADED;
    case errc::unsupported: return kj::Exception::Type::UNIMPLEMENTED;
    default: return kj::Exception::Type::FAILED;
  }
}

kj::Exception to_rpc_exception(const error& e) {
  const std::string description = to_string(e);  // "<code>: <message>"
  return kj::Exception(rpc_exception_type(e.code), __FILE__, __LINE__, kj::heapString(description.c_str()));
}

std::string_view client_framing_error(std::string_view description) noexcept {
  // KJ 0.9's own messages (kj/compat/http.c++) for what a client sent.
  static constexpr std::string_view phrases[] = {
      "invalid Content-Length header value",
      "invalid HTTP chunk size",
      "unknown transfer encoding",
      "request body cannot have Transfer-Encoding other than chunked",
      "invalid header name",
      "invalid header value",
      "request headers too large",
  };
  for (const auto p : phrases)
    if (description.find(p) != std::string_view::npos) return p;
  return {};
}

}  // namespace exa::door
