#pragma once
// Runs a chaos plan against the embedded cluster and judges it.
//
// Two clocks, one plan format:
//  - virtual: the actors on CAF's deterministic test scheduler; the workload
//    goes straight to the gateway backend; same plan and seed give the same
//    event log byte for byte (tests, many seeds in CI);
//  - real time: the actors on real threads behind the real HTTP front door,
//    the workload sent by HTTP clients (`exaserve chaos PLAN`).
// Either way faults are injected as the plan says, every request's stream is
// logged as the client saw it, and afterwards detections and recoveries are
// attributed to faults, the invariants are checked and a report is built.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "chaos/attribution.hpp"
#include "chaos/event_log.hpp"
#include "chaos/plan.hpp"
#include "chaos/report.hpp"
#include "common/error.hpp"

namespace exa::chaos {

struct run_config {
  chaos::plan plan;
  std::optional<std::uint64_t> seed;  // overrides the plan's
  std::string model_file;             // the model every deployment serves
  bool real_time = false;
  double drain_s = 30;                // after the workload: time to finish what is in flight
};

struct run_outcome {
  run_report report;
  std::vector<event> log;  // with fault detections and recoveries attributed
};

expected<run_outcome> run_plan(const run_config& config);

}  // namespace exa::chaos
