#include "chaos/sim_report.hpp"
#include "chaos/report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string_view>
#include <utility>

#include "common/assert.hpp"

namespace exa::chaos {

namespace {

// Insertion-ordered, so the JSON reads in the order documented.
using ojson = nlohmann::ordered_json;

constexpr double nan_v = std::numeric_limits<double>::quiet_NaN();

/// Time per output token after the first, in ms; nullopt below 2 tokens or
/// without a first token.
std::optional<double> tpot_ms_of(const sim_request_record& r) {
  if (r.generated_tokens < 2 || r.ttft_s < 0) return std::nullopt;
  const double first_token_s = r.arrival_s + r.ttft_s;
  return (r.finish_s - first_token_s) * 1000 / static_cast<double>(r.generated_tokens - 1);
}

void summarize_samples(const std::vector<sim_sample>& samples, sim_summary& s) {
  if (samples.empty()) return;
  double util = 0, queued = 0;
  for (const sim_sample& x : samples) {
    util += x.device_utilization;
    queued += x.queued;
    s.max_queued = std::max(s.max_queued, static_cast<double>(x.queued));
  }
  double prev_t = 0;
  for (const sim_sample& x : samples) {
    double held = 0;
    for (const auto& [state, count] : x.replicas_by_state)
      if (state != "stopped" && state != "failed") held += count;
    s.replica_hours += held * std::max(0.0, x.t_s - prev_t) / 3600.0;
    s.peak_replicas = std::max(s.peak_replicas, held);
    s.idle_node_hours += x.idle_nodes * std::max(0.0, x.t_s - prev_t) / 3600.0;
    s.min_idle_nodes = x.t_s == samples.front().t_s ? x.idle_nodes : std::min<double>(s.min_idle_nodes, x.idle_nodes);
    prev_t = x.t_s;
  }
  const auto n = static_cast<double>(samples.size());
  s.mean_device_utilization = util / n;
  s.mean_queued = queued / n;
}

// ---------------------------------------------------------------------------
// Fixed formatting: every number goes through here, so equal inputs give
// byte-equal output and tiny float noise does not show.

double round_to(double x, int decimals) {
  if (!std::isfinite(x)) return x;
  const double scale = std::pow(10.0, decimals);
  const double r = std::round(x * scale) / scale;
  return r == 0 ? 0.0 : r;  // no "-0"
}

double ms(double x) { return round_to(x, 3); }
double share(double x) { return round_to(x, 6); }
/// A latency in seconds as ms, keeping -1 ("none").
double s_to_ms(double s) { return s < 0 ? -1.0 : ms(s * 1000); }

ojson summary_json(const sim_summary& s) {
  ojson j;
  j["requests"] = s.requests;
  j["completed"] = s.completed;
  j["errored"] = s.errored;
  j["lost"] = s.lost;
  j["ttft_p50_ms"] = ms(s.ttft_p50_ms);
  j["ttft_p90_ms"] = ms(s.ttft_p90_ms);
  j["ttft_p99_ms"] = ms(s.ttft_p99_ms);
  j["tpot_p50_ms"] = ms(s.tpot_p50_ms);
  j["tpot_p90_ms"] = ms(s.tpot_p90_ms);
  j["tpot_p99_ms"] = ms(s.tpot_p99_ms);
  j["e2e_p50_s"] = ms(s.e2e_p50_s);
  j["e2e_p99_s"] = ms(s.e2e_p99_s);
  j["slo_attainment"] = share(s.slo_attainment);
  j["goodput_tokens_per_s"] = ms(s.goodput_tokens_per_s);
  j["throughput_tokens_per_s"] = ms(s.throughput_tokens_per_s);
  j["mean_device_utilization"] = share(s.mean_device_utilization);
  j["mean_queued"] = ms(s.mean_queued);
  j["max_queued"] = ms(s.max_queued);
  j["replica_hours"] = ms(s.replica_hours);
  j["peak_replicas"] = ms(s.peak_replicas);
  j["idle_node_hours"] = ms(s.idle_node_hours);
  j["min_idle_nodes"] = ms(s.min_idle_nodes);
  j["prompt_tokens"] = s.prompt_tokens;
  j["cached_tokens"] = s.cached_tokens;
  j["prefix_hit_rate"] = share(s.prompt_tokens ? double(s.cached_tokens) / double(s.prompt_tokens) : 0.0);
  j["prefix_evicted_blocks"] = s.prefix_evicted_blocks;
  j["prefix_evicted_miss_tokens"] = s.prefix_evicted_miss_tokens;
  j["replicas_serving"] = s.replicas_serving;
  j["requests_per_replica_max"] = ms(s.requests_per_replica_max);
  j["requests_per_replica_mean"] = ms(s.requests_per_replica_mean);
  return j;
}

ojson faults_json(const std::vector<sim_fault_record>& faults) {
  ojson arr = ojson::array();
  for (const sim_fault_record& f : faults) {
    ojson j;
    j["id"] = f.id;
    j["kind"] = f.kind;
    j["at_s"] = ms(f.at_s);
    j["detect_ms"] = s_to_ms(f.detect_s);
    j["recover_ms"] = s_to_ms(f.recover_s);
    arr.push_back(std::move(j));
  }
  return arr;
}

ojson cold_start_json(const sim_cold_start& c) {
  ojson j;
  j["staggered"] = c.staggered;
  j["cache_affinity"] = c.cache_affinity;
  j["warm_nodes"] = c.warm_nodes;
  j["replicas_wanted"] = c.replicas_wanted;
  j["replicas_ready"] = c.replicas_ready;
  j["first_ready_s"] = ms(c.first_ready_s);
  j["half_ready_s"] = ms(c.half_ready_s);
  j["all_ready_s"] = ms(c.all_ready_s);
  j["store_limit_gb_per_s"] = ms(c.store_limit_bytes_per_s / 1e9);
  j["peak_store_gb_per_s"] = ms(c.peak_store_bytes_per_s / 1e9);
  j["store_tb"] = ms(c.store_bytes / 1e12);
  j["fetches"] = c.fetches;
  j["loads"] = c.loads;
  j["loads_from_cache"] = c.loads_from_cache;
  return j;
}

ojson rollouts_json(const std::vector<sim_rollout_record>& rollouts) {
  ojson arr = ojson::array();
  for (const auto& r : rollouts) {
    ojson j;
    j["deployment"] = r.deployment;
    j["model"] = r.model;
    j["at_s"] = ms(r.at_s);
    j["error"] = r.error;
    j["verdict"] = r.verdict;
    j["steps"] = r.steps;
    j["finished_s"] = ms(r.finished_s);
    j["took_s"] = r.finished_s < 0 ? -1.0 : ms(r.finished_s - r.at_s);
    j["status"] = r.status;
    arr.push_back(std::move(j));
  }
  return arr;
}

ojson policy_json(const sim_run& run, const sim_summary& s) {
  ojson j;
  j["policy"] = run.policy;
  const ojson summary = summary_json(s);
  for (const auto& [key, value] : summary.items()) j[key] = value;
  std::map<std::string, std::uint64_t> errors;
  for (const sim_request_record& r : run.requests)
    if (!r.completed) ++errors[r.error.empty() ? "unknown" : r.error];
  j["errors"] = errors;
  j["placement_ms"] = ms(run.placement_ms);
  j["wall_s"] = ms(run.wall_s);
  j["peak_rss_bytes"] = run.peak_rss_bytes;
  j["faults"] = faults_json(run.faults);
  if (run.cold_start.modelled) j["cold_start"] = cold_start_json(run.cold_start);
  if (!run.rollouts.empty()) j["rollouts"] = rollouts_json(run.rollouts);
  return j;
}

std::vector<sim_summary> summaries(const sim_report& r) {
  std::vector<sim_summary> out;
  for (const sim_run& run : r.runs) out.push_back(summarize(run, r.slo_ttft_ms, r.slo_tpot_ms, r.duration_s));
  return out;
}

}  // namespace

sim_summary summarize(const sim_run& run, double slo_ttft_ms, double slo_tpot_ms, double duration_s) {
  sim_summary s;
  s.requests = run.requests.size();
  s.lost = run.lost;
  std::vector<double> ttft_ms, tpot_ms, e2e_s;
  double all_tokens = 0, good_tokens = 0;
  std::uint64_t met = 0;
  for (const sim_request_record& r : run.requests) {
    all_tokens += r.generated_tokens;
    if (!r.completed) {
      ++s.errored;
      continue;
    }
    ++s.completed;
    e2e_s.push_back(r.finish_s - r.arrival_s);
    if (r.ttft_s >= 0) ttft_ms.push_back(r.ttft_s * 1000);
    const auto tpot = tpot_ms_of(r);
    if (tpot) tpot_ms.push_back(*tpot);
    if (r.ttft_s >= 0 && r.ttft_s * 1000 <= slo_ttft_ms && (!tpot || *tpot <= slo_tpot_ms)) {
      ++met;
      good_tokens += r.generated_tokens;
    }
  }
  for (auto* v : {&ttft_ms, &tpot_ms, &e2e_s}) std::sort(v->begin(), v->end());
  s.ttft_p50_ms = nearest_rank(ttft_ms, 50);
  s.ttft_p90_ms = nearest_rank(ttft_ms, 90);
  s.ttft_p99_ms = nearest_rank(ttft_ms, 99);
  s.tpot_p50_ms = nearest_rank(tpot_ms, 50);
  s.tpot_p90_ms = nearest_rank(tpot_ms, 90);
  s.tpot_p99_ms = nearest_rank(tpot_ms, 99);
  s.e2e_p50_s = nearest_rank(e2e_s, 50);
  s.e2e_p99_s = nearest_rank(e2e_s, 99);
  if (s.requests > 0) s.slo_attainment = static_cast<double>(met) / static_cast<double>(s.requests);
  if (duration_s > 0) {
    s.goodput_tokens_per_s = good_tokens / duration_s;
    s.throughput_tokens_per_s = all_tokens / duration_s;
  }
  summarize_samples(run.samples, s);
  std::map<std::string, std::uint64_t> per_replica;
  for (const sim_request_record& r : run.requests) {
    if (!r.completed) continue;
    s.prompt_tokens += r.prompt_tokens;
    s.cached_tokens += r.cached_tokens;
    if (!r.replica.empty()) ++per_replica[r.replica];
  }
  s.prefix_evicted_blocks = run.prefix_evicted_blocks;
  s.prefix_evicted_miss_tokens = run.prefix_evicted_miss_tokens;
  s.replicas_serving = static_cast<std::uint32_t>(per_replica.size());
  for (const auto& [replica, n] : per_replica) {
    s.requests_per_replica_max = std::max(s.requests_per_replica_max, static_cast<double>(n));
    s.requests_per_replica_mean += static_cast<double>(n) / static_cast<double>(per_replica.size());
  }
  std::map<std::string, std::vector<double>> by_tenant;
  for (const sim_request_record& r : run.requests) {
    if (r.tenant.empty()) continue;
    auto& t = s.tenants[r.tenant];
    ++t.requests;
    if (!r.completed) continue;
    ++t.completed;
    if (r.ttft_s >= 0) by_tenant[r.tenant].push_back(r.ttft_s * 1000);
  }
  for (auto& [name, v] : by_tenant) {
    std::sort(v.begin(), v.end());
    s.tenants[name].ttft_p50_ms = nearest_rank(v, 50);
    s.tenants[name].ttft_p99_ms = nearest_rank(v, 99);
  }
  return s;
}

std::string to_json(const sim_report& r) {
  const std::vector<sim_summary> sums = summaries(r);
  const sim_summary first = sums.empty() ? sim_summary{} : sums.front();
  ojson j;
  j["scenario"] = r.scenario;
  j["seed"] = r.seed;
  j["duration_s"] = ms(r.duration_s);
  j["slo_ttft_ms"] = ms(r.slo_ttft_ms);
  j["slo_tpot_ms"] = ms(r.slo_tpot_ms);
  std::uint64_t lost = 0;
  double wall_s = 0;
  for (const sim_run& run : r.runs) {
    lost += run.lost;
    wall_s += run.wall_s;
  }
  j["lost"] = lost;
  j["requests"] = first.requests;
  j["completed"] = first.completed;
  j["errored"] = first.errored;
  j["placement_ms"] = ms(r.runs.empty() ? 0.0 : r.runs.front().placement_ms);
  j["wall_s"] = ms(wall_s);
  j["ttft_p50_ms"] = ms(first.ttft_p50_ms);
  j["ttft_p99_ms"] = ms(first.ttft_p99_ms);
  j["tpot_p50_ms"] = ms(first.tpot_p50_ms);
  j["tpot_p99_ms"] = ms(first.tpot_p99_ms);
  j["slo_attainment"] = share(first.slo_attainment);
  j["goodput_tokens_per_s"] = ms(first.goodput_tokens_per_s);
  if (!first.tenants.empty()) {
    ojson tenants = ojson::object();
    for (const auto& [name, t] : first.tenants)
      tenants[name] = {{"requests", t.requests},
                       {"completed", t.completed},
                       {"ttft_p50_ms", ms(t.ttft_p50_ms)},
                       {"ttft_p99_ms", ms(t.ttft_p99_ms)}};
    j["tenants"] = std::move(tenants);
  }
  ojson policies = ojson::array();
  for (std::size_t i = 0; i < r.runs.size(); ++i) policies.push_back(policy_json(r.runs[i], sums[i]));
  j["policies"] = std::move(policies);
  j["faults"] = r.runs.empty() ? ojson::array() : faults_json(r.runs.front().faults);
  return j.dump(2) + "\n";
}

namespace {

/// "1234.5" or "-" for the -1 sentinel.
std::string num_or_dash(double v, int decimals) {
  return v < 0 ? std::string("-") : fmt::format("{:.{}f}", v, decimals);
}

std::string detect_recover(const sim_fault_record& f) {
  return fmt::format("{}/{}", num_or_dash(f.detect_s, 1), num_or_dash(f.recover_s, 1));
}

void text_faults(const sim_report& r, std::string& out) {
  if (r.runs.empty() || r.runs.front().faults.empty()) return;
  out += "\nfaults (detected / recovered, seconds after injection; - : not)\n";
  out += fmt::format("{:>4}  {:<20} {:>9}", "id", "kind", "at s");
  for (const sim_run& run : r.runs) out += fmt::format("  {:>20}", run.policy);
  out += "\n";
  for (std::size_t i = 0; i < r.runs.front().faults.size(); ++i) {
    const sim_fault_record& f = r.runs.front().faults[i];
    out += fmt::format("{:>4}  {:<20} {:>9.1f}", f.id, f.kind, f.at_s);
    for (const sim_run& run : r.runs)
      out += fmt::format("  {:>20}", i < run.faults.size() ? detect_recover(run.faults[i]) : std::string("?"));
    out += "\n";
  }
}

void text_cold_start(const sim_report& r, std::string& out) {
  if (std::none_of(r.runs.begin(), r.runs.end(), [](const sim_run& x) { return x.cold_start.modelled; })) return;
  out += "\ncold start (seconds from the start until the first / half / all replicas were ready; the model store)\n";
  out += fmt::format("{:<40} {:>11} {:>8} {:>8} {:>8} {:>15} {:>9} {:>8} {:>12}\n", "run", "ready", "first", "half",
                     "all", "store peak GB/s", "store TB", "fetches", "from cache");
  for (const sim_run& run : r.runs) {
    const sim_cold_start& c = run.cold_start;
    if (!c.modelled) continue;
    out += fmt::format("{:<40} {:>11} {:>8} {:>8} {:>8} {:>15} {:>9.2f} {:>8} {:>12}\n", run.policy,
                       fmt::format("{}/{}", c.replicas_ready, c.replicas_wanted), num_or_dash(c.first_ready_s, 1),
                       num_or_dash(c.half_ready_s, 1), num_or_dash(c.all_ready_s, 1),
                       fmt::format("{:.1f}/{:.1f}", c.peak_store_bytes_per_s / 1e9, c.store_limit_bytes_per_s / 1e9),
                       c.store_bytes / 1e12, c.fetches, fmt::format("{}/{}", c.loads_from_cache, c.loads));
  }
}

void text_rollouts(const sim_report& r, std::string& out) {
  if (std::none_of(r.runs.begin(), r.runs.end(), [](const sim_run& x) { return !x.rollouts.empty(); })) return;
  out += "\nrollouts (verdict; seconds from the start of the run; took = from the rollout's start to its verdict)\n";
  out += fmt::format("{:<28} {:<16} {:<40} {:>7} {:<12} {:>6} {:>9} {:>8}\n", "run", "deployment", "new model", "at s",
                     "verdict", "steps", "ended s", "took s");
  for (const sim_run& run : r.runs)
    for (const auto& ro : run.rollouts)
      out += fmt::format("{:<28} {:<16} {:<40} {:>7.1f} {:<12} {:>6} {:>9} {:>8}\n", run.policy, ro.deployment,
                         ro.model, ro.at_s, ro.error.empty() ? ro.verdict : "refused", ro.steps,
                         num_or_dash(ro.finished_s, 1), num_or_dash(ro.finished_s < 0 ? -1 : ro.finished_s - ro.at_s, 1));
  for (const sim_run& run : r.runs)
    for (const auto& ro : run.rollouts)
      out += fmt::format("  {} {}: {}\n", run.policy, ro.deployment, ro.error.empty() ? ro.status : ro.error);
}

}  // namespace

std::string to_text(const sim_report& r) {
  const std::vector<sim_summary> sums = summaries(r);
  std::string out = fmt::format("scenario {}  seed {}  duration {:.0f} s  SLO ttft {:.0f} ms, tpot {:.0f} ms\n\n",
                                r.scenario, r.seed, r.duration_s, r.slo_ttft_ms, r.slo_tpot_ms);
  out += fmt::format("{:<24} {:>9} {:>9} {:>7} {:>5} {:>19} {:>15} {:>15} {:>7} {:>11} {:>6} {:>8} {:>10} {:>11}\n",
                     "policy", "requests", "completed", "errored", "lost", "ttft p50/p99 ms", "tpot p50/p99 ms",
                     "e2e p50/p99 s", "SLO %", "goodput t/s", "util %", "queued", "replica-h",
                     "idle node-h");
  for (std::size_t i = 0; i < r.runs.size(); ++i) {
    const sim_summary& s = sums[i];
    out += fmt::format("{:<24} {:>9} {:>9} {:>7} {:>5} {:>19} {:>15} {:>15} {:>7.2f} {:>11.1f} {:>6.1f} {:>8.1f} {:>10.1f} {:>11.1f}\n",
                       r.runs[i].policy, s.requests, s.completed, s.errored, s.lost,
                       num_or_dash(s.ttft_p50_ms, 0) + "/" + num_or_dash(s.ttft_p99_ms, 0),
                       num_or_dash(s.tpot_p50_ms, 1) + "/" + num_or_dash(s.tpot_p99_ms, 1),
                       num_or_dash(s.e2e_p50_s, 1) + "/" + num_or_dash(s.e2e_p99_s, 1), s.slo_attainment * 100,
                       s.goodput_tokens_per_s, s.mean_device_utilization * 100, s.mean_queued, s.replica_hours,
                       s.idle_node_hours);
  }
  if (!sums.empty() && !sums.front().tenants.empty()) {
    out += "\ntenants (first policy)\n";
    out += fmt::format("{:<18} {:>9} {:>9} {:>19}\n", "tenant", "requests", "completed", "ttft p50/p99 ms");
    for (const auto& [name, t] : sums.front().tenants)
      out += fmt::format("{:<18} {:>9} {:>9} {:>19}\n", name, t.requests, t.completed,
                         num_or_dash(t.ttft_p50_ms, 0) + "/" + num_or_dash(t.ttft_p99_ms, 0));
  }
  const bool cached = std::any_of(sums.begin(), sums.end(), [](const sim_summary& s) { return s.cached_tokens > 0; });
  if (cached) {
    out += "\nprefix cache and load spread (tokens and requests: completed requests; evictions: the whole run)\n";
    // Evicted blocks: blocks the caches dropped; evicted-miss tokens: tokens
    // missed whose blocks had been evicted lately (a cache twice as large
    // would have served them).
    out += fmt::format("{:<24} {:>14} {:>14} {:>8} {:>14} {:>18} {:>9} {:>12}\n", "policy", "prompt tokens",
                       "cached tokens", "hit %", "evicted blocks", "evicted-miss tok", "replicas", "req max/mean");
    for (std::size_t i = 0; i < r.runs.size(); ++i) {
      const sim_summary& s = sums[i];
      out += fmt::format("{:<24} {:>14} {:>14} {:>8.1f} {:>14} {:>18} {:>9} {:>12}\n", r.runs[i].policy,
                         s.prompt_tokens, s.cached_tokens,
                         s.prompt_tokens ? 100.0 * s.cached_tokens / s.prompt_tokens : 0.0, s.prefix_evicted_blocks,
                         s.prefix_evicted_miss_tokens, s.replicas_serving,
                         fmt::format("{:.0f}/{:.1f}", s.requests_per_replica_max, s.requests_per_replica_mean));
    }
  }
  text_cold_start(r, out);
  text_rollouts(r, out);
  text_faults(r, out);
  return out;
}

// ---------------------------------------------------------------------------
// HTML: inline SVG line charts, no scripts, no external resources.

namespace {

struct series {
  std::string name;
  std::string color;
  bool dashed = false;
  std::vector<std::pair<double, double>> points;  // y NaN: a gap in the line
};

struct chart {
  std::string title;
  std::string y_label;
  double x_max = 1;
  std::vector<series> lines;
  std::vector<std::pair<double, std::uint64_t>> markers;  // fault times and ids
};

constexpr std::array<std::string_view, 8> palette = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                                     "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

// Layout of every chart, in SVG user units.
constexpr double svg_w = 960, svg_h = 320;
constexpr double plot_x0 = 70, plot_x1 = 700, plot_y0 = 36, plot_y1 = 272;
constexpr double legend_x = 720;

std::string escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string coord(double v) { return fmt::format("{:.1f}", v); }

/// A 1-2-5 step giving about `target` intervals over `range`.
double nice_step(double range, double target) {
  if (!(range > 0)) return 1;
  const double raw = range / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double step = norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10;
  return step * mag;
}

std::string tick_label(double v, double step) {
  const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  return fmt::format("{:.{}f}", round_to(v, decimals), decimals);
}

void svg_axes(const chart& c, double y_max, std::string& out) {
  const double x_step = nice_step(c.x_max, 8), y_step = nice_step(y_max, 5);
  const auto x_of = [&](double x) { return plot_x0 + (plot_x1 - plot_x0) * x / c.x_max; };
  const auto y_of = [&](double y) { return plot_y1 - (plot_y1 - plot_y0) * y / y_max; };
  for (int i = 0; i * y_step <= y_max * (1 + 1e-9); ++i) {
    const double y = y_of(i * y_step);
    out += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" class=\"grid\"/>\n", coord(plot_x0), coord(y),
                       coord(plot_x1), coord(y));
    out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", coord(plot_x0 - 6), coord(y + 4),
                       tick_label(i * y_step, y_step));
  }
  for (int i = 0; i * x_step <= c.x_max * (1 + 1e-9); ++i) {
    const double x = x_of(i * x_step);
    out += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" class=\"axis\"/>\n", coord(x), coord(plot_y1),
                       coord(x), coord(plot_y1 + 5));
    out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", coord(x), coord(plot_y1 + 18),
                       tick_label(i * x_step, x_step));
  }
  out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"frame\"/>\n", coord(plot_x0),
                     coord(plot_y0), coord(plot_x1 - plot_x0), coord(plot_y1 - plot_y0));
  out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">time (s)</text>\n",
                     coord((plot_x0 + plot_x1) / 2), coord(svg_h - 10));
  out += fmt::format("<text x=\"16\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {})\">{}</text>\n",
                     coord((plot_y0 + plot_y1) / 2), coord((plot_y0 + plot_y1) / 2), escape(c.y_label));
}

