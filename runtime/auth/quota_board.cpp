#include "auth/quota_board.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

namespace exa::auth {
namespace {

bool limited(const tenant_limits& l) {
  return l.requests_per_s > 0 || l.tokens_per_min > 0 || l.max_concurrent > 0;
}

// The refusal of a shared limit names the tenant's whole limit and this
// gateway's part of it, so a client is not told a limit it never set.
std::string shared_message(const std::string& tenant, const std::string& limit, const tenant_limits& whole,
                           const gateway_limits& part, std::uint32_t in_flight) {
  if (limit == "requests_per_s")
    return fmt::format("tenant {} is over its limit of {} requests per second (shared by the gateways: {:.3g} at this one)",
                       tenant, whole.requests_per_s, part.limits.requests_per_s);
  if (limit == "tokens_per_min")
    return fmt::format("tenant {} is over its limit of {} tokens per minute (shared by the gateways: {:.0f} at this one)",
                       tenant, whole.tokens_per_min, part.limits.tokens_per_min);
  return fmt::format("tenant {} has {} requests in flight at this gateway, its part of its limit (max_concurrent) of {} "
                     "shared by the gateways",
                     tenant, in_flight, whole.max_concurrent);
}

}  // namespace

quota_board::quota_board(quota_board_config config) : config_(config) {}

gateway_limits quota_board::limits_for(const std::string& tenant, const tenant_limits& whole) const {
  gateway_limits out{whole, false, false};
  if (!limited(whole)) return out;
  double fr = 1, ft = 1, fc = 1;
  {
    std::lock_guard lock(mu_);
    auto it = shares_.find(tenant);
    if (it != shares_.end()) {
      fr = it->second.requests, ft = it->second.tokens, fc = it->second.concurrent;
    } else {
      fr = ft = fc = 1.0 / std::max<std::uint32_t>(1, gateways_);
    }
  }
  if (fr >= 1 && ft >= 1 && fc >= 1) return out;
  out.shared = true;
  // A share of a rate never turns into 0, which tenant_limits reads as
  // unlimited; a tiny rate admits next to nothing.
  if (whole.requests_per_s > 0) out.limits.requests_per_s = std::max(whole.requests_per_s * fr, 1e-6);
  if (whole.tokens_per_min > 0) out.limits.tokens_per_min = std::max(whole.tokens_per_min * ft, 1e-6);
  if (whole.max_concurrent > 0) {
    const auto c = static_cast<std::uint32_t>(std::floor(whole.max_concurrent * std::clamp(fc, 0.0, 1.0) + 1e-9));
    out.concurrent_none = c == 0;
    out.limits.max_concurrent = std::max<std::uint32_t>(c, 1);
  }
  return out;
}

quota_board::tracked* quota_board::track(const std::string& tenant) {
  auto it = tenants_.find(tenant);
  if (it != tenants_.end()) return &it->second;
  if (tenants_.size() >= config_.tenants_max) return nullptr;  // bounded: enforced at limit / gateways, unreported
  return &tenants_[tenant];
}

void quota_board::note_arrival(const std::string& tenant, const tenant_limits& whole, std::uint32_t tokens) {
  std::lock_guard lock(mu_);
  auto* t = track(tenant);
  if (!t) return;
  t->whole = whole;
  ++t->arrivals;
  t->tokens += tokens;
  t->idle_reports = 0;
}

void quota_board::note_admitted(const std::string& tenant) {
  std::lock_guard lock(mu_);
  if (auto* t = track(tenant)) t->in_flight_peak = std::max(t->in_flight_peak, ++t->in_flight);
}

void quota_board::note_refused_concurrent(const std::string& tenant) {
  std::lock_guard lock(mu_);
  if (auto* t = track(tenant)) ++t->refused_concurrent;
}

void quota_board::note_finished(const std::string& tenant) {
  std::lock_guard lock(mu_);
  auto it = tenants_.find(tenant);
  if (it != tenants_.end() && it->second.in_flight > 0) --it->second.in_flight;
}

std::vector<quota_demand> quota_board::take_demand(double period_s) {
  const double s = std::max(period_s, 1e-3);
  std::lock_guard lock(mu_);
  std::vector<quota_demand> out;
  out.reserve(tenants_.size());
  for (auto it = tenants_.begin(); it != tenants_.end();) {
    auto& t = it->second;
    const bool idle = t.arrivals == 0 && t.in_flight == 0;
    if (idle && ++t.idle_reports > config_.idle_reports_max) {
      it = tenants_.erase(it);
      continue;
    }
    quota_demand d;
    d.tenant = it->first;
    d.limit_requests_per_s = t.whole.requests_per_s;
    d.limit_tokens_per_min = t.whole.tokens_per_min;
    d.limit_concurrent = t.whole.max_concurrent;
    d.requests_per_s = static_cast<double>(t.arrivals) / s;
    d.tokens_per_min = t.tokens / s * 60.0;
    d.concurrent = static_cast<double>(t.in_flight_peak) + t.refused_concurrent;
    out.push_back(std::move(d));
    t.arrivals = 0;
    t.tokens = 0;
    t.in_flight_peak = t.in_flight;
    t.refused_concurrent = 0;
    ++it;
  }
  return out;
}

bool quota_board::apply(const quota_grant& grant, std::int64_t now_ns) {
  std::lock_guard lock(mu_);
  shares_.clear();
  for (const auto& s : grant.shares) {
    if (shares_.size() >= config_.tenants_max) break;
    shares_[s.tenant] = s;
  }
  gateways_ = std::max<std::uint32_t>(1, grant.gateways);
  granted_ns_ = now_ns;
  have_shares_ = true;
  return std::exchange(fell_back_, false);
}

bool quota_board::expire_shares(std::int64_t now_ns) {
  std::lock_guard lock(mu_);
  if (!have_shares_ || fell_back_ || now_ns - granted_ns_ <= config_.shares_keep_ns) return false;
  shares_.clear();
  fell_back_ = true;
  return true;
}

bool quota_board::fell_back() const {
  std::lock_guard lock(mu_);
  return fell_back_;
}

std::uint32_t quota_board::gateways() const {
  std::lock_guard lock(mu_);
  return gateways_;
}

std::size_t quota_board::tenants() const {
  std::lock_guard lock(mu_);
  return tenants_.size();
}

std::expected<tenant_limiter::admission, limit_refusal> shared_tenant_limiter::admit(const std::string& tenant,
                                                                                     const tenant_limits& whole,
                                                                                     std::int64_t now_ns,
                                                                                     std::uint32_t max_tokens) {
  // Too many tokens for one request is no demand: waiting would not help.
  if (!board_ || (whole.max_tokens > 0 && max_tokens > whole.max_tokens))
    return local_.admit(tenant, whole, now_ns, max_tokens);
  const auto reserve = whole.tokens_per_min > 0
                           ? static_cast<std::uint32_t>(std::min<double>(max_tokens, whole.tokens_per_min))
                           : 0u;
  board_->note_arrival(tenant, whole, reserve);
  const gateway_limits part = board_->limits_for(tenant, whole);
  if (part.concurrent_none) {
    board_->note_refused_concurrent(tenant);
    return std::unexpected(limit_refusal{errc::overloaded, "max_concurrent",
                                         shared_message(tenant, "max_concurrent", whole, part, in_flight(tenant)), 1000});
  }
  auto a = local_.admit(tenant, part.limits, now_ns, max_tokens);
  if (a) {
    board_->note_admitted(tenant);
    return a;
  }
  if (a.error().limit == "max_concurrent") board_->note_refused_concurrent(tenant);
  if (part.shared) a.error().message = shared_message(tenant, a.error().limit, whole, part, in_flight(tenant));
  return a;
}

void shared_tenant_limiter::finish(const tenant_limiter::admission& a, std::uint64_t tokens, std::int64_t now_ns) {
  local_.finish(a, tokens, now_ns);
  if (board_) board_->note_finished(a.tenant);
}

}  // namespace exa::auth
