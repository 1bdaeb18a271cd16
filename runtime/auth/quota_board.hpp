#pragma once
// A gateway's side of tenant limits shared across gateways (quota_share.hpp).
// The front door notes what arrives and admits under this gateway's share;
// the router takes the demand every report period, sends it to the
// controller and applies the shares it answers. Thread-safe: the door and
// the router run on different threads. Every time the board sees comes from
// the router's clock; the door only counts.

#include <cstddef>
#include <cstdint>
#include <expected>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "auth/quota_share.hpp"
#include "auth/tenant_limits.hpp"

namespace exa::auth {

struct quota_board_config {
  /// Tenants tracked (demand and shares); one past it is enforced at
  /// limit / gateways and not reported.
  std::size_t tenants_max = 4096;
  /// Shares older than this (no answer from the controller) are dropped:
  /// each limit is then divided evenly by the gateways of the last answer.
  /// Keep it below the controller's lease, so a gateway cut off from the
  /// controller has shrunk to its even part by the time the others get
  /// its share.
  std::int64_t shares_keep_ns = 3'000'000'000;
  /// A tenant with nothing in flight and no arrival for this many reports
  /// is forgotten (no longer reported; its share stays while granted).
  std::uint32_t idle_reports_max = 30;
};

/// This gateway's part of a tenant's limits: the whole limits scaled by its
/// shares. `concurrent_none` means its share of requests in flight is zero
/// (tenant_limits cannot say so: 0 there means unlimited).
struct gateway_limits {
  tenant_limits limits;
  bool concurrent_none = false;
  bool shared = false;  // limits are a part of the whole ones
};

class quota_board {
 public:
  explicit quota_board(quota_board_config config = {});

  // ---------------------------------------------------- the front door
  /// The limits this gateway enforces for `tenant` whose whole limits are
  /// `whole`: its shares when fresh, limit / gateways of the last answer
  /// when the tenant has none or the shares went stale (one gateway before
  /// the first answer).
  gateway_limits limits_for(const std::string& tenant, const tenant_limits& whole) const;
  /// A request of `tokens` (its reservation) arrived for `tenant`.
  void note_arrival(const std::string& tenant, const tenant_limits& whole, std::uint32_t tokens);
  void note_admitted(const std::string& tenant);
  void note_refused_concurrent(const std::string& tenant);
  void note_finished(const std::string& tenant);

  // ---------------------------------------------------- the router
  /// Every tracked tenant's demand since the last call, `period_s` ago,
  /// and a fresh period; tenants idle for idle_reports_max are forgotten.
  std::vector<quota_demand> take_demand(double period_s);
  /// Fresh shares from the controller at `now_ns`. Returns true when they
  /// end a fallback (to be logged).
  bool apply(const quota_grant& grant, std::int64_t now_ns);
  /// Drops shares older than shares_keep_ns at `now_ns`. Returns true when
  /// this call dropped them (to be logged once).
  bool expire_shares(std::int64_t now_ns);

  bool fell_back() const;
  std::uint32_t gateways() const;  // in the last answer; 1 before any
  std::size_t tenants() const;     // tracked for demand

 private:
  struct tracked {
    tenant_limits whole;
    std::uint64_t arrivals = 0;
    double tokens = 0;
    std::uint32_t in_flight = 0;
    std::uint32_t in_flight_peak = 0;
    std::uint32_t refused_concurrent = 0;
    std::uint32_t idle_reports = 0;
  };
  tracked* track(const std::string& tenant);

  quota_board_config config_;
  mutable std::mutex mu_;
  std::map<std::string, tracked> tenants_;
  std::map<std::string, quota_share> shares_;
  std::uint32_t gateways_ = 1;
  std::int64_t granted_ns_ = 0;
  bool have_shares_ = false;
  bool fell_back_ = false;
};

/// Admission at a front door under this gateway's share of a tenant's
/// limits (without a board: the whole limits, enforced here alone). Notes
/// demand on the board; refusals name the tenant's whole limit and this
/// gateway's part of it.
class shared_tenant_limiter {
 public:
  explicit shared_tenant_limiter(std::shared_ptr<quota_board> board = nullptr) : board_(std::move(board)) {}

  std::expected<tenant_limiter::admission, limit_refusal> admit(const std::string& tenant, const tenant_limits& whole,
                                                                std::int64_t now_ns, std::uint32_t max_tokens);
  void finish(const tenant_limiter::admission& a, std::uint64_t tokens, std::int64_t now_ns);
  std::uint32_t in_flight(const std::string& tenant) const { return local_.in_flight(tenant); }
  const std::shared_ptr<quota_board>& board() const noexcept { return board_; }

 private:
  tenant_limiter local_;
  std::shared_ptr<quota_board> board_;
};

}  // namespace exa::auth
