#pragma once
// The client side of a chaos run, shared by the one-process and the
// multi-process drivers: the schedule, the failure-free reference outputs,
// and streamed HTTP requests logged as their client sees them.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "chaos/event_log.hpp"
#include "chaos/plan.hpp"
#include "common/error.hpp"

namespace exa::chaos {

/// The deployment every chaos workload request names.
inline constexpr const char* workload_deployment = "chaos";

struct timeline {
  std::vector<scheduled_fault> faults;
  std::vector<scheduled_request> requests;
  std::int64_t settle_ns = 0;      // after the last fault ends: time to recover
  std::int64_t last_fault_end_ns = 0;
};

timeline make_timeline(const plan& p, std::uint64_t seed);

/// The failure-free greedy output of every greedy request, computed on the
/// engine directly (or the zero-cost engine's rule), by request id.
expected<std::map<std::string, std::vector<std::int32_t>>> expected_outputs(
    const std::string& model_file, const plan& p, const std::vector<scheduled_request>& requests);

void log_accepted(event_log& log, std::int64_t t, const scheduled_request& r);

/// Timed faults still active: (when it ends, fault id).
using pending_clears = std::vector<std::pair<std::int64_t, std::uint64_t>>;

/// Logs fault_cleared for every timed fault that has ended by `now_ns`.
void log_cleared(event_log& log, pending_clears& clears, std::int64_t now_ns);

/// One streamed completion request to 127.0.0.1:port, logged as its client sees it: accepted, every token
/// chunk with its index, and how it finished (a client-side failure, an
/// HTTP error or an error event in the stream is an "error" outcome).
void http_request(std::uint16_t port, const plan& p, const scheduled_request& r, event_log& log,
                  const std::function<std::int64_t()>& now);

}  // namespace exa::chaos