void svg_series(const chart& c, const series& s, double y_max, std::string& out) {
  const auto x_of = [&](double x) { return plot_x0 + (plot_x1 - plot_x0) * std::clamp(x, 0.0, c.x_max) / c.x_max; };
  const auto y_of = [&](double y) { return plot_y1 - (plot_y1 - plot_y0) * std::clamp(y, 0.0, y_max) / y_max; };
  std::string pts;
  const auto flush = [&] {
    if (!pts.empty())
      out += fmt::format("<polyline points=\"{}\" stroke=\"{}\"{} class=\"line\"/>\n", pts, s.color,
                         s.dashed ? " stroke-dasharray=\"6 3\"" : "");
    pts.clear();
  };
  for (const auto& [x, y] : s.points) {
    if (std::isnan(y)) {
      flush();
      continue;
    }
    pts += fmt::format("{}{},{}", pts.empty() ? "" : " ", coord(x_of(x)), coord(y_of(y)));
  }
  flush();
}

void svg_legend(const chart& c, std::string& out) {
  for (std::size_t i = 0; i < c.lines.size(); ++i) {
    const series& s = c.lines[i];
    const double y = plot_y0 + 8 + 16 * static_cast<double>(i);
    out += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\"{} class=\"line\"/>\n",
                       coord(legend_x), coord(y), coord(legend_x + 24), coord(y), s.color,
                       s.dashed ? " stroke-dasharray=\"6 3\"" : "");
    out += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", coord(legend_x + 30), coord(y + 4), escape(s.name));
  }
}

