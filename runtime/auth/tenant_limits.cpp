#include "auth/tenant_limits.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace exa::auth {
namespace {

// Refills a bucket of `capacity` at `per_s` up to now; a fresh one starts full.
void refill(double& level, std::int64_t& at_ns, bool& primed, double capacity, double per_s, std::int64_t now_ns) {
  if (!primed) {
    level = capacity;
    at_ns = now_ns;
    primed = true;
    return;
  }
  const double dt = std::max<std::int64_t>(0, now_ns - at_ns) / 1e9;
  level = std::min(capacity, level + dt * per_s);
  at_ns = std::max(at_ns, now_ns);
}

std::uint32_t wait_ms(double missing, double per_s) {
  if (per_s <= 0) return 0;
  return static_cast<std::uint32_t>(std::min(std::ceil(missing / per_s * 1000.0), 3.6e6));
}

}  // namespace

std::expected<tenant_limiter::admission, limit_refusal> tenant_limiter::admit(const std::string& tenant,
                                                                               const tenant_limits& limits,
                                                                               std::int64_t now_ns,
                                                                               std::uint32_t max_tokens) {
  if (limits.max_tokens > 0 && max_tokens > limits.max_tokens)
    return std::unexpected(limit_refusal{
        errc::invalid_argument, "max_tokens",
        fmt::format("max_tokens {} is over tenant {}'s limit of {} tokens per request", max_tokens, tenant,
                    limits.max_tokens),
        0});
  auto& st = tenants_[tenant];
  st.last = limits;
  if (limits.max_concurrent > 0 && st.in_flight >= limits.max_concurrent)
    return std::unexpected(limit_refusal{
        errc::overloaded, "max_concurrent",
        fmt::format("tenant {} has {} requests in flight, its limit (max_concurrent)", tenant, limits.max_concurrent),
        1000});
  const double req_capacity = std::max(1.0, limits.requests_per_s);
  if (limits.requests_per_s > 0) {
    refill(st.requests.level, st.requests.at_ns, st.requests.primed, req_capacity, limits.requests_per_s, now_ns);
    if (st.requests.level < 1.0)
      return std::unexpected(limit_refusal{
          errc::overloaded, "requests_per_s",
          fmt::format("tenant {} is over its limit of {} requests per second", tenant, limits.requests_per_s),
          std::max(1u, wait_ms(1.0 - st.requests.level, limits.requests_per_s))});
  }
  std::uint32_t reserve = 0;
  if (limits.tokens_per_min > 0) {
    const double per_s = limits.tokens_per_min / 60.0;
    refill(st.tokens.level, st.tokens.at_ns, st.tokens.primed, limits.tokens_per_min, per_s, now_ns);
    // A request larger than the whole bucket waits for a full one, never forever.
    reserve = static_cast<std::uint32_t>(std::min<double>(max_tokens, limits.tokens_per_min));
    if (st.tokens.level < reserve)
      return std::unexpected(limit_refusal{
          errc::overloaded, "tokens_per_min",
          fmt::format("tenant {} is over its limit of {} tokens per minute", tenant, limits.tokens_per_min),
          std::max(1u, wait_ms(reserve - st.tokens.level, per_s))});
    st.tokens.level -= reserve;
  }
  if (limits.requests_per_s > 0) st.requests.level -= 1.0;
  ++st.in_flight;
  return admission{tenant, reserve};
}

void tenant_limiter::finish(const admission& a, std::uint64_t tokens, std::int64_t now_ns) {
  auto it = tenants_.find(a.tenant);
  if (it == tenants_.end()) return;
  auto& st = it->second;
  if (st.in_flight > 0) --st.in_flight;
  if (st.last.tokens_per_min > 0 && st.tokens.primed) {
    refill(st.tokens.level, st.tokens.at_ns, st.tokens.primed, st.last.tokens_per_min, st.last.tokens_per_min / 60.0,
           now_ns);
    // Settle the reservation: give back what was not used, or owe the rest
    // (the level may go below zero, and later requests wait it off).
    st.tokens.level += static_cast<double>(a.reserved_tokens) - static_cast<double>(tokens);
    st.tokens.level = std::min(st.tokens.level, st.last.tokens_per_min);
  }
}

std::uint32_t tenant_limiter::in_flight(const std::string& tenant) const {
  auto it = tenants_.find(tenant);
  return it == tenants_.end() ? 0 : it->second.in_flight;
}

}  // namespace exa::auth
