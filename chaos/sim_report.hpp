#pragma once
// The report of a simulation run: latency distributions, SLO attainment,
// goodput, utilization, queueing, failures and recoveries, lost requests --
// as JSON, a readable summary, and a self-contained HTML page with SVG plots
// of load, latency and replica states over time. Byte-identical for equal
// inputs (fixed number formatting, no timestamps or randomness).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace exa::chaos {

/// One finished (or failed) request, as its client saw it. Times are from
/// the start of the run except ttft_s, which is a latency.
struct sim_request_record {
  double arrival_s = 0;
  double ttft_s = -1;     // first token after arrival; -1: no token
  double finish_s = 0;    // when the last token (or the error) came
  std::uint32_t prompt_tokens = 0;
  std::uint32_t generated_tokens = 0;
  std::uint32_t max_tokens = 0;
  bool completed = false; // false: ended with an error (code in `error`)
  std::string tenant;     // the workload's, "" without tenants
  std::string error;
  std::uint32_t cached_tokens = 0;  // prompt tokens the replica found in its prefix cache (usage)
  std::string replica;              // which replica finished it
};

/// The cluster sampled every interval.
struct sim_sample {
  double t_s = 0;
  std::uint32_t arrivals = 0;           // in the interval
  std::uint32_t in_flight = 0;          // at the sample time
  std::uint32_t queued = 0;             // admitted, waiting for a replica
  std::map<std::string, std::uint32_t> replicas_by_state;
  double device_utilization = 0;        // busy fraction over the interval, all devices
  std::uint32_t idle_nodes = 0;         // nodes where no replica holds a device
  double ttft_p50_s = -1, ttft_p99_s = -1;  // of requests whose first token came in the interval
};

struct sim_fault_record {
  std::uint64_t id = 0;
  std::string kind;
  double at_s = 0;
  double detect_s = -1;   // after injection; -1: not detected
  double recover_s = -1;  // after injection; -1: not recovered
};

/// A run with the storage modelled (scenario "storage"): how fast the
/// replicas came up, and what the model store served.
struct sim_cold_start {
  bool modelled = false;
  bool staggered = false;       // load limits on (timing's), or none
  bool cache_affinity = true;
  std::uint32_t warm_nodes = 0;
  /// Replicas the deployments asked for at start (serving and standing by),
  /// and how many of them were loaded and warm at least once in the run.
  std::uint32_t replicas_wanted = 0, replicas_ready = 0;
  /// From the start of the run until the first, half and all of them were; -1: never.
  double first_ready_s = -1, half_ready_s = -1, all_ready_s = -1;
  double store_limit_bytes_per_s = 0;  // the modelled store's bandwidth
  double peak_store_bytes_per_s = 0;   // the most it served at once
  double store_bytes = 0;              // read from it in the run
  std::uint32_t fetches = 0;           // node copies from the store
  std::uint32_t loads = 0, loads_from_cache = 0;  // replica loads, those from their node's cache
};

/// A rollout the scenario started (scenario "rollouts"): the controller's
/// verdict and when it came.
struct sim_rollout_record {
  std::string deployment;
  std::string model;           // the new version's model
  double at_s = 0;             // when it was asked to start
  std::string error;           // why the start was refused ("" = started)
  std::string verdict;         // complete, rolled_back, aborted, in_progress ("" = never started)
  std::uint32_t steps = 0;     // steps it moved through after the first
  double finished_s = -1;      // when the verdict came, from the start of the run; -1: none
  std::string status;          // `rollout status` at the end of the run
};

/// The result of one run (one routing policy).
struct sim_run {
  std::string policy;
  std::vector<sim_request_record> requests;
  std::vector<sim_sample> samples;
  std::vector<sim_fault_record> faults;
  double placement_ms = 0;   // initial placement of all replicas (wall time)
  double wall_s = 0;         // wall time of the run
  std::uint64_t lost = 0;    // accepted and never finished: must be 0
  std::uint64_t peak_rss_bytes = 0;
  std::uint64_t stream_violations = 0;  // token gaps or duplicates seen by clients: must be 0
  sim_cold_start cold_start;
  std::vector<sim_rollout_record> rollouts;
  /// The replicas' prefix caches over the run, summed (the cluster's
  /// exaserve_prefix_cache_evicted_* counters at its end): cached blocks
  /// dropped, and the looked-up tokens missed whose blocks had been evicted
  /// lately (what caches twice as large would have served too). What a
  /// replica counted after its last load report is lost if it crashed.
  std::uint64_t prefix_evicted_blocks = 0, prefix_evicted_miss_tokens = 0;
};

