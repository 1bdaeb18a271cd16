#pragma once
// Event logs of several processes, read back and merged. Each process of a
// multi-process run writes its own log (`--event-log`), stamped with its
// host's wall clock; clocks of different hosts differ, so each node's log
// carries clock_offset events (its clock minus the controller's, estimated
// from heartbeat round trips) and merging orders events by corrected time.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "chaos/event_log.hpp"
#include "common/error.hpp"

namespace exa::chaos {

/// Parses one line written by to_json_line. Errors (invalid_argument) name
/// the field.
expected<event> parse_event_line(std::string_view line);

struct read_log_result {
  std::vector<event> events;
  /// A last line cut short (its process died mid-write, or the disk filled)
  /// is left out and counted here; a bad line anywhere else is an error.
  std::size_t torn_lines = 0;
};

/// Reads a JSON-lines event log. Errors name the path and the line number.
/// At most `max_events` events (io_error beyond: a runaway log).
expected<read_log_result> read_event_log(const std::string& path, std::size_t max_events = 10'000'000);

/// Merges logs into one ordered by corrected time: each event's t_ns minus
/// the clock offset its log recorded last before it (for events before the
/// first offset, that first offset; 0 for a log without any). The merged
/// events carry corrected times. Stable: equal times keep the order of the
/// logs as given, and within a log the order it was written in.
std::vector<event> merge_logs(const std::vector<std::vector<event>>& logs);

}  // namespace exa::chaos
