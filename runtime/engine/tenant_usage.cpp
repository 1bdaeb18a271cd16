#include "engine/tenant_usage.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/assert.hpp"

namespace exa::engine {

expected<void> check_tenant_weight(double weight) {
  if (!std::isfinite(weight) || weight <= 0)
    return make_error(errc::invalid_argument,
                      "tenant_weight must be a positive number, got " + std::to_string(weight));
  return {};
}

tenant_usage::tenant_usage(tenant_usage_config config) : config_(config) {
  EXA_ASSERT_MSG(config_.window_tokens > 0 && config_.max_tenants > 0, "tenant_usage needs a window and a slot");
}

tenant_usage::slot tenant_usage::intern(std::string_view tenant, double weight) {
  EXA_ASSERT_MSG(weight > 0, "a tenant's weight is positive");
  slot s = 0;
  if (const auto it = slot_of_.find(tenant); it != slot_of_.end()) {
    s = it->second;
  } else if (served_.size() < config_.max_tenants) {
    s = static_cast<slot>(served_.size());
    slot_of_.emplace(std::string(tenant), s);
    served_.push_back(0);
    weight_.push_back(weight);
    next_weight_.push_back(weight);
  } else {
    s = static_cast<slot>(served_.size() - 1);  // the shared overflow slot
  }
  next_weight_[s] = weight;
  return s;
}

void tenant_usage::charge(slot s, std::uint64_t tokens) {
  EXA_ASSERT(s < served_.size());
  served_[s] += static_cast<double>(tokens);
  since_halving_ += tokens;
  while (since_halving_ >= config_.window_tokens) {
    since_halving_ -= config_.window_tokens;
    // Below half a token a counter is nothing: the tenant is no longer
    // "served lately", which is what ends scheduling across tenants.
    for (double& v : served_) v = v / 2 < 0.5 ? 0 : v / 2;
    ++halvings_;
  }
}

void tenant_usage::refund(slot s, std::uint64_t tokens, std::uint64_t charged_at) {
  EXA_ASSERT(s < served_.size() && charged_at <= halvings_);
  const std::uint64_t halved = halvings_ - charged_at;
  if (halved == 0) since_halving_ -= std::min(since_halving_, tokens);  // the window's count as if never charged
  const double left = halved >= 64 ? 0 : std::ldexp(static_cast<double>(tokens), -static_cast<int>(halved));
  served_[s] = std::max(0.0, served_[s] - left);
}

std::optional<tenant_usage::slot> tenant_usage::find(std::string_view tenant) const {
  if (const auto it = slot_of_.find(tenant); it != slot_of_.end()) return it->second;
  if (served_.size() >= config_.max_tenants) return static_cast<slot>(served_.size() - 1);
  return std::nullopt;
}

double tenant_usage::usage(slot s) const {
  EXA_ASSERT(s < served_.size());
  return served_[s] / weight_[s];
}

bool tenant_usage::over_share(slot s, slot beside) const {
  EXA_ASSERT(s < served_.size() && beside < served_.size());
  double served = 0, weights = 0;
  for (std::size_t i = 0; i < served_.size(); ++i)
    if (i == s || i == beside || served_lately(static_cast<slot>(i))) {
      served += served_[i];
      weights += weight_[i];
    }
  if (served <= 0) return false;
  return served_[s] / served > weight_[s] / weights;
}

void tenant_usage::restore(const snapshot& saved) {
  EXA_ASSERT(saved.served.size() <= served_.size());
  std::fill(served_.begin(), served_.end(), 0.0);
  std::copy(saved.served.begin(), saved.served.end(), served_.begin());
  since_halving_ = saved.since_halving;
  halvings_ = saved.halvings;
}

}  // namespace exa::engine