std::string render_chart(const chart& c) {
  double y_max = 0;
  for (const series& s : c.lines)
    for (const auto& [x, y] : s.points)
      if (!std::isnan(y)) y_max = std::max(y_max, y);
  // Round the top up to a tick so the highest line does not touch the frame.
  const double step = nice_step(y_max > 0 ? y_max : 1, 5);
  y_max = std::max(step, std::ceil(y_max / step) * step);
  std::string out = fmt::format(
      "<figure>\n<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {} {}\" width=\"{}\" height=\"{}\" "
      "role=\"img\">\n<title>{}</title>\n<text x=\"{}\" y=\"20\" class=\"title\">{}</text>\n",
      svg_w, svg_h, svg_w, svg_h, escape(c.title), coord(plot_x0), escape(c.title));
  svg_axes(c, y_max, out);
  for (const auto& [t, id] : c.markers) {
    const double x = plot_x0 + (plot_x1 - plot_x0) * std::clamp(t, 0.0, c.x_max) / c.x_max;
    out += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" class=\"fault\"/>\n", coord(x), coord(plot_y0),
                       coord(x), coord(plot_y1));
    out += fmt::format("<text x=\"{}\" y=\"{}\" class=\"fault-id\">{}</text>\n", coord(x + 2), coord(plot_y0 + 10),
                       id);
  }
  for (const series& s : c.lines) svg_series(c, s, y_max, out);
  svg_legend(c, out);
  out += "</svg>\n</figure>\n";
  return out;
}

