#pragma once
// Internal to the chaos and simulation drivers: reaching the cluster from a
// driver, on either clock, and injecting one fault.

#include <caf/actor_registry.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_actor.hpp>

#include <condition_variable>
#include <mutex>
#include <optional>
#include <vector>

#include "actors/cluster_supervisor.hpp"
#include "actors/embedded_cluster.hpp"
#include "actors/messages.hpp"
#include "chaos/event_log.hpp"
#include "chaos/plan.hpp"
#include "cluster/fault_injector.hpp"

namespace exa::chaos::detail {

// What the fault side needs from the cluster, on either clock.
struct cluster_access {
  actors::embedded_cluster& cluster;
  bool virtual_time;

  std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(cluster.system().clock().now().time_since_epoch())
        .count();
  }
  void settle() {
    if (auto* s = cluster.test_scheduler()) s->run();
  }
  caf::actor node(std::uint32_t id) {
    auto controller = caf::actor_cast<caf::actor>(cluster.system().registry().get(actors::controller_atom::value));
    if (!controller) return {};
    if (virtual_time) {
      auto out = std::make_shared<caf::actor>();
      cluster.system().spawn([=](caf::event_based_actor* self) {
        self->request(controller, std::chrono::seconds(5), actors::get_node{id}).then([=](const caf::actor& a) { *out = a; });
      });
      settle();
      return *out;
    }
    caf::scoped_actor self{cluster.system()};
    caf::actor out;
    self->request(controller, std::chrono::seconds(5), actors::get_node{id})
        .receive([&](const caf::actor& a) { out = a; }, [](const caf::error&) {});
    return out;
  }
  std::vector<api::replica_status> replicas() {
    std::mutex m;
    std::condition_variable cv;
    std::optional<expected<api::cluster_status>> out;
    cluster.backend()->status([&](expected<api::cluster_status> s) {
      std::lock_guard lock(m);
      out = std::move(s);
      cv.notify_all();
    });
    settle();
    std::unique_lock lock(m);
    cv.wait_for(lock, std::chrono::seconds(10), [&] { return out.has_value(); });
    if (!out || !*out) return {};
    return (*out)->replicas;
  }
};


std::uint64_t mix(std::uint64_t x);
caf::error fault_reason(const std::string& what);

/// Applies one fault now and logs it; returns when a timed fault stops being
/// active (ns on the cluster clock), 0 for instantaneous ones.
std::int64_t inject(cluster_access& ca, cluster::fault_injector& inj, event_log& log, const scheduled_fault& f,
                    std::uint64_t seed);

}  // namespace exa::chaos::detail