struct sim_summary {
  std::uint64_t requests = 0, completed = 0, errored = 0, lost = 0;
  double ttft_p50_ms = -1, ttft_p90_ms = -1, ttft_p99_ms = -1;
  double tpot_p50_ms = -1, tpot_p90_ms = -1, tpot_p99_ms = -1;
  double e2e_p50_s = -1, e2e_p99_s = -1;
  double slo_attainment = 0;        // share of requests meeting both SLOs
  double goodput_tokens_per_s = 0;  // generated tokens of SLO-meeting requests per simulated second
  double throughput_tokens_per_s = 0;
  double mean_device_utilization = 0;
  double mean_queued = 0, max_queued = 0;
  /// Replicas holding devices (every state but stopped and failed: loading
  /// and standing by count), integrated over the samples, in hours; and the
  /// most of them at once.
  double replica_hours = 0;
  double peak_replicas = 0;
  /// Nodes where no replica held a device (a node that could be powered
  /// down or lent out), integrated over the samples, in hours; and the
  /// fewest of them at once.
  double idle_node_hours = 0;
  double min_idle_nodes = 0;
  /// Prefix cache, over completed requests: prompt tokens, those read from
  /// a replica's prefix cache (hit rate = cached / prompt, the prefill
  /// tokens saved). Load spread: completed requests per replica that
  /// finished any, the most of them and the mean (max / mean = 1: even).
  std::uint64_t prompt_tokens = 0, cached_tokens = 0;
  /// The run's prefix-cache turnover, as sim_run has it.
  std::uint64_t prefix_evicted_blocks = 0, prefix_evicted_miss_tokens = 0;
  std::uint32_t replicas_serving = 0;
  double requests_per_replica_max = 0, requests_per_replica_mean = 0;
  /// Per tenant, when the workload names tenants.
  struct tenant_summary {
    std::uint64_t requests = 0, completed = 0;
    double ttft_p50_ms = -1, ttft_p99_ms = -1;
  };
  std::map<std::string, tenant_summary> tenants;
};

/// Latency percentiles are exact (nearest rank) over the completed requests:
/// TTFT, TPOT = (finish - first token) / (generated - 1) for generated >= 2,
/// end to end = finish - arrival; -1 when there is none. A request meets the
/// SLO when it completed with a token, ttft <= slo_ttft_ms and tpot <=
/// slo_tpot_ms (met by definition below 2 tokens); slo_attainment is the
/// share of all requests (completed and errored) that do. Goodput and
/// throughput divide generated tokens by duration_s (0 if it is not
/// positive); utilization and queue figures average the samples.
sim_summary summarize(const sim_run& run, double slo_ttft_ms, double slo_tpot_ms, double duration_s);

struct sim_report {
  std::string scenario;
  std::uint64_t seed = 0;
  double duration_s = 0;
  double slo_ttft_ms = 0, slo_tpot_ms = 0;
  std::vector<sim_run> runs;  // one per policy compared
};

/// JSON with at least: scenario, seed, duration_s, lost (sum over runs),
/// completed, placement_ms, wall_s, ttft_p50_ms/ttft_p99_ms/tpot_p50_ms/
/// tpot_p99_ms (of the first run), and "policies": [{policy, lost, completed,
/// errored, ttft_*, tpot_*, slo_attainment, goodput_tokens_per_s, ...}],
/// "faults": [{id, kind, at_s, detect_ms, recover_ms}].
/// Precisely: top-level requests, completed, errored, placement_ms, the
/// latency percentiles, slo_attainment and goodput describe the first run;
/// lost and wall_s sum over runs; the top-level faults are the first run's,
/// and each policy carries its own (detection differs by run). Times in ms
/// and s keep 3 decimals, shares 6; -1 means none. Keys keep this order.
std::string to_json(const sim_report& r);
std::string to_text(const sim_report& r);
/// A self-contained HTML page with inline SVG: load (arrivals, in flight,
/// queued), TTFT p50/p99 over time, replicas by state over time, one line per
/// policy where it makes sense.
std::string to_html(const sim_report& r);

}  // namespace exa::chaos
