#pragma once
// A simulation scenario: topology, deployments, workload, fault plan, timing,
// SLOs -- as a JSON file in chaos/scenarios/. Parsing validates every field
// and names the bad one.
//
// {
//   "name": "reference",
//   "seed": 1,
//   "topology": { "nodes": 256, "gpus_per_node": 8, "racks": 16, "gpu": "h100-80gb" },
//   "deployments": [ { "name": "llama-13b", "model": "llama-2-13b", "precision": "int4",
//                      "replicas": 3072, "kv_tokens": 32768, "context_length": 16384,
//                      "max_replicas_per_node": 12, "routing": "least_outstanding",
//                      "prefix_slack_tokens": 2048, "prefix_slack_ratio": 0.25,
//                      "prefix_slack_s": 0.2 } ],
//   "workload": { "trace": "chaos/traces/azure_llm_2023_conv.csv", "rate_multiplier": 20,
//                 "conversations": { "apps": 8, "system_prompt_tokens": 1024 } }
//            or { "kind": "poisson" | "bursty", "rate_per_s": 100, "prompt_tokens": 1000,
//                 "max_tokens": 200, "burst_factor": 5, "burst_period_s": 60 },
//   "duration_s": 3600,
//   "timing": { "heartbeat_interval_ms": 2000, "suspect_after_missed": 5,
//               "observation_window_ms": 30000, "migration_parallelism": 8,
//               "request_deadline_ms": 600000 },
//   "slo": { "ttft_ms": 2000, "tpot_ms": 100 },
//   "faults": [ ...chaos plan fault objects (chaos/plan.hpp)... ,
//               { "at_s": 1800, "kind": "kill_rack", "rack": 3 } ],
//   "compare_policies": [ "round_robin", "least_outstanding", "power_of_two", "predictive" ],
//   "sample_interval_s": 10
// }
//
// Paths are relative to the repository root (where the scenario is run from)
// or absolute. "kill_rack" (sim only) kills every node of a rack at once.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "chaos/plan.hpp"
#include "common/error.hpp"
#include "engine/sim_step_stop.hpp"