std::string color_of(std::size_t i) { return std::string(palette[i % palette.size()]); }

/// Arrivals per second of each sample interval.
std::vector<std::pair<double, double>> arrival_rates(const std::vector<sim_sample>& samples) {
  std::vector<std::pair<double, double>> out;
  double prev_t = 0;
  for (const sim_sample& s : samples) {
    const double dt = s.t_s - prev_t;
    out.emplace_back(s.t_s, dt > 0 ? s.arrivals / dt : nan_v);
    prev_t = s.t_s;
  }
  return out;
}

chart base_chart(const sim_report& r, std::string title, std::string y_label) {
  chart c;
  c.title = std::move(title);
  c.y_label = std::move(y_label);
  c.x_max = r.duration_s > 0 ? r.duration_s : 1;
  if (!r.runs.empty())
    for (const sim_fault_record& f : r.runs.front().faults) c.markers.emplace_back(f.at_s, f.id);
  return c;
}

chart load_chart(const sim_report& r) {
  chart c = base_chart(r, "Load: arrivals, requests in flight, requests queued", "requests (arrivals: per s)");
  if (!r.runs.empty()) c.lines.push_back({"arrivals /s", "#7f7f7f", false, arrival_rates(r.runs.front().samples)});
  for (std::size_t i = 0; i < r.runs.size(); ++i) {
    series in_flight{r.runs[i].policy + " in flight", color_of(i), false, {}};
    series queued{r.runs[i].policy + " queued", color_of(i), true, {}};
    for (const sim_sample& s : r.runs[i].samples) {
      in_flight.points.emplace_back(s.t_s, s.in_flight);
      queued.points.emplace_back(s.t_s, s.queued);
    }
    c.lines.push_back(std::move(in_flight));
    c.lines.push_back(std::move(queued));
  }
  return c;
}

