#include "common/error.hpp"

namespace exa {

std::string_view to_string(errc code) noexcept {
  switch (code) {
    case errc::invalid_argument: return "invalid_argument";
    case errc::not_found: return "not_found";
    case errc::overloaded: return "overloaded";
    case errc::unavailable: return "unavailable";
    case errc::stale_epoch: return "stale_epoch";
    case errc::corrupt_data: return "corrupt_data";
    case errc::unsupported: return "unsupported";
    case errc::out_of_memory: return "out_of_memory";
    case errc::cancelled: return "cancelled";
    case errc::deadline_exceeded: return "deadline_exceeded";
    case errc::io_error: return "io_error";
    case errc::internal: return "internal";
    case errc::unauthenticated: return "unauthenticated";
    case errc::permission_denied: return "permission_denied";
  }
  return "unknown";
}

std::string to_string(const error& e) {
  std::string out{to_string(e.code)};
  out += ": ";
  out += e.message;
  return out;
}

}  // namespace exa
