#pragma once
// The report of a chaos run: counts, latency during faults vs without, and
// time to detect and to recover per fault, as JSON and as a readable table.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "chaos/event_log.hpp"
#include "chaos/invariants.hpp"

namespace exa::chaos {

struct fault_report {
  std::uint64_t id = 0;
  std::string kind;
  double injected_s = 0;   // since the first event of the log
  double detect_ms = -1;   // -1: not detected (or nothing to detect)
  double recover_ms = -1;  // -1: not recovered within the run
  /// Among requests streaming when the fault hit: the longest wait from the
  /// injection to their next token (a resumed request's gap); -1 if none.
  double stall_max_ms = -1;
  std::uint64_t in_flight = 0;  // requests streaming when it hit
};

struct run_report {
  std::string plan;
  std::uint64_t seed = 0;
  std::uint64_t requests = 0;   // accepted
  std::uint64_t completed = 0;
  std::uint64_t errored = 0;    // finished with an error or cancellation
  std::map<std::string, std::uint64_t> error_reasons;  // errored requests by their error (code or detail)
  std::uint64_t lost = 0;       // accepted, never finished: must be 0
  /// Requests that moved to another replica mid-way and went on; -1 where the
  /// client cannot tell (real-time runs over HTTP).
  std::int64_t resumed = 0;
  // TTFT percentiles are exact (nearest rank) over the requests that had a
  // first token; -1 when a group has none.
  double ttft_p50_ms = 0, ttft_p99_ms = 0;                     // all requests
  double ttft_p50_fault_ms = 0, ttft_p99_fault_ms = 0;         // accepted while a fault was unresolved
  double ttft_p50_clear_ms = 0, ttft_p99_clear_ms = 0;         // accepted with no fault unresolved
  std::vector<fault_report> faults;
  std::vector<violation> violations;
  double wall_s = 0;  // make_report: the log's span; a driver may overwrite it with its own clock

  bool ok() const noexcept { return lost == 0 && violations.empty(); }
};

/// Builds the report from the log (fault windows: from injection to recovery,
/// or to clearing for faults that need no recovery, or to the end of the log
/// when neither happened). Counts are over accepted requests; a request's
/// first request_finished decides its outcome.
run_report make_report(const std::string& plan_name, std::uint64_t seed, const std::vector<event>& log,
                       std::vector<violation> violations);

/// One JSON object: plan, seed, requests, completed, errored, lost, resumed, the six
/// ttft_* fields, wall_s, ok, error_reasons {reason: count}, faults [{id, kind, injected_s, detect_ms,
/// recover_ms}] and violations [{invariant, detail}]; times rounded to 3
/// decimals so equal reports print equal bytes.
std::string to_json(const run_report& r);
/// Fixed-width text for people: summary, one row per fault, then the
/// violations or "all invariants held".
std::string to_table(const run_report& r);

/// The exact nearest-rank percentile p (whole percent, 1..100) of `sorted`:
/// the smallest value with at least p% of the values at or below it; -1 if
/// empty. Integer rank arithmetic, because 0.99 * 100 is not 99 in floating
/// point.
double nearest_rank(const std::vector<double>& sorted, unsigned p);
/// nearest_rank of `values` after sorting them.
double percentile(std::vector<double> values, unsigned p);

}  // namespace exa::chaos