chart ttft_chart(const sim_report& r) {
  chart c = base_chart(r, "Time to first token over time (p99 solid, p50 dashed)", "TTFT (ms)");
  for (std::size_t i = 0; i < r.runs.size(); ++i) {
    series p99{r.runs[i].policy + " p99", color_of(i), false, {}};
    series p50{r.runs[i].policy + " p50", color_of(i), true, {}};
    for (const sim_sample& s : r.runs[i].samples) {
      p99.points.emplace_back(s.t_s, s.ttft_p99_s < 0 ? nan_v : s.ttft_p99_s * 1000);
      p50.points.emplace_back(s.t_s, s.ttft_p50_s < 0 ? nan_v : s.ttft_p50_s * 1000);
    }
    c.lines.push_back(std::move(p99));
    c.lines.push_back(std::move(p50));
  }
  return c;
}

/// One chart per run: a line per replica state, colored alike in every chart.
chart replica_chart(const sim_report& r, const sim_run& run, const std::set<std::string>& states) {
  chart c = base_chart(r, "Replicas by state: " + run.policy, "replicas");
  std::size_t color = 0;
  for (const std::string& state : states) {
    series s{state, color_of(color++), false, {}};
    for (const sim_sample& x : run.samples) {
      const auto it = x.replicas_by_state.find(state);
      s.points.emplace_back(x.t_s, it == x.replicas_by_state.end() ? 0.0 : it->second);
    }
    c.lines.push_back(std::move(s));
  }
  return c;
}

