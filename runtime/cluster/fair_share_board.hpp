#pragma once
// Weighted fair queuing across gateways (fair_queue.hpp is one gateway's).
// Each gateway's fair queue counts only what that gateway served, so a
// tenant sending through two gateways would get its share at each of them.
// Here the gateways share their counters through the controller:
//
//   - Each gateway's board counts, per deployment and tenant, the tokens it
//     charged (cost / weight, as the fair queue charges them) as a running
//     total, and every report period sends those totals and its backlog
//     (requests waiting) to the controller.
//   - The controller's authority adds what each total grew by since that
//     gateway's last report into one global counter per deployment and
//     tenant, and answers the global counters. A tenant that becomes
//     backlogged (no live gateway had it waiting, now one does) is lifted
//     to the smallest counter of the tenants already backlogged (or, with
//     none, the largest counter served), as the fair queue lifts it: idle
//     time banks no credit. Idle tenants at or below that floor are
//     forgotten; one not in the answer stands at the floor.
//   - A gateway's fair queue orders by the global counter of the last
//     answer plus what it charged itself since the report answered
//     (fair_share_board::counter, applied with fair_queue::raise_counter).
//
// Places across gateways: each gateway holds its own places on a
// deployment's replicas and caps a tenant at all but a headroom of them
// while others are active there (tenant_slot_limit). Alone that cap
// decides the split when places are few: a tenant flooding two gateways
// fills one whole and half the other, and the tenant sending through the
// second is held at half of its places. So the reports also carry each
// tenant's places held and the deployment's places at the gateway; the
// answer carries their sums over the gateways and how many tenants hold or
// wait for places anywhere, and a gateway does not hold a tenant to its
// cap while the tenant has less than its fair share of all the gateways'
// places (fair_share_board::places).
//
// Totals, not increments, go in the reports, so a lost answer or a report
// sent twice counts nothing twice. Bounded: the entries a board tracks,
// the entries in a report and in all the controller's counters, and the
// gateways holding a lease. A gateway that stops reporting loses its lease
// (its backlog stops counting; what it was served stays counted); a gateway
// without answers for keep_ns falls back to its own counters.
// Pure logic: time is passed in. Used by one actor (not thread-safe).

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cluster/fair_queue.hpp"
#include "common/error.hpp"

namespace exa::cluster {

/// One deployment and tenant at one gateway.
struct fair_share_entry {
  std::string deployment;
  std::string tenant;
  /// Which run of the gateway's count `charged` belongs to: a count the
  /// gateway forgot and started again gets a new one.
  std::uint64_t generation = 0;
  double charged = 0;        // tokens / weight charged at this gateway, in total
  std::uint32_t waiting = 0;  // requests waiting at this gateway now
  std::uint32_t held = 0;     // places the tenant holds on the deployment's replicas at this gateway now
  std::uint32_t slots = 0;    // the deployment's places at this gateway (the same in each of its entries)
  bool operator==(const fair_share_entry&) const = default;
};

struct fair_share_report {
  std::uint64_t gateway = 0;
  std::vector<fair_share_entry> entries;
  bool operator==(const fair_share_report&) const = default;
};

struct fair_counter {
  std::string tenant;
  double counter = 0;
  std::uint32_t held = 0;  // places held at all the gateways with a lease
  bool operator==(const fair_counter&) const = default;
};

/// A deployment's global counters: `floor` for every tenant not listed.
/// A tenant holding places but past the kept counters is listed at the
/// floor with its places.
struct fair_deployment_counters {
  std::string deployment;
  double floor = 0;
  std::vector<fair_counter> counters;
  std::uint32_t slots = 0;   // places at all the gateways with a lease
  std::uint32_t active = 0;  // tenants holding or waiting for places at any of them
  bool operator==(const fair_deployment_counters&) const = default;
};

/// The authority's answer: the counters of each deployment the gateway
/// reported.
struct fair_share_answer {
  std::vector<fair_deployment_counters> deployments;
  std::uint32_t gateways = 1;  // holding a lease, this one included
  bool operator==(const fair_share_answer&) const = default;
};

struct fair_share_authority_config {
  /// A gateway that has not reported for this long loses its lease.
  std::int64_t lease_ns = 5'000'000'000;
  std::size_t gateways_max = 256;
  /// Entries in one report, and global counters in all (new ones past it
  /// are not kept: such a tenant stands at its deployment's floor).
  std::size_t entries_max = 4096;
};

/// The controller's side.
class fair_share_authority {
 public:
  explicit fair_share_authority(fair_share_authority_config config = {});

  /// Merges `gateway`'s report (replacing its last one) at `now_ns` and
  /// answers the counters of the deployments it reported. invalid_argument
  /// for more than entries_max entries; overloaded when gateways_max other
  /// gateways hold leases (that gateway then uses its own counters).
  expected<fair_share_answer> report(const fair_share_report& report, std::int64_t now_ns);
  /// Ends the leases that ran out by `now_ns`; returns how many.
  std::size_t expire(std::int64_t now_ns);

  /// The global counter of `tenant` on `deployment` as a gateway would be
  /// told it (the floor when not kept).
  double counter(const std::string& deployment, const std::string& tenant) const;
  std::size_t gateways() const noexcept { return gateways_.size(); }
  std::size_t counters() const;  // kept in all deployments

