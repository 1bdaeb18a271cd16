#include "chaos/report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/assert.hpp"

namespace exa::chaos {

namespace {

double ns_to_ms(std::int64_t ns) { return static_cast<double>(ns) / 1e6; }

struct fault_times {
  std::size_t report_index = 0;  // into run_report::faults
  std::int64_t injected_ns = 0;
  std::optional<std::int64_t> detected_ns, recovered_ns, cleared_ns;

  /// The end of the fault's window: recovery, else clearing, else never.
  std::int64_t window_end_ns() const {
    if (recovered_ns) return *recovered_ns;
    if (cleared_ns) return *cleared_ns;
    return std::numeric_limits<std::int64_t>::max();
  }
};

struct request_times {
  std::optional<std::int64_t> accepted_ns;
  bool finished = false;
  std::string outcome;
  std::string detail;  // why it errored
  double ttft_ms = -1;
  bool resumed = false;
};

void note_fault(const event& e, std::int64_t t0_ns, std::vector<fault_report>& reports,
                std::map<std::uint64_t, fault_times>& faults) {
  if (e.kind == event_kind::fault_injected) {
    auto [it, inserted] = faults.try_emplace(e.fault_id);
    if (!inserted) return;  // the first injection of an id counts
    it->second.report_index = reports.size();
    it->second.injected_ns = e.t_ns;
    reports.push_back({.id = e.fault_id, .kind = e.detail, .injected_s = static_cast<double>(e.t_ns - t0_ns) / 1e9});
    return;
  }
  auto it = faults.find(e.fault_id);
  if (it == faults.end()) return;  // detection or recovery of a fault never injected: nothing to time
  auto first = [&e](std::optional<std::int64_t>& slot) {
    if (!slot) slot = e.t_ns;
  };
  if (e.kind == event_kind::fault_detected) first(it->second.detected_ns);
  if (e.kind == event_kind::fault_recovered) first(it->second.recovered_ns);
  if (e.kind == event_kind::fault_cleared) first(it->second.cleared_ns);
}

void note_request(const event& e, std::map<std::string, request_times>& requests) {
  if (e.kind == event_kind::request_accepted) {
    request_times& r = requests[e.request_id];
    if (!r.accepted_ns) r.accepted_ns = e.t_ns;
  } else if (e.kind == event_kind::request_finished) {
    request_times& r = requests[e.request_id];
    if (r.finished) return;
    r.finished = true;
    r.outcome = e.outcome;
    r.detail = e.detail;
    r.ttft_ms = e.value_ms;
    r.resumed = e.index > 0;
  }
}

bool in_any_window(std::int64_t t_ns, const std::map<std::uint64_t, fault_times>& faults) {
  return std::any_of(faults.begin(), faults.end(), [t_ns](const auto& kv) {
    return t_ns >= kv.second.injected_ns && t_ns < kv.second.window_end_ns();
  });
}

void count_requests(const std::map<std::string, request_times>& requests,
                    const std::map<std::uint64_t, fault_times>& faults, run_report& r) {
  std::vector<double> all, during_fault, clear;
  for (const auto& [id, q] : requests) {
    const bool ttft = q.finished && q.ttft_ms >= 0;
    if (ttft) all.push_back(q.ttft_ms);
    if (!q.accepted_ns) continue;
    ++r.requests;
    if (!q.finished) ++r.lost;
    if (q.outcome == "completed") ++r.completed;
    if (q.outcome == "completed" && q.resumed) ++r.resumed;
    if (q.outcome == "error" || q.outcome == "cancelled") {
      ++r.errored;
      ++r.error_reasons[q.detail.empty() ? q.outcome : q.detail];
    }
    if (ttft) (in_any_window(*q.accepted_ns, faults) ? during_fault : clear).push_back(q.ttft_ms);
  }
  r.ttft_p50_ms = percentile(all, 50);
  r.ttft_p99_ms = percentile(all, 99);
  r.ttft_p50_fault_ms = percentile(during_fault, 50);
  r.ttft_p99_fault_ms = percentile(during_fault, 99);
  r.ttft_p50_clear_ms = percentile(clear, 50);
  r.ttft_p99_clear_ms = percentile(clear, 99);
}

/// Rounds to 3 decimals so that JSON numbers print the same for equal runs
/// and carry no float noise (12.345000000000001).
double round3(double v) { return std::round(v * 1000) / 1000; }

std::string ms_cell(double v) { return v < 0 ? std::string("-") : fmt::format("{:.1f}", v); }

}  // namespace

namespace {

// For each fault: how long requests that were streaming when it hit waited
// for their next token.
void measure_stalls(const std::vector<event>& log, run_report& r) {
  struct stream {
    std::int64_t accepted = 0, finished = -1;
    std::vector<std::int64_t> tokens;
  };
  std::map<std::string, stream> streams;
  std::map<std::uint64_t, std::int64_t> injected;
  for (const event& e : log) {
    if (e.kind == event_kind::fault_injected) injected[e.fault_id] = e.t_ns;
    if (e.kind == event_kind::request_accepted) streams[e.request_id].accepted = e.t_ns;
    if (e.kind == event_kind::request_tokens) streams[e.request_id].tokens.push_back(e.t_ns);
    if (e.kind == event_kind::request_finished && streams[e.request_id].finished < 0)
      streams[e.request_id].finished = e.t_ns;
  }
  for (fault_report& f : r.faults) {
    const auto inj = injected.find(f.id);
    if (inj == injected.end()) continue;
    for (const auto& [id, s] : streams) {
      // Streaming: started producing before the fault, still going after it.
      if (s.tokens.empty() || s.tokens.front() > inj->second || (s.finished >= 0 && s.finished <= inj->second)) continue;
      const auto next = std::upper_bound(s.tokens.begin(), s.tokens.end(), inj->second);
      const std::int64_t until = next != s.tokens.end() ? *next : (s.finished >= 0 ? s.finished : inj->second);
      ++f.in_flight;
      f.stall_max_ms = std::max(f.stall_max_ms, ns_to_ms(until - inj->second));
    }
  }
}

}  // namespace

double nearest_rank(const std::vector<double>& sorted, unsigned p) {
  EXA_ASSERT(p >= 1 && p <= 100);
  if (sorted.empty()) return -1;
  const std::size_t rank = std::max<std::size_t>(1, (p * sorted.size() + 99) / 100);
  return sorted[rank - 1];
}

double percentile(std::vector<double> values, unsigned p) {
  std::sort(values.begin(), values.end());
  return nearest_rank(values, p);
}

run_report make_report(const std::string& plan_name, std::uint64_t seed, const std::vector<event>& log,
                       std::vector<violation> violations) {
  run_report r;
  r.plan = plan_name;
  r.seed = seed;
  r.violations = std::move(violations);
  const std::int64_t t0_ns = log.empty() ? 0 : log.front().t_ns;
  std::map<std::uint64_t, fault_times> faults;
  std::map<std::string, request_times> requests;
  for (const event& e : log) {
    note_fault(e, t0_ns, r.faults, faults);
    note_request(e, requests);
  }
  for (const auto& [id, f] : faults) {
    fault_report& fr = r.faults[f.report_index];
    if (f.detected_ns) fr.detect_ms = ns_to_ms(*f.detected_ns - f.injected_ns);
    if (f.recovered_ns) fr.recover_ms = ns_to_ms(*f.recovered_ns - f.injected_ns);
  }
  count_requests(requests, faults, r);
  measure_stalls(log, r);
  if (!log.empty()) r.wall_s = static_cast<double>(log.back().t_ns - t0_ns) / 1e9;
  return r;
}

std::string to_json(const run_report& r) {
  using json = nlohmann::ordered_json;  // keys in the documented order
  json faults = json::array();
  for (const fault_report& f : r.faults)
    faults.push_back({{"id", f.id},
                      {"kind", f.kind},
                      {"injected_s", round3(f.injected_s)},
                      {"detect_ms", round3(f.detect_ms)},
                      {"recover_ms", round3(f.recover_ms)},
                      {"in_flight", f.in_flight},
                      {"stall_max_ms", round3(f.stall_max_ms)}});
  json violations = json::array();
  for (const violation& v : r.violations) violations.push_back({{"invariant", v.invariant}, {"detail", v.detail}});
  json out = {{"plan", r.plan},
              {"seed", r.seed},
              {"requests", r.requests},
              {"completed", r.completed},
              {"errored", r.errored},
              {"lost", r.lost},
              {"resumed", r.resumed},
              {"ttft_p50_ms", round3(r.ttft_p50_ms)},
              {"ttft_p99_ms", round3(r.ttft_p99_ms)},
              {"ttft_p50_fault_ms", round3(r.ttft_p50_fault_ms)},
              {"ttft_p99_fault_ms", round3(r.ttft_p99_fault_ms)},
              {"ttft_p50_clear_ms", round3(r.ttft_p50_clear_ms)},
              {"ttft_p99_clear_ms", round3(r.ttft_p99_clear_ms)},
              {"wall_s", round3(r.wall_s)},
              {"ok", r.ok()},
              {"error_reasons", r.error_reasons},
              {"faults", std::move(faults)},
              {"violations", std::move(violations)}};
  // Replace rather than throw on invalid UTF-8 in a detail: a report must
  // always print.
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string to_table(const run_report& r) {
  std::string out;
  auto line = std::back_inserter(out);
  fmt::format_to(line, "chaos plan {}  seed {}  wall {:.3f} s  {}\n", r.plan, r.seed, r.wall_s, r.ok() ? "OK" : "FAILED");
  fmt::format_to(line, "  requests {:>8}  completed {:>8}  errored {:>8}  lost {:>8}  resumed {:>6}\n", r.requests,
                 r.completed, r.errored, r.lost, r.resumed < 0 ? std::string("-") : std::to_string(r.resumed));
  fmt::format_to(line, "  ttft ms          {:>10} {:>10}\n", "p50", "p99");
  fmt::format_to(line, "    all            {:>10} {:>10}\n", ms_cell(r.ttft_p50_ms), ms_cell(r.ttft_p99_ms));
  fmt::format_to(line, "    during faults  {:>10} {:>10}\n", ms_cell(r.ttft_p50_fault_ms), ms_cell(r.ttft_p99_fault_ms));
  fmt::format_to(line, "    no fault       {:>10} {:>10}\n", ms_cell(r.ttft_p50_clear_ms), ms_cell(r.ttft_p99_clear_ms));
  fmt::format_to(line, "  {:>5}  {:<20} {:>12} {:>12} {:>12} {:>10} {:>14}\n", "fault", "kind", "injected_s",
                 "detect_ms", "recover_ms", "in_flight", "stall_max_ms");
  for (const fault_report& f : r.faults)
    fmt::format_to(line, "  {:>5}  {:<20} {:>12.3f} {:>12} {:>12} {:>10} {:>14}\n", f.id, f.kind, f.injected_s,
                   ms_cell(f.detect_ms), ms_cell(f.recover_ms), f.in_flight, ms_cell(f.stall_max_ms));
  if (r.faults.empty()) out += "  (no faults injected)\n";
  if (!r.error_reasons.empty()) {
    // The commonest first: a run where everything failed says why at once.
    std::vector<std::pair<std::uint64_t, std::string>> by_count;
    for (const auto& [why, n] : r.error_reasons) by_count.emplace_back(n, why);
    std::stable_sort(by_count.begin(), by_count.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
    out += "  errors by reason:\n";
    for (std::size_t i = 0; i < by_count.size() && i < 5; ++i)
      fmt::format_to(line, "  {:>8}  {}\n", by_count[i].first, by_count[i].second);
    if (by_count.size() > 5) fmt::format_to(line, "  {:>8}  more reasons in the JSON report\n", by_count.size() - 5);
  }
  if (r.violations.empty()) {
    out += "all invariants held\n";
    return out;
  }
  fmt::format_to(line, "violations ({}):\n", r.violations.size());
  for (const violation& v : r.violations) fmt::format_to(line, "  {:<22} {}\n", v.invariant, v.detail);
  return out;
}

}  // namespace exa::chaos
