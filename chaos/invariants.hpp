#pragma once
// Invariants a chaos run must keep, checked over its event log.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "chaos/event_log.hpp"

namespace exa::chaos {

struct invariant_inputs {
  /// Failure-free greedy output per request id (only greedy requests).
  std::map<std::string, std::vector<std::int32_t>> expected_tokens;
  /// Replicas each deployment should have once the run settles.
  std::map<std::string, std::uint32_t> desired_replicas;
};

struct violation {
  std::string invariant;  // "lost_request", "token_gap", "duplicate_token", "output_mismatch",
                          // "two_serving_replicas", "not_recovered", "unordered_events";
                          // and for malformed request streams: "finished_twice",
                          // "unaccepted_request", "accepted_twice", "tokens_after_finish",
                          // "bad_outcome"
  std::string detail;     // names the request / slot / replica, the event index (#n) and the numbers

  friend bool operator==(const violation&, const violation&) = default;
};

/// At most this many violations are listed per invariant; one more entry
/// then says how many were left out (a broken run must not flood the report).
inline constexpr std::size_t max_violations_per_invariant = 50;

/// Checks:
///  - every accepted request finished exactly once (completed, or an error/
///    cancellation with a code): none lost;
///  - each request's token events are contiguous from index 0: no gap, no
///    duplicate (a re-sent index is a duplicate, even with a different
///    token); a completed request streamed exactly `count` tokens;
///  - a completed greedy request's tokens equal the failure-free output
///    (requests without an entry in expected_tokens are not compared);
///  - never two replicas of one (deployment, slot) ready or serving at the
///    same time, whatever their epochs, and never a replica of an older epoch
///    ready or serving after a newer epoch of its slot was;
///  - at the end of the log every deployment has its desired number of
///    replicas (bound to a slot) ready or serving;
///  - event times never go backwards.
/// A replica stops being ready or serving when a replica_state event says
/// so, and also when it is killed without a chance to say so: a
/// fault_injected "kill_replica" naming it, or a "kill_node", "kill_process"
/// or "stop_process" fault or a node_state "down" for the node it last
/// reported from (a frozen process's replicas cannot serve; if one says it
/// is ready or serving after it wakes, that counts).
std::vector<violation> check_invariants(const std::vector<event>& log, const invariant_inputs& inputs);

/// Replicas (bound to a slot) ready or serving at the end of the log, per
/// deployment, by the same rules: how a driver sees a cluster come up or
/// recover from its processes' logs.
std::map<std::string, std::uint32_t> replicas_up(const std::vector<event>& log);

}  // namespace exa::chaos
