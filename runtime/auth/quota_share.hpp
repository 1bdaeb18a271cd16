#pragma once
// A tenant's limits shared by all gateways. Each gateway enforces its own
// share of every limit; the controller is the quota authority: it divides
// each limit among the gateways by what each of them asked for in its last
// report (max-min fair, with a floor each), and takes a gateway's share
// back once it stops reporting. Pure logic; time is passed in.

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace exa::auth {

/// One tenant at one gateway over the gateway's last report period.
struct quota_demand {
  std::string tenant;
  /// The tenant's limits as this gateway's keys file has them (0: unlimited).
  double limit_requests_per_s = 0;
  double limit_tokens_per_min = 0;
  std::uint32_t limit_concurrent = 0;
  /// What arrived, refused requests included (they are demand too).
  double requests_per_s = 0;
  double tokens_per_min = 0;  // the tokens those arrivals reserve (prompt + max_tokens)
  double concurrent = 0;      // the most in flight, plus those refused for concurrency
  bool operator==(const quota_demand&) const = default;
};

/// One tenant's share at one gateway: the fraction of each limit it may
/// admit, each in [0, 1].
struct quota_share {
  std::string tenant;
  double requests = 1;
  double tokens = 1;
  double concurrent = 1;
  bool operator==(const quota_share&) const = default;
};

/// The authority's answer to one gateway's report.
struct quota_grant {
  std::vector<quota_share> shares;  // every tenant a live gateway reported
  std::uint32_t gateways = 1;       // gateways holding a lease, this one included
  bool operator==(const quota_grant&) const = default;
};

struct quota_division_config {
  /// Every gateway keeps at least this fraction of each limit, so one that
  /// has not seen a tenant yet admits its first requests before it reports
  /// them...
  double floor_fraction = 0.05;
  /// ... but all floors together take at most this fraction, so a tenant
  /// that uses one gateway of many still gets most of its limit there.
  double floors_total_max = 0.1;
};

/// Divides `limit` among gateways that want `demands` (in the limit's unit).
/// Each gets a floor; the rest is filled max-min fairly by demand: a gateway
/// wanting less than an equal split gets what it wants, those wanting more
/// split what remains equally. What nobody wants is handed out in proportion
/// to demand (equally when nobody wants anything), so shares follow demand
/// and none of the limit lies idle. The shares sum to `limit`, never more.
/// With `whole_units` (requests in flight) every share is a whole number,
/// the floor is one unit when the limit has at least two per gateway and
/// none otherwise. Negative or non-finite demands count as zero.
std::vector<double> divide_limit(double limit, std::span<const double> demands, const quota_division_config& config,
                                 bool whole_units);

struct quota_authority_config {
  quota_division_config division;
  /// A gateway that has not reported for this long loses its shares: the
  /// next division leaves it out, so the others get them back.
  std::int64_t lease_ns = 5'000'000'000;
  std::size_t gateways_max = 256;  // gateways holding a lease at once
  std::size_t tenants_max = 4096;  // tenants in one report, and in all of them together
};

/// The controller's side: the gateways' latest reports, each under a lease.
class quota_authority {
 public:
  explicit quota_authority(quota_authority_config config = {});

  /// Records `gateway`'s demand (replacing its previous report), forgets
  /// gateways whose lease ran out, and answers this gateway's shares of
  /// every tenant any live gateway reported. Tenants past tenants_max in
  /// all (new ones only) are left out; the gateway treats a tenant without
  /// a share as limit / gateways. Errors: invalid_argument for a report of
  /// more than tenants_max tenants; overloaded when gateways_max other
  /// gateways hold leases (the gateway then falls back on its own).
  expected<quota_grant> report(std::uint64_t gateway, std::vector<quota_demand> demands, std::int64_t now_ns);

  /// Forgets the gateways whose lease ran out by `now_ns`; returns their number.
  std::size_t expire(std::int64_t now_ns);

  std::size_t gateways() const noexcept { return gateways_.size(); }
  /// Distinct tenants over all live reports.
  std::size_t tenants() const;
  const quota_authority_config& config() const noexcept { return config_; }

 private:
  struct lease {
    std::int64_t reported_ns = 0;
    std::map<std::string, quota_demand> demands;  // by tenant
  };
  quota_share share_of(const std::string& tenant, std::uint64_t gateway) const;

  quota_authority_config config_;
  std::map<std::uint64_t, lease> gateways_;
};

}  // namespace exa::auth
