#include "actors/cluster_supervisor.hpp"

#include <caf/actor_registry.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <spdlog/spdlog.h>

#include <map>

#include "actors/hub_actor.hpp"

namespace exa::actors {
namespace {

// Forwards exits: children's go to the supervisor, anything else ends us.
template <class State>
void trap_exits(caf::stateful_actor<State>* self) {
  self->set_exit_handler([=](const caf::exit_msg& msg) {
    if (self->state.sup->on_exit(msg)) return;
    self->state.sup->shutdown(caf::exit_reason::user_shutdown);
    self->quit(msg.reason);
  });
}

}  // namespace

void register_as(caf::actor_system& sys, caf::atom_value key, const caf::actor& handle) {
  auto& reg = sys.registry();
  reg.erase(key);
  reg.put(key, caf::actor_cast<caf::strong_actor_ptr>(handle));
}

caf::behavior nodes_supervisor(caf::stateful_actor<nodes_supervisor_state>* self, cluster_plan plan,
                               caf::actor controller, caf::actor router, caf::actor health) {
  // Node losses are routine at scale (a rack is many nodes at once): the
  // budget grows with the cluster so they never escalate into a restart of
  // the whole control plane.
  const auto budget = std::max<std::uint32_t>(plan.max_restarts, 2 * static_cast<std::uint32_t>(plan.nodes.size()));
  auto& sup = self->state.sup.emplace(self, "nodes", supervision_strategy::one_for_one, budget,
                                      std::chrono::milliseconds(plan.restart_window_ms));
  trap_exits(self);
  // Each node joins by itself when it (re)starts (node_actor), with what its
  // model cache holds.
  for (const auto& nc : plan.nodes) {
    node_context ctx{nc, controller, router, health};
    sup.add_child({"node-" + std::to_string(nc.id),
                   [ctx](caf::scheduled_actor* parent) { return parent->spawn(node_actor, ctx); },
                   restart_policy::permanent});
  }
  return {[](tick_atom) {}};
}

caf::behavior cluster_supervisor(caf::stateful_actor<cluster_supervisor_state>* self, cluster_plan plan) {
  auto& sup = self->state.sup.emplace(self, "cluster", supervision_strategy::rest_for_one, plan.max_restarts,
                                      std::chrono::milliseconds(plan.restart_window_ms));
  trap_exits(self);
  sup.on_started = [=](const std::string& name, const caf::actor& handle) {
    const auto record = [&](caf::atom_value key) { register_as(self->home_system(), key, handle); };
    if (name == "router") record(router_atom::value);
    if (name == "controller") record(controller_atom::value);
    if (name == "health-monitor") record(health_atom::value);
  };
  auto* s = &sup;
  sup.add_child({"health-monitor",
                 [plan](caf::scheduled_actor* parent) { return parent->spawn(health_monitor_actor, plan.health); },
                 restart_policy::permanent});
  sup.add_child({"router",
                 [plan](caf::scheduled_actor* parent) {
                   if (plan.router_is_hub) return parent->spawn(hub_actor);
                   return parent->spawn(router_actor, plan.router, plan.metrics);
                 },
                 restart_policy::permanent});
  sup.add_child({"controller",
                 [plan, s](caf::scheduled_actor* parent) {
                   return parent->spawn(controller_actor, plan.controller, s->child("router"),
                                        s->child("health-monitor"));
                 },
                 restart_policy::permanent});
  sup.add_child({"nodes",
                 [plan, s](caf::scheduled_actor* parent) {
                   return parent->spawn(nodes_supervisor, plan, s->child("controller"), s->child("router"),
                                        s->child("health-monitor"));
                 },
                 restart_policy::permanent});
  spdlog::info("event=cluster_started nodes={}", plan.nodes.size());
  return {[](tick_atom) {}};
}

}  // namespace exa::actors
