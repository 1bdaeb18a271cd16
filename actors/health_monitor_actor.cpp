#include "actors/health_monitor_actor.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>

#include <chrono>

namespace exa::actors {

caf::behavior health_monitor_actor(caf::stateful_actor<health_monitor_state>* self, health_config config) {
  self->state.config = config;
  return {
      [=](const heartbeat& hb) {
        auto& n = self->state.nodes[hb.node];
        n.sequence = std::max(n.sequence, hb.sequence);
        n.last_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(self->clock().now().time_since_epoch()).count();
      },
  };
}

}  // namespace exa::actors
