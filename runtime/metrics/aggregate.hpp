#pragma once
// Hierarchical aggregation of scrapes: what a rack aggregator does with its
// nodes' /metrics and the global one with the racks'. Pure functions of
// snapshots, so the rules are unit-tested without a socket.
//
//   counters    summed
//   histograms  merged bucket by bucket (bounds must agree), sums summed
//   gauges      summed, or the maximum for gauges whose meaning is a level
//               rather than an amount (utilisation, temperature, ratios)
//
// Labels that identify a source below the level (replica, node) are dropped
// before merging, so the level exposes one series per remaining label set,
// plus labels naming the level itself (rack="3"). Each family keeps at most
// `series_max` series; what passes it is folded into the family's one
// `_overflow` series, so totals still add up, and the report says how many
// series of which families were folded.

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "metrics/exposition.hpp"
#include "metrics/metrics.hpp"

namespace exa::metrics {

struct aggregation_rule {
  std::set<std::string> drop_labels;                         // summed away
  std::vector<std::pair<std::string, std::string>> add_labels;  // this level's own (a source's same label wins)
  std::set<std::string> max_gauges;  // gauge families combined by max; see default_max_gauge()
  std::size_t series_max = 10000;    // per family, after aggregation
};

/// Gauges that are levels by their name: *_ratio, *_utilization,
/// *_temperature_celsius, *_max. Others are amounts and add up.
bool default_max_gauge(std::string_view family_name);

struct aggregation_report {
  std::size_t series_in = 0;   // series read from every source
  std::size_t series_out = 0;  // series exposed
  std::size_t folded = 0;      // series folded into _overflow series
  std::map<std::string, std::size_t> folded_by_family;
  /// Families skipped from one source because they disagree with another
  /// source's (type, or histogram bounds): "family: why (source N)".
  std::vector<std::string> conflicts;
};

/// Aggregates the sources under `rule`. Never fails: a family that
/// conflicts between sources keeps the first source's definition and the
/// conflicting source's series are left out (and named in the report).
registry_snapshot aggregate(std::span<const registry_snapshot> sources, const aggregation_rule& rule,
                            aggregation_report* report = nullptr);

/// Keeps one source's counters continuous across its scrapes: when a
/// counter (or histogram) series goes down, the process behind it
/// restarted, and its previous value is carried forward, as Prometheus'
/// rate() does; a counter series that vanishes from a scrape keeps its last
/// value. So an aggregate over sources never goes backwards when one of
/// them restarts or disappears. Gauges pass through as they are.
class counter_continuity {
 public:
  /// The scrape with carried values added.
  registry_snapshot next(const registry_snapshot& scrape);
  /// The scrape as it is, remembered for counters_only(): for a source
  /// that is itself an aggregator, whose counters are continuous already
  /// (carrying its partial decreases -- a series folded, a departed target
  /// forgotten -- would count what remains twice).
  registry_snapshot pass_through(const registry_snapshot& scrape);
  /// The last result without gauges: what a source that stopped answering
  /// still contributes (its gauges describe a present it no longer has).
  registry_snapshot counters_only() const;
  /// Series currently carried (bounded by what the source ever exposed).
  std::size_t carried_series() const { return carried_.size(); }

 private:
  struct series_state {
    std::vector<std::uint64_t> last_buckets;  // raw, as scraped
    double last_value = 0;
    double last_sum = 0;
    std::vector<std::uint64_t> carry_buckets;  // added to raw
    double carry_value = 0;
    double carry_sum = 0;
  };
  using key = std::pair<std::string, std::vector<std::string>>;  // family, label values
  std::map<key, series_state> carried_;
  registry_snapshot last_;
};

/// What an aggregator process holds: the latest scrape of each target (kept
/// continuous), the targets' health, and the aggregate over them with the
/// aggregator's own families:
///   exaserve_aggregator_target_up{aggregator,target}            1 or 0
///   exaserve_aggregator_scrape_errors_total{aggregator,target}
///   exaserve_aggregator_series{aggregator}                      series exposed
///   exaserve_aggregator_series_folded{aggregator,family}        in the last pass
///   exaserve_aggregator_conflicts{aggregator}                   families left out
/// A target that stopped answering still contributes its counters (frozen
/// at their last values, so sums never go backwards) but not its gauges.
/// A target that is itself an aggregator (it exports
/// exaserve_aggregator_target_up) is taken as it is: its counters are
/// continuous already.
class scrape_aggregator {
 public:
  struct target_state {
    std::string url;
    bool up = false;
    std::uint64_t errors = 0;
    std::string last_error;
    std::size_t series = 0;  // in its last good scrape
    std::int64_t last_success_ms = -1;
    bool aggregator = false;  // it exports exaserve_aggregator_* itself: its counters pass through
  };

  scrape_aggregator(std::string name, std::vector<std::string> targets, aggregation_rule rule,
                    parse_limits limits = {});

  /// Replaces the target list (targets found by DNS come and go). Targets
  /// that stay keep their state; a target that leaves keeps contributing
  /// its counters, frozen, so sums never go backwards, and gets its state
  /// back if it returns (at most `departed_max` departed targets are
  /// remembered, the oldest forgotten first). Returns how many were added
  /// and removed.
  std::pair<std::size_t, std::size_t> set_targets(const std::vector<std::string>& urls);
  static constexpr std::size_t departed_max = 1024;

  /// One scrape of target `index`: its body, or why it failed. A body that
  /// does not parse counts as a failure, with the parser's reason.
  void on_scrape(std::size_t index, const expected<std::string>& body, std::int64_t now_ms);

  const std::vector<target_state>& targets() const { return targets_; }
  /// The aggregator's own families, as "name type" pairs.
  static std::vector<std::pair<std::string, std::string>> own_families();
  const std::string& name() const { return name_; }
  registry_snapshot result(aggregation_report* report = nullptr) const;

 private:
  std::string name_;
  aggregation_rule rule_;
  parse_limits limits_;
  std::vector<target_state> targets_;
  std::vector<counter_continuity> continuity_;
  std::vector<registry_snapshot> latest_;  // continuous; empty until the first good scrape
  struct departed {
    target_state state;
    counter_continuity continuity;
    registry_snapshot frozen;  // its counters when it left
    std::uint64_t order = 0;   // when it left
  };
  std::map<std::string, departed> departed_;
  std::uint64_t departures_ = 0;
};

}  // namespace exa::metrics
