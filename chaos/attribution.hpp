#pragma once
// Faults attributed: each fault's detection and the cluster's recovery from
// it, found in a run's log (either clock, one process or many).

#include <cstdint>
#include <vector>

#include "chaos/event_log.hpp"

namespace exa::chaos {

/// Adds fault_detected / fault_recovered events (with fault ids) derived from
/// the raw log: the first detection matching each fault's target after it
/// was injected, and the first moment after the disruption it caused when
/// every deployment again has `desired` ready replicas. Faults logged with a
/// ":" in their kind (":no_target", ":skipped") are not attributed.
std::vector<event> attribute_faults(std::vector<event> log, std::uint32_t desired_replicas);

}  // namespace exa::chaos
