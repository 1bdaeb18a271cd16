#pragma once
// `exaserve chaos PLAN --processes`: the plan run against a real cluster of
// processes. A controller, the plan's nodes and gateways start as separate
// exaserve processes (each node in a network namespace of its own when this
// machine allows it, else all on loopback); faults are signals to those
// processes and cuts of their links; the workload is streamed HTTP through
// the gateways. Afterwards every process's event log is read back, merged
// by clock-corrected time with the driver's own (what the clients saw), and
// the invariants are checked across all of them.

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "chaos/event_log.hpp"
#include "chaos/plan.hpp"
#include "chaos/report.hpp"
#include "common/error.hpp"

namespace exa::chaos {

enum class process_network : std::uint8_t {
  automatic,   // namespaces where they work, else loopback
  loopback,    // every process on 127.0.0.1; partition and netem faults are skipped
  namespaces,  // each node in its own namespace; unavailable is an error
};

struct process_run_config {
  chaos::plan plan;
  std::optional<std::uint64_t> seed;  // overrides the plan's
  std::string model_file;             // the model every deployment serves
  std::string exaserve_bin;           // the exaserve binary the processes run
  std::string work_dir;               // created: certificates, state, event logs, process output
  process_network network = process_network::automatic;
  double drain_s = 30;                // after the workload: time to finish and recover
  double start_timeout_s = 60;        // each process's start, and the cluster's readiness
  /// Set (from a signal handler, say) to end the run early: the processes
  /// are stopped, the namespaces removed, and the run returns `cancelled`.
  const std::atomic<bool>* interrupted = nullptr;
};

struct process_run_outcome {
  run_report report;
  std::vector<event> log;              // merged, clock-corrected, faults attributed
  bool namespaces = false;             // the nodes had network namespaces
  std::vector<std::string> skipped;    // faults not injected, each with the reason
  std::vector<std::string> event_logs; // every process's event log file
};

/// Whether this machine can give each node a network namespace (root,
/// `ip netns`, veth pairs).
bool network_namespaces_available();

/// Runs the plan (check_plan_mode(plan, true) must hold). Errors: a process
/// that would not start (with its output), a cluster not ready in time.
expected<process_run_outcome> run_processes(const process_run_config& config);

}  // namespace exa::chaos
