#pragma once
// The event log of a chaos run: what the invariant checker and the report
// read. Actors append events as they happen (thread-safe); under the
// deterministic scheduler the same plan and seed give the same log, byte for
// byte, so a failing seed replays exactly.

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"

namespace exa::cluster {

enum class event_kind : std::uint8_t {
  request_accepted,   // request_id, deployment, detail = "greedy" or "sampled", count = max_tokens
  request_tokens,     // request_id, index = first token index, tokens
  request_finished,   // request_id, outcome, detail = error code (if any), count = tokens generated,
                      // index = times it moved to another replica (0 where the client cannot see it),
                      // value_ms = TTFT (-1 if none), value2_ms = end to end
  replica_state,      // replica, deployment, slot, epoch, node, detail = lifecycle state
  node_state,         // node, detail = "healthy" | "suspect" | "confirmed" | "down" | "up"
  fault_injected,     // fault_id, detail = fault kind, node / replica / slot as targeted;
                      // kill_rack: node = the rack's first node, count = the rack stride
                      // (the rack's nodes are node, node + count, ...)
  fault_detected,     // fault_id, detail = how ("monitor", "heartbeat_suspect", "heartbeat_confirmed",
                      // "device_check", "step_timeout")
  fault_recovered,    // fault_id: the cluster serves its desired replicas again
  fault_cleared,      // fault_id: a timed fault (partition, hang, jitter) ended
  clock_offset,       // node, value_ms = this process's clock minus the controller's (ms),
                      // value2_ms = the round trip the estimate came from: merged logs
                      // of several hosts are ordered by times corrected with it
  rollout,            // deployment = the plain name, detail = "started", "step", "paused", "resumed",
                      // "complete", "rolled_back" or "aborted" (the controller's transitions),
                      // outcome = the rollout's status line then
};

std::string_view to_string(event_kind k) noexcept;

struct event {
  std::int64_t t_ns = 0;  // actor clock: virtual time in deterministic runs
  event_kind kind = event_kind::request_accepted;
  std::string request_id;
  std::string deployment;
  std::uint64_t replica = 0;
  std::int64_t slot = -1;
  std::uint64_t epoch = 0;
  std::int64_t node = -1;
  std::int64_t device = -1;
  std::uint64_t fault_id = 0;
  std::string outcome;  // request_finished: "completed" | "error" | "cancelled"; rollout: its status line
  std::string detail;
  std::uint64_t index = 0;
  std::uint64_t count = 0;
  double value_ms = 0;
  double value2_ms = 0;
  std::vector<std::int32_t> tokens;
};

/// One JSON object per event, fields in a fixed order (for byte-identical logs).
std::string to_json_line(const event& e);

class event_log {
 public:
  event_log() = default;
  ~event_log();
  event_log(const event_log&) = delete;
  event_log& operator=(const event_log&) = delete;

  /// A log for one process of a multi-process run: every event is written
  /// to `path` (created or appended to, one JSON line each) as it is
  /// appended, so a process killed with SIGKILL loses none of what it
  /// logged, and is stamped with this host's wall clock (ns since the Unix
  /// epoch) so logs of several processes can be merged. Nothing is kept in
  /// memory. Errors: io_error naming the path.
  static expected<std::shared_ptr<event_log>> to_file(const std::string& path);

  void append(event e);
  /// A copy of everything so far, in append order.
  std::vector<event> events() const;
  std::size_t size() const;
  /// Calls fn for every event appended since `cursor` and advances it: lets a
  /// driver follow a long run without copying the whole log.
  void visit_since(std::size_t& cursor, const std::function<void(const event&)>& fn) const;
  /// The whole log as JSON lines.
  std::string to_jsonl() const;

 private:
  mutable std::mutex mutex_;
  std::vector<event> events_;
  int fd_ = -1;  // to_file: the file every event goes to
  bool torn_ = false;  // the last write stopped mid-line
};

}  // namespace exa::cluster