 private:
  struct seen {
    std::uint64_t generation = 0;
    double charged = 0;
    std::uint32_t waiting = 0;
    std::uint32_t held = 0;
    std::uint32_t slots = 0;
  };
  using key = std::pair<std::string, std::string>;  // deployment, tenant
  struct lease {
    std::int64_t reported_ns = 0;
    std::map<key, seen> entries;
  };
  struct deployment_state {
    std::map<std::string, double> counters;  // by tenant
    double last_served = 0;                  // the largest counter reached
  };
  std::map<key, double> merge(const fair_share_report& report, std::int64_t now_ns);
  void lift(const std::string& deployment, std::uint64_t gateway, const std::set<key>& before);
  /// `extra`: how many holders without a kept counter the answer may still
  /// list (shared by its deployments, so the answer stays within entries_max).
  fair_deployment_counters counters_of(const std::string& deployment, const deployment_state& d,
                                       std::size_t& extra) const;
  bool backlogged(const std::string& deployment, const std::string& tenant) const;
  double floor(const std::string& deployment, const deployment_state& d) const;
  void forget_idle(const std::string& deployment);

  fair_share_authority_config config_;
  std::map<std::uint64_t, lease> gateways_;
  std::map<std::string, deployment_state> deployments_;
  std::size_t counters_ = 0;
};

/// One deployment's places at a gateway, for its report.
struct gateway_places {
  std::uint32_t slots = 0;
  std::map<std::string, std::uint32_t, std::less<>> held;  // by tenant
};

/// What the other gateways hold, as of the last answer (fair_share_board::places).
struct places_elsewhere {
  std::uint32_t slots = 0;   // the deployment's places at the other gateways
  std::uint32_t held = 0;    // the tenant's places there
  std::uint32_t active = 0;  // tenants holding or waiting for places anywhere (this gateway included)
};

/// Whether a tenant holding `held` of this gateway's `slots` places, with
/// `active` tenants (it included) active here, has less than its fair share
/// of all the gateways' places, `e` being the others' (the larger of the
/// two active counts divides them).
bool below_share_of_all_places(std::uint32_t held, std::uint32_t slots, std::uint32_t active,
                               const places_elsewhere& e) noexcept;

struct fair_share_board_config {
  std::size_t entries_max = 4096;  // tracked; one past it stays local
  /// Counters older than this (no answer from the controller) are dropped:
  /// the fair queues then order by their own counters. Keep it below the
  /// controller's lease.
  std::int64_t keep_ns = 3'000'000'000;
  /// An entry with nothing charged or waiting for this many reports, all
  /// of it answered, is forgotten.
  std::uint32_t idle_reports_max = 30;
};

/// A gateway's side.
class fair_share_board {
 public:
  explicit fair_share_board(fair_share_board_config config = {});

  /// `weighted_tokens` (cost / weight) were charged to `tenant` on `deployment` here.
  void note_charged(const std::string& deployment, const std::string& tenant, double weighted_tokens);
  /// The counter this gateway orders `tenant` by on `deployment`: the global
  /// counter of the last answer (the deployment's floor for one not in it)
  /// plus what was charged here since that report; only the latter while
  /// fallen back or before the first answer.
  double counter(const std::string& deployment, const std::string& tenant) const;
  /// Raises the counter of each tenant waiting in `queue` (deployment's) to counter().
  void apply_to(const std::string& deployment, fair_queue& queue) const;
  /// The places the other gateways hold on `deployment`, and `tenant`'s
  /// among them: the last answer's sums less what this gateway reported in
  /// the report it answered. None before an answer, while fallen back, or
  /// for a deployment the answer did not carry.
  std::optional<places_elsewhere> places(const std::string& deployment, const std::string& tenant) const;

  /// The report to send: every tracked entry with `backlog` (deployment ->
  /// its fair queue's backlog(), tenants with requests waiting) and
  /// `places` (deployment -> its places here and who holds them). Forgets
  /// entries idle for idle_reports_max reports.
  fair_share_report take_report(std::uint64_t gateway,
                                const std::map<std::string, std::vector<std::pair<std::string, std::size_t>>>& backlog,
                                const std::map<std::string, gateway_places>& places = {});
  /// The answer to the last report taken, at `now_ns`. true when it ends a
  /// fallback (to be logged).
  bool apply(const fair_share_answer& answer, std::int64_t now_ns);
  /// Drops counters older than keep_ns at `now_ns`; true when this call
  /// dropped them (to be logged once). Each entry then starts a new count
  /// of what the controller has not answered yet: the controller, which
  /// forgets this gateway's totals with its lease, adds only that.
  bool expire(std::int64_t now_ns);

  bool fell_back() const noexcept { return fell_back_; }
  bool synced() const noexcept { return have_answer_; }
  std::uint32_t gateways() const noexcept { return gateways_; }
  std::size_t entries() const noexcept { return entries_.size(); }
  std::uint64_t untracked() const noexcept { return untracked_; }  // charges past entries_max

 private:
  using key = std::pair<std::string, std::string>;
  struct tracked {
    std::uint64_t generation = 0;
    double charged = 0;   // in total
    double reported = 0;  // the total in the last report taken
    double answered = 0;  // the total in the last report answered
    bool charged_since_report = false;
    std::uint32_t idle_reports = 0;
  };
  tracked* track(const key& k);

  fair_share_board_config config_;
  std::map<key, tracked> entries_;
  struct global_counters {
    double floor = 0;
    std::map<std::string, double> counters;  // by tenant
    std::map<std::string, std::uint32_t> held;  // by tenant, places at all gateways
    std::uint32_t slots = 0, active = 0;
  };
  std::map<std::string, global_counters> global_;  // by deployment, from the last answer
  std::map<std::string, gateway_places> reported_places_, answered_places_;  // this gateway's, by deployment
  std::uint64_t next_generation_ = 1;
  std::uint64_t untracked_ = 0;
  std::uint32_t gateways_ = 1;
  std::int64_t answered_ns_ = 0;
  bool have_answer_ = false;
  bool fell_back_ = false;
};

}  // namespace exa::cluster
