#pragma once
// Where the actors meet the chaos harness: a node's control-plane messages go
// through the fault injector (partitions, jitter, drop, delay, duplicate),
// and notable events go to the run's event log. Both are null outside chaos
// runs, and then cost one branch.

#include <caf/actor.hpp>
#include <caf/scheduled_actor.hpp>

#include <atomic>
#include <chrono>
#include <memory>

#include "cluster/event_log.hpp"
#include "cluster/fault_injector.hpp"
#include "cluster/types.hpp"

namespace exa::actors {

struct chaos_hooks {
  std::shared_ptr<cluster::fault_injector> injector;
  std::shared_ptr<cluster::event_log> log;
  /// Simulation: modeled busy time of all devices, in microseconds.
  std::shared_ptr<std::atomic<std::uint64_t>> device_busy_us;
  /// Simulation: the model store and node disks that replicas load from
  /// (sim_storage_actor); null: a load takes a fixed modeled time.
  caf::actor sim_storage;
};

inline std::int64_t clock_ns(caf::scheduled_actor* self) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(self->clock().now().time_since_epoch()).count();
}

/// The wall clock heartbeats are stamped with for clock-offset estimates:
/// the host's, or the actor clock in virtual time (where the host's would
/// mean nothing).
inline std::int64_t wall_clock_ns(caf::scheduled_actor* self, bool from_actor_clock) {
  if (from_actor_clock) return clock_ns(self);
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// Sends `msg` on `node`'s control-plane channel, as the fault injector decides.
template <class Self, class Msg>
void control_send(Self* self, const chaos_hooks& hooks, cluster::node_id node,
                  cluster::message_class cls, const caf::actor& dest, const Msg& msg) {
  if (!dest) return;
  if (!hooks.injector) {
    self->send(dest, msg);
    return;
  }
  const auto v = hooks.injector->decide(node, cls, clock_ns(self));
  if (!v.deliver) return;
  for (std::uint32_t i = 0; i < v.copies; ++i) {
    if (v.delay_ns > 0) self->delayed_send(dest, std::chrono::nanoseconds(v.delay_ns), msg);
    else self->send(dest, msg);
  }
}

/// Appends an event stamped with the actor's clock.
inline void log_event(caf::scheduled_actor* self, const chaos_hooks& hooks, cluster::event e) {
  if (!hooks.log) return;
  e.t_ns = clock_ns(self);
  hooks.log->append(std::move(e));
}

}  // namespace exa::actors
