#pragma once
// Per-tenant limits at a front door: requests per second and tokens per
// minute (token buckets), requests in flight, and tokens per request.
// Pure logic, driven by the caller's clock; one instance per front door.
// Gateways of a cluster share each limit: quota_board.hpp hands this one
// its part of the whole limits.

#include <cstdint>
#include <expected>
#include <map>
#include <string>

#include "common/error.hpp"

namespace exa::auth {

struct tenant_limits {
  double requests_per_s = 0;       // 0: unlimited (burst: one second's worth, at least 1)
  double tokens_per_min = 0;       // prompt + generated tokens; 0: unlimited (burst: one minute's worth)
  std::uint32_t max_concurrent = 0;  // requests in flight; 0: unlimited
  std::uint32_t max_tokens = 0;      // max_tokens of one request; 0: unlimited
  /// Share of a deployment's replicas when tenants compete for them (fair
  /// queuing on tokens): a tenant of weight 2 is served twice the tokens of
  /// one of weight 1 while both wait. Not a limit: an idle share is used.
  double weight = 1;
  bool operator==(const tenant_limits&) const = default;
};

/// Why a request was not admitted: which limit, a message naming it and its
/// value, and when a retry could pass (0 for a limit no wait can satisfy).
struct limit_refusal {
  errc code = errc::overloaded;  // invalid_argument for max_tokens
  std::string limit;             // "requests_per_s", "tokens_per_min", "max_concurrent", "max_tokens"
  std::string message;
  std::uint32_t retry_after_ms = 0;
};

class tenant_limiter {
 public:
  struct admission {
    std::string tenant;
    std::uint32_t reserved_tokens = 0;  // charged to the token bucket at admission
  };

  /// Admits one request of `max_tokens` for `tenant` at `now_ns` (a monotonic
  /// clock), or says which limit refuses it. An admitted request must be
  /// finished exactly once.
  std::expected<admission, limit_refusal> admit(const std::string& tenant, const tenant_limits& limits,
                                                std::int64_t now_ns, std::uint32_t max_tokens);
  /// The request ended having used `tokens` (prompt + generated): the
  /// reservation is settled (a refund, or a debt the bucket pays off).
  void finish(const admission& a, std::uint64_t tokens, std::int64_t now_ns);

  std::uint32_t in_flight(const std::string& tenant) const;

 private:
  struct bucket {
    double level = 0;
    std::int64_t at_ns = 0;
    bool primed = false;
  };
  struct state {
    bucket requests, tokens;
    std::uint32_t in_flight = 0;
    tenant_limits last;  // the limits the buckets were last refilled with
  };
  std::map<std::string, state> tenants_;
};

}  // namespace exa::auth
