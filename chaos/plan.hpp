#pragma once
// A chaos plan: the cluster to build, the workload to run, and the faults to
// inject -- as data (JSON files in chaos/plans/). Parsing validates every
// field and names the bad one.
//
// {
//   "name": "replica-kill",
//   "seed": 1,
//   "cluster": { "nodes": 4, "devices_per_node": 2, "racks": 2, "replicas": 4, "engine": "cpu",
//                "heartbeat_interval_ms": 2000, "suspect_after_missed": 5,
//                "observation_window_ms": 30000, "device_check_interval_ms": 30000,
//                "request_deadline_ms": 120000, "migration_parallelism": 4 },
//   "workload": { "kind": "steady" | "ramp" | "chaos", "rate_per_s": 20, "end_rate_per_s": 200,
//                 "duration_s": 60, "prompt_tokens": 16, "max_tokens": 32, "temperature": 0,
//                 "prompts": 8 },
//   "faults": [
//     { "at_s": 10, "kind": "kill_replica", "node": 1 },              // a replica on node 1 (seeded pick)
//     { "at_s": 12, "kind": "kill_replica" },                          // any replica (seeded pick)
//     { "at_s": 20, "kind": "kill_node", "node": 2 },
//     { "at_s": 30, "kind": "partition_node", "node": 1, "duration_s": 40 },
//     { "at_s": 30, "kind": "heartbeat_jitter", "node": 1, "delay_ms": 4000, "duration_s": 6 },
//     { "at_s": 40, "kind": "fail_device", "node": 0, "device": 1 },
//     { "at_s": 50, "kind": "hang_device", "node": 0, "device": 0, "duration_s": 10 },
//     { "at_s": 60, "kind": "slow_model_load", "node": 3, "delay_ms": 5000, "duration_s": 60 },
//     { "at_s": 10, "kind": "slow_device", "node": 1, "device": 0, "delay_ms": 3000, "duration_s": 20 },
//     { "at_s": 5, "kind": "drop_messages", "node": 1, "probability": 0.5, "duration_s": 20 },
//     { "at_s": 5, "kind": "delay_messages", "node": 1, "delay_ms": 300, "duration_s": 20 },
//     { "at_s": 5, "kind": "duplicate_messages", "node": 1, "probability": 0.3, "duration_s": 20 },
//     { "kind": "kill_replica", "rate_per_min": 6, "from_s": 0, "to_s": 60 }   // random times from the seed
//   ]
//   // --processes plans (chaos/plans/process-*.json) use process faults instead:
//   //   kill_process / stop_process [duration_s] / cont_process / partition_host / netem (node),
//   //   kill_controller, restart_controller, kill_gateway (gateway); "cluster" may set "gateways".
// }
//
// Message faults act on the control-plane channel of a node (its heartbeats,
// replica events and load reports to the control plane): that is what
// network jitter and partitions disturb in a real cluster.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"