namespace exa::chaos {

struct sim_topology {
  std::uint32_t nodes = 16;
  std::uint32_t gpus_per_node = 8;
  std::uint32_t racks = 1;
  std::string gpu = "h100-80gb";  // cluster::device_preset name
  /// The simulated engines' prefix cache block size in tokens (0: none),
  /// "prefix_cache_block_tokens" (actors::cluster_options::sim_prefix_block_tokens).
  std::uint32_t prefix_cache_block_tokens = 0;
  /// Whether the simulated engines stop a decode step or a prefill chunk at
  /// a layer boundary for an arriving prompt that goes before its batch,
  /// "layer_yield": false (none), true or "cpu" (as the CPU engine: every
  /// step, at the next stage boundary), "cuda" (as the CUDA engine: chunks
  /// and long decode steps, a stage later)
  /// (actors::cluster_options::sim_step_stop).
  engine::sim_step_stop layer_yield = engine::sim_step_stop::none;
};

struct sim_deployment {
  std::string name;
  std::string model = "llama-2-13b";  // cluster::model_shape_preset name
  std::string precision = "fp16";     // fp32 | fp16 | bf16 | int8 | int4
  std::uint32_t replicas = 1;
  std::uint32_t kv_tokens = 32768;
  std::optional<std::uint32_t> context_length;  // overrides the preset's
  std::optional<std::uint32_t> max_replicas_per_node;
  std::string routing = "least_outstanding";
  /// prefix_aware's load bound (api::deploy_request::prefix_slack_tokens /
  /// prefix_slack_ratio / prefix_slack_s; cluster::check_prefix_slack's
  /// ranges). Read only by prefix_aware, including when compare_policies runs it.
  std::uint64_t prefix_slack_tokens = 2048;
  double prefix_slack_ratio = 0.25;
  double prefix_slack_s = 0.2;
  /// Replicas standing by, as in api::deploy_request (default 10 %).
  std::uint32_t warm_pool_percent = 10;
  /// "autoscale": {"min": 4, "max": 64, "metric": "queue_depth", "target": 8,
  /// "idle_to_zero_s": 0}: off while max is 0. An autoscaled run starts at
  /// max(min, 1) replicas; `replicas` is the fixed fleet's size (the run
  /// without autoscaling, compare_fixed_fleet).
  std::uint32_t autoscale_min = 1;
  std::uint32_t autoscale_max = 0;
  std::string autoscale_metric = "queue_depth";
  double autoscale_target = 0;  // 0: the metric's default
  std::uint32_t idle_to_zero_s = 0;
};

enum class sim_workload_kind : std::uint8_t { trace, poisson, bursty };

/// Trace workloads: the trace's rows as turns of multi-turn conversations
/// (sim_workload.hpp, make_conversations), "conversations": {"apps": 8,
/// "system_prompt_tokens": 1024, "continue_probability": 0.6,
/// "open_max": 256, "turns_max": 16}. Off while apps is 0.
struct conversation_spec {
  std::uint32_t apps = 0;                    // applications, each with its own system prompt
  std::uint32_t system_prompt_tokens = 1024; // a new conversation's shared start (at most its prompt - 1)
  double continue_probability = 0.6;         // a row continues an open conversation when one fits
  std::uint32_t open_max = 256;              // open conversations remembered (oldest forgotten)
  std::uint32_t turns_max = 16;              // a conversation closes after this many turns
};

struct sim_workload_spec {
  sim_workload_kind kind = sim_workload_kind::trace;
  std::string trace;              // CSV path (kind == trace)
  double rate_multiplier = 1.0;   // trace: arrivals compressed by this factor
  double rate_per_s = 10;         // poisson/bursty mean rate
  std::uint32_t prompt_tokens = 1000;
  std::uint32_t max_tokens = 200;
  double burst_factor = 5;        // bursty: peak rate / mean rate
  double burst_period_s = 60;
  /// Synthetic workloads only: one arrival stream per tenant (each at its
  /// own rate, the lengths above), merged; empty: one stream, no tenant.
  struct tenant_stream {
    std::string name;
    double rate_per_s = 0;
  };
  std::vector<tenant_stream> tenants;
  /// Synthetic workloads: the first arrival comes no earlier than this
  /// (time for the replicas to load, so latencies measure serving only).
  double start_s = 0;
  /// "diurnal": {"period_s": 600, "trough": 0.2}: the rate follows a day
  /// compressed into period_s -- full at mid-period, `trough` of it at the
  /// start and end (a raised cosine) -- by keeping each arrival with that
  /// probability (seeded). period 0: off.
  double diurnal_period_s = 0;
  double diurnal_trough = 1;
  conversation_spec conversations;
};

struct sim_timing {
  std::uint32_t heartbeat_interval_ms = 2000;
  std::uint32_t suspect_after_missed = 5;
  std::uint32_t observation_window_ms = 30000;
  std::uint32_t migration_parallelism = 8;
  std::uint32_t request_deadline_ms = 600000;
  /// Requests in flight per replica (the router's limit): past it, requests
  /// wait at the router, in fair order across tenants unless fair_admission
  /// is false (then first come, first served).
  std::uint32_t in_flight_per_replica_max = 256;
  bool fair_admission = true;
  std::uint32_t tenant_headroom_slots = 2;  // see router_config
  /// Replicas loading at once (cluster, node). Unlimited by default: the
  /// simulator does not model the model store's bandwidth yet, so limits
  /// here only delay loads that would not really contend.
  std::uint32_t loads_max = 1u << 20;
  std::uint32_t loads_per_node_max = 4096;
  /// Autoscaling windows and cooldowns (actors::cluster_options autoscale_*).
  std::uint32_t autoscale_up_window_s = 10;
  std::uint32_t autoscale_down_window_s = 300;
  std::uint32_t autoscale_up_cooldown_s = 10;
  std::uint32_t autoscale_down_cooldown_s = 120;
  /// Night-time consolidation of autoscaled deployments (pack nodes, so a
  /// scale-down empties whole ones): "consolidate": true.
  bool consolidate = false;
};

/// "storage": the model store and node disks that model loads read
/// (cluster::storage_model). Absent: a load takes a fixed modeled time
/// (weights / 2 GB/s) and never contends. Bandwidths in GB/s (10^9 bytes).
struct sim_storage_spec {
  bool modelled = false;
  double store_gb_per_s = 25;        // the model store's reads, shared by every fetch
  double node_network_gb_per_s = 0;  // each node's link to the store; 0: no limit of its own
  double node_disk_gb_per_s = 3;     // each node's disk: loads from the node's cache
  /// Nodes whose cache holds every deployment's model at start, spread evenly
  /// (node i * nodes / warm_nodes for i < warm_nodes).
  std::uint32_t warm_nodes = 0;
};

/// The nodes a storage spec makes warm, ascending.
std::vector<std::uint32_t> warm_node_ids(const sim_storage_spec& storage, std::uint32_t nodes);

struct sim_slo {
  double ttft_ms = 2000;
  double tpot_ms = 100;
};

/// "rollouts": a rollout the scenario starts at `at_s` (what `exaserve-cli
/// rollout` does), of a new version whose model is another preset: slower
/// or faster than the deployment's, so that the controller's verdict
/// (runtime/cluster/rollout) promotes or rolls it back.
/// { "at_s": 60, "deployment": "llama-13b", "model": "llama-2-13b", "precision": "fp16",
///   "context_length": 16384, "steps": "10,50,100", "bake_s": 30, "surge": 1,
///   "max_unavailable": 1, "min_samples": 50 }
/// model, precision and context_length default to the deployment's; steps
/// and min_samples to the controller's (1,10,100 and 100).
struct sim_rollout {
  double at_s = 0;
  std::string deployment;
  std::string model;
  std::string precision;
  std::optional<std::uint32_t> context_length;
  std::string steps;
  std::uint32_t bake_s = 60;
  std::uint32_t surge = 1;
  std::uint32_t max_unavailable = 1;
  std::uint32_t min_samples = 0;
};

/// A scheduled fault of a scenario: a chaos fault, or (sim only) a rack loss.
struct sim_fault {
  std::optional<fault_spec> chaos;  // set for chaos fault kinds
  std::optional<std::uint32_t> kill_rack;
  double at_s = 0;
  std::uint64_t id = 0;
};

struct scenario {
  std::string name;
  std::string description;
  std::uint64_t seed = 1;
  sim_topology topology;
  std::vector<sim_deployment> deployments;
  sim_workload_spec workload;
  double duration_s = 600;
  sim_timing timing;
  sim_slo slo;
  std::vector<fault_spec> faults;       // chaos kinds, validated against the topology
  std::vector<std::pair<double, std::uint32_t>> rack_losses;  // (at_s, rack)
  std::vector<std::string> compare_policies;  // empty: run once with each deployment's routing
  /// Run each policy twice: autoscaled as the deployments say, and as a
  /// fixed fleet of `replicas` with autoscaling off (replica-hours against
  /// SLO attainment, docs/OPERATIONS.md).
  bool compare_fixed_fleet = false;
  sim_storage_spec storage;
  /// Cold start (needs "storage" and timing's load limits): run each policy
  /// four times, loads unstaggered (no limits) and staggered (timing's
  /// loads_max and loads_per_node_max), each without and with cache
  /// affinity (controller_config::cache_affinity), and report how long
  /// until every replica was ready and the store's peak read rate.
  bool compare_cold_start = false;
  std::vector<sim_rollout> rollouts;  // by time
  double sample_interval_s = 10;
};

expected<scenario> parse_scenario(const std::string& json_text);
/// Reads and parses a scenario file. A relative trace path is taken from the
/// working directory, or else from the scenario file's directory or the
/// nearest parent directory that has it.
expected<scenario> load_scenario(const std::string& path);

/// Every fault of the scenario at a concrete time (random processes expanded
/// with the seed), sorted by time, ids 1.. in that order.
std::vector<sim_fault> schedule_faults(const scenario& s, std::uint64_t seed);

}  // namespace exa::chaos
