#include "auth/quota_share.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "common/assert.hpp"

namespace exa::auth {
namespace {

double sane(double d) { return std::isfinite(d) && d > 0 ? d : 0.0; }

// Max-min fair: `amount` over the wants, smallest first; each gets what it
// wants or an equal split of what is left, whichever is less.
void fill_max_min(std::vector<double>& share, const std::vector<double>& want, double amount) {
  std::vector<std::size_t> order(want.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return want[a] < want[b]; });
  std::size_t left = order.size();
  for (auto i : order) {
    const double give = std::min(want[i], amount / static_cast<double>(left));
    share[i] += give;
    amount = std::max(0.0, amount - give);
    --left;
  }
}

// Whole units by largest remainder: each share rounded down, then the units
// that rounding lost go to the largest fractions (ties: the lower index).
// Real shares that sum to `limit` give whole ones that sum to floor(limit).
std::vector<double> round_whole(const std::vector<double>& real, double limit) {
  std::vector<double> out(real.size());
  double used = 0;
  for (std::size_t i = 0; i < real.size(); ++i) {
    out[i] = std::floor(real[i] + 1e-9);
    used += out[i];
  }
  auto spare = static_cast<std::int64_t>(std::floor(limit + 1e-9) - used);
  std::vector<std::size_t> order(real.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return real[a] - out[a] > real[b] - out[b]; });
  for (std::size_t k = 0; spare > 0 && k < order.size(); ++k, --spare) out[order[k]] += 1;
  return out;
}

}  // namespace

std::vector<double> divide_limit(double limit, std::span<const double> demands, const quota_division_config& config,
                                 bool whole_units) {
  const std::size_t n = demands.size();
  std::vector<double> share(n, 0.0);
  if (n == 0 || !(limit > 0) || !std::isfinite(limit)) return share;
  if (whole_units) limit = std::floor(limit + 1e-9);
  const double count = static_cast<double>(n);
  double floor_each = limit * std::clamp(std::min(config.floor_fraction, config.floors_total_max / count), 0.0, 1.0 / count);
  if (whole_units) floor_each = limit >= 2 * count ? std::max(1.0, std::floor(floor_each)) : 0.0;
  std::vector<double> want(n);
  double want_total = 0, demand_total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    share[i] = floor_each;
    want[i] = std::max(0.0, sane(demands[i]) - floor_each);
    want_total += want[i];
    demand_total += sane(demands[i]);
  }
  const double rest = std::max(0.0, limit - floor_each * count);
  if (want_total >= rest) {
    fill_max_min(share, want, rest);
  } else {
    // Everyone gets what they want; the spare follows demand, so the
    // gateways that are busy now have room to grow before the next report.
    const double spare = rest - want_total;
    for (std::size_t i = 0; i < n; ++i)
      share[i] += want[i] + (demand_total > 0 ? spare * sane(demands[i]) / demand_total : spare / count);
  }
  if (whole_units) {
    auto whole = round_whole(share, limit);
    EXA_ASSERT(std::accumulate(whole.begin(), whole.end(), 0.0) <= limit);
    return whole;
  }
  // Rounding in the sums may leave the total an ulp above the limit.
  const double total = std::accumulate(share.begin(), share.end(), 0.0);
  if (total > limit)
    for (auto& s : share) s *= limit / total * (1 - 1e-12);
  return share;
}

quota_authority::quota_authority(quota_authority_config config) : config_(config) {}

std::size_t quota_authority::expire(std::int64_t now_ns) {
  return std::erase_if(gateways_, [&](const auto& g) { return now_ns - g.second.reported_ns > config_.lease_ns; });
}

std::size_t quota_authority::tenants() const {
  std::set<std::string> all;
  for (const auto& [id, l] : gateways_)
    for (const auto& [t, d] : l.demands) all.insert(t);
  return all.size();
}

expected<quota_grant> quota_authority::report(std::uint64_t gateway, std::vector<quota_demand> demands,
                                              std::int64_t now_ns) {
  if (demands.size() > config_.tenants_max)
    return make_error(errc::invalid_argument, fmt::format("a quota report names {} tenants, more than the {} allowed",
                                                          demands.size(), config_.tenants_max));
  expire(now_ns);
  if (!gateways_.count(gateway) && gateways_.size() >= config_.gateways_max)
    return make_error(errc::overloaded, fmt::format("{} gateways already hold quota leases, the most allowed; "
                                                    "this one enforces limit / gateways on its own",
                                                    config_.gateways_max));
  std::set<std::string> others;
  for (const auto& [id, l] : gateways_)
    if (id != gateway)
      for (const auto& [t, d] : l.demands) others.insert(t);
  lease fresh{now_ns, {}};
  std::size_t known = others.size();
  for (auto& d : demands) {
    if (fresh.demands.count(d.tenant)) continue;  // a duplicate: the first counts
    if (!others.count(d.tenant)) {
      if (known >= config_.tenants_max) continue;  // bounded: this tenant gets no share
      ++known;
    }
    auto name = d.tenant;
    fresh.demands.emplace(std::move(name), std::move(d));
  }
  gateways_[gateway] = std::move(fresh);

  quota_grant g;
  g.gateways = static_cast<std::uint32_t>(gateways_.size());
  for (const auto& t : others) g.shares.push_back(share_of(t, gateway));
  for (const auto& [t, d] : gateways_[gateway].demands)
    if (!others.count(t)) g.shares.push_back(share_of(t, gateway));
  EXA_ASSERT(g.shares.size() <= config_.tenants_max);
  return g;
}

// This gateway's fraction of each of the tenant's limits. A limit is the
// smallest any live gateway reported (keys files being reloaded one gateway
// at a time may differ for a moment; the smaller is the safe one).
quota_share quota_authority::share_of(const std::string& tenant, std::uint64_t gateway) const {
  std::vector<double> rps, tpm, conc;
  double lim_rps = 0, lim_tpm = 0, lim_conc = 0;
  std::size_t self = 0;
  auto smallest = [](double& acc, double v) {
    if (v > 0 && (acc == 0 || v < acc)) acc = v;
  };
  for (const auto& [id, l] : gateways_) {
    if (id == gateway) self = rps.size();
    auto it = l.demands.find(tenant);
    if (it == l.demands.end()) {
      rps.push_back(0), tpm.push_back(0), conc.push_back(0);
      continue;
    }
    const auto& d = it->second;
    rps.push_back(d.requests_per_s), tpm.push_back(d.tokens_per_min), conc.push_back(d.concurrent);
    smallest(lim_rps, d.limit_requests_per_s);
    smallest(lim_tpm, d.limit_tokens_per_min);
    smallest(lim_conc, d.limit_concurrent);
  }
  auto fraction = [&](double limit, const std::vector<double>& want, bool whole) {
    if (limit <= 0) return 1.0;  // unlimited: nothing to divide
    return std::clamp(divide_limit(limit, want, config_.division, whole)[self] / limit, 0.0, 1.0);
  };
  return {tenant, fraction(lim_rps, rps, false), fraction(lim_tpm, tpm, false), fraction(lim_conc, conc, true)};
}

}  // namespace exa::auth