void html_summary(const sim_report& r, std::string& out) {
  const std::vector<sim_summary> sums = summaries(r);
  out += "<table>\n<tr><th>policy</th><th>requests</th><th>completed</th><th>errored</th><th>lost</th>"
         "<th>TTFT p50 / p99 (ms)</th><th>TPOT p50 / p99 (ms)</th><th>e2e p50 / p99 (s)</th><th>SLO met</th>"
         "<th>goodput (tok/s)</th><th>throughput (tok/s)</th><th>utilization</th><th>queued mean / max</th></tr>\n";
  for (std::size_t i = 0; i < r.runs.size(); ++i) {
    const sim_summary& s = sums[i];
    out += fmt::format(
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} / {}</td><td>{} / {}</td><td>{} / {}</td>"
        "<td>{:.2f}%</td><td>{:.1f}</td><td>{:.1f}</td><td>{:.1f}%</td><td>{:.1f} / {:.0f}</td></tr>\n",
        escape(r.runs[i].policy), s.requests, s.completed, s.errored, s.lost, num_or_dash(s.ttft_p50_ms, 0),
        num_or_dash(s.ttft_p99_ms, 0), num_or_dash(s.tpot_p50_ms, 1), num_or_dash(s.tpot_p99_ms, 1),
        num_or_dash(s.e2e_p50_s, 2), num_or_dash(s.e2e_p99_s, 2), s.slo_attainment * 100, s.goodput_tokens_per_s,
        s.throughput_tokens_per_s, s.mean_device_utilization * 100, s.mean_queued, s.max_queued);
  }
  out += "</table>\n";
}

