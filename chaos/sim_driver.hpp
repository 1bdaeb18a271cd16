#pragma once
// exaserve sim: the real controller, router, health monitor, node, device and
// replica actors under CAF's deterministic scheduler, with devices and
// engines replaced by the cost model (engine::sim_engine), driven by a
// scenario's workload and faults. Time advances from event to event (the next
// timer, arrival, fault or sample), never token by token. Equal inputs and
// seed give byte-identical reports.

#include <cstdint>
#include <optional>
#include <string>

#include "chaos/sim_report.hpp"
#include "chaos/sim_scenario.hpp"
#include "common/error.hpp"

namespace exa::chaos {

struct sim_config {
  chaos::scenario scenario;
  std::optional<std::uint64_t> seed;
  std::optional<double> rate_multiplier;  // overrides the scenario's
  std::optional<double> duration_s;       // overrides the scenario's
  double drain_s = 600;                   // after the workload: time to finish in-flight requests
};

/// Runs the scenario once per compared policy (or once) and reports.
expected<sim_report> run_simulation(const sim_config& config);

}  // namespace exa::chaos
