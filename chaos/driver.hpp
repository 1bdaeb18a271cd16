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
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chaos/attribution.hpp"
#include "chaos/event_log.hpp"
#include "chaos/plan.hpp"
#include "chaos/report.hpp"
#include "api/gateway.hpp"
#include "common/error.hpp"

namespace exa::chaos {

/// An HTTP front door the real-time driver sends its workload through,
/// started by the caller (the chaos library does not link the front door).
class http_door {
 public:
  virtual ~http_door() = default;
  virtual std::uint16_t http_port() const = 0;
  virtual void stop() = 0;
};
using http_door_factory = std::function<expected<std::unique_ptr<http_door>>(std::shared_ptr<api::gateway_backend>)>;

struct run_config {
  chaos::plan plan;
  std::optional<std::uint64_t> seed;  // overrides the plan's
  std::string model_file;             // the model every deployment serves
  bool real_time = false;
  http_door_factory serve_http;       // real time: required
  double drain_s = 30;                // after the workload: time to finish what is in flight
};

struct run_outcome {
  run_report report;
  std::vector<event> log;  // with fault detections and recoveries attributed
};

expected<run_outcome> run_plan(const run_config& config);

}  // namespace exa::chaos
