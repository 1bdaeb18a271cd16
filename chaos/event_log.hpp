#pragma once
// The event log lives in runtime/cluster (the actors write it, and actors/
// must not depend on chaos/); the chaos harness reads it under its old names.

#include "cluster/event_log.hpp"

namespace exa::chaos {

using cluster::event;
using cluster::event_kind;
using cluster::event_log;
using cluster::to_json_line;
using cluster::to_string;

}  // namespace exa::chaos