void html_faults(const sim_report& r, std::string& out) {
  if (r.runs.empty() || r.runs.front().faults.empty()) return;
  out += "<h2>Faults</h2>\n<p>Detected / recovered, seconds after injection (- : not).</p>\n<table>\n"
         "<tr><th>id</th><th>kind</th><th>at (s)</th>";
  for (const sim_run& run : r.runs) out += "<th>" + escape(run.policy) + "</th>";
  out += "</tr>\n";
  for (std::size_t i = 0; i < r.runs.front().faults.size(); ++i) {
    const sim_fault_record& f = r.runs.front().faults[i];
    out += fmt::format("<tr><td>{}</td><td>{}</td><td>{:.1f}</td>", f.id, escape(f.kind), f.at_s);
    for (const sim_run& run : r.runs)
      out += "<td>" + (i < run.faults.size() ? detect_recover(run.faults[i]) : std::string("?")) + "</td>";
    out += "</tr>\n";
  }
  out += "</table>\n";
}

constexpr std::string_view html_style =
    "body{font-family:sans-serif;margin:24px;color:#222}"
    "table{border-collapse:collapse;margin:8px 0 24px}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
    "td:first-child,th:first-child{text-align:left}"
    "svg{font-size:11px;background:#fff}"
    "svg .title{font-size:14px;font-weight:bold}"
    "svg .grid{stroke:#e5e5e5}svg .axis{stroke:#444}svg .frame{fill:none;stroke:#444}"
    "svg .line{fill:none;stroke-width:1.5}"
    "svg .fault{stroke:#e41a1c;stroke-opacity:0.35}svg .fault-id{fill:#e41a1c;font-size:9px}"
    "figure{margin:0 0 16px}";

}  // namespace

std::string to_html(const sim_report& r) {
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  out += "<title>ExaServe simulation: " + escape(r.scenario) + "</title>\n";
  out += "<style>" + std::string(html_style) + "</style>\n</head>\n<body>\n";
  out += "<h1>Simulation: " + escape(r.scenario) + "</h1>\n";
  out += fmt::format("<p>seed {}, {:.0f} simulated seconds, SLO: TTFT &le; {:.0f} ms, TPOT &le; {:.0f} ms. "
                     "Red lines mark faults (by id).</p>\n",
                     r.seed, r.duration_s, r.slo_ttft_ms, r.slo_tpot_ms);
  html_summary(r, out);
  out += "<h2>Load</h2>\n" + render_chart(load_chart(r));
  out += "<h2>Latency</h2>\n" + render_chart(ttft_chart(r));
  std::set<std::string> states;
  for (const sim_run& run : r.runs)
    for (const sim_sample& s : run.samples)
      for (const auto& [state, n] : s.replicas_by_state) states.insert(state);
  out += "<h2>Replicas</h2>\n";
  for (const sim_run& run : r.runs) out += render_chart(replica_chart(r, run, states));
  html_faults(r, out);
  out += "</body>\n</html>\n";
  return out;
}

}  // namespace exa::chaos