namespace exa::chaos {

enum class fault_kind : std::uint8_t {
  kill_replica,
  kill_node,
  partition_node,
  heartbeat_jitter,
  fail_device,
  hang_device,
  slow_model_load,
  drop_messages,
  delay_messages,
  duplicate_messages,
  kill_router,          // the control-plane actors, inside one process:
  kill_controller,      // their supervisor restarts them (rest_for_one)
  kill_health_monitor,
  // Process mode (`exaserve chaos PLAN --processes`): real processes.
  kill_process,         // SIGKILL the node process `node`
  stop_process,         // SIGSTOP it (SIGCONT after duration_s when given)
  cont_process,         // SIGCONT it
  partition_host,       // cut the node's network namespace off for duration_s
  netem,                // delay_ms and/or loss (probability) on the node's link for duration_s
  restart_controller,   // start the controller again on its state directory and port
  kill_gateway,         // SIGKILL gateway `gateway`
  slow_device,          // every step on device `device` of `node` takes delay_ms longer for duration_s
};

std::string_view to_string(fault_kind k) noexcept;
std::optional<fault_kind> fault_kind_from_string(std::string_view s) noexcept;

struct cluster_spec {
  std::uint32_t nodes = 4;
  std::uint32_t devices_per_node = 2;
  std::uint32_t racks = 1;
  std::uint32_t replicas = 4;
  std::string engine = "cpu";  // "cpu" or "null"
  std::uint32_t heartbeat_interval_ms = 2000;
  std::uint32_t suspect_after_missed = 5;
  std::uint32_t observation_window_ms = 30000;
  std::uint32_t device_check_interval_ms = 30000;
  std::uint32_t request_deadline_ms = 120000;
  std::uint32_t migration_parallelism = 4;
  std::uint32_t gateways = 1;  // --processes: gateway processes the workload is spread over
  std::uint32_t degraded_step_ms = 5000;  // median step latency that makes a replica degraded
  std::uint32_t degraded_replace_after_ms = 120000;  // degraded this long: replaced (0: never)
};

enum class workload_kind : std::uint8_t { steady, ramp, chaos };

struct workload_spec {
  workload_kind kind = workload_kind::steady;
  double rate_per_s = 10;       // steady rate; ramp start rate
  double end_rate_per_s = 100;  // ramp end rate
  double duration_s = 60;
  std::uint32_t prompt_tokens = 16;
  std::uint32_t max_tokens = 32;
  double temperature = 0;       // 0: greedy (outputs checked against a failure-free run)
  std::uint32_t prompts = 8;    // distinct prompts cycled through
};

/// One fault, either at a time (`at_s`) or as a seeded random process
/// (`rate_per_min` between from_s and to_s), expanded by schedule().
/// from_s defaults to 0 and to_s to the workload's duration. Each kind takes
/// only the fields it uses (node, device, duration_s, delay_ms, probability);
/// parse_plan rejects the others so a misplaced field is not silently ignored.
struct fault_spec {
  fault_kind kind = fault_kind::kill_replica;
  std::optional<double> at_s;
  std::optional<double> rate_per_min;
  double from_s = 0;
  double to_s = 0;
  std::optional<std::uint32_t> node;
  std::optional<std::uint32_t> device;
  double duration_s = 0;
  std::uint32_t delay_ms = 0;
  double probability = 1.0;
  std::optional<std::uint32_t> gateway;  // kill_gateway
};

struct plan {
  std::string name;         // [A-Za-z0-9._-], at most max_plan_name_chars
  std::string description;  // optional free text: what the plan exercises and expects
  std::uint64_t seed = 1;
  cluster_spec cluster;
  workload_spec workload;
  std::vector<fault_spec> faults;
};

/// Bounds a plan is checked against (habit 7: put a limit on everything).
inline constexpr std::size_t max_plan_bytes = 1 << 20;
inline constexpr std::size_t max_plan_name_chars = 64;
inline constexpr std::size_t max_plan_description_chars = 4096;
inline constexpr std::size_t max_faults = 1024;
/// Expected events of one random fault process (rate x window).
inline constexpr double max_random_faults_per_process = 10000;
/// Expected requests of a workload (average rate x duration).
inline constexpr double max_workload_requests = 1000000;

/// Parses and validates a plan. Errors (invalid_argument) name the field:
/// "faults[2].node: 7 is not a node of a 4-node cluster".
expected<plan> parse_plan(const std::string& json_text);
/// Whether a fault kind acts on real processes only (kill_process ...
/// kill_gateway); kill_controller acts on either.
bool is_process_fault(fault_kind k) noexcept;

/// Whether a plan's faults suit the way it is run: inside one process
/// (actors killed, control-plane channels disturbed) or as real processes
/// (`--processes`: processes killed and frozen, hosts cut off). kill_controller
/// suits both (its actor, or its process). The error names the fault.
expected<void> check_plan_mode(const plan& p, bool processes);

/// Reads and parses a plan file; io_error names the path, and parse errors are
/// prefixed with it.
expected<plan> load_plan(const std::string& path);

/// A fault at a concrete time, with a stable id (1, 2, ... in time order).
struct scheduled_fault {
  std::uint64_t id = 0;
  double at_s = 0;
  fault_spec spec;
};

/// Expands random fault processes with the plan's seed (or `seed` when
/// given) and sorts everything by time; equal seeds give equal schedules.
std::vector<scheduled_fault> schedule(const plan& p, std::optional<std::uint64_t> seed = std::nullopt);

/// One request of the workload.
struct scheduled_request {
  std::string id;   // "w<index>"
  double at_s = 0;
  std::uint32_t prompt = 0;  // index into the prompt set
  std::uint32_t max_tokens = 0;
  float temperature = 0;
  std::uint64_t seed = 0;
};

/// Arrival times (Poisson process at the workload's rate, linearly rising
/// for "ramp"), prompts cycled, from the seed.
std::vector<scheduled_request> schedule_workload(const plan& p, std::optional<std::uint64_t> seed = std::nullopt);

/// The text of prompt `index` of the workload (deterministic, `prompt_tokens`
/// bytes long, printable ASCII). It starts with a two-character tag of the
/// index, so prompts differ for every index below 4096 when prompt_tokens >= 2
/// (below 64 when prompt_tokens == 1; parse_plan rejects more prompts then).
std::string workload_prompt(const workload_spec& w, std::uint32_t index);

}  // namespace exa::chaos
