#pragma once
// The root of the supervision tree:
//
//   cluster_supervisor (rest_for_one)
//   ├── health_monitor
//   ├── router
//   ├── controller
//   └── nodes (one_for_one)
//       └── node[n] ── device[g], model_cache (one_for_one), replica[r] (restarted in place)
//
// rest_for_one because each child holds handles to the ones before it: a
// restarted router means a controller and nodes that know the new one. The
// router and controller register themselves in the actor registry (by atom)
// so the gateway bridge always reaches the current ones.

#include <caf/fwd.hpp>

#include <memory>
#include <optional>
#include <vector>

#include "actors/controller_actor.hpp"
#include "actors/health_monitor_actor.hpp"
#include "actors/node_actor.hpp"
#include "actors/router_actor.hpp"
#include "actors/supervisor.hpp"

namespace exa::actors {

using router_atom = caf::atom_constant<caf::atom("router")>;
using controller_atom = caf::atom_constant<caf::atom("controller")>;
using health_atom = caf::atom_constant<caf::atom("health")>;

/// Registers `handle` under `key`, replacing what was there: the registry's
/// put() keeps an existing entry, so a restarted actor would otherwise stay
/// hidden behind its dead predecessor.
void register_as(caf::actor_system& sys, caf::atom_value key, const caf::actor& handle);

struct cluster_plan {
  health_config health;
  router_config router;
  controller_config controller;
  std::vector<node_config> nodes;
  std::shared_ptr<cluster_metrics> metrics;
  /// The controller process of the distributed cluster: a hub stands where
  /// the router would be, and the gateways' routers subscribe to it.
  bool router_is_hub = false;
  std::uint32_t max_restarts = 5;        // per supervisor, within the window
  std::uint32_t restart_window_ms = 60000;
};

struct cluster_supervisor_state {
  std::optional<supervisor> sup;
  static inline const char* name = "cluster_supervisor";
};

struct nodes_supervisor_state {
  std::optional<supervisor> sup;
  static inline const char* name = "nodes_supervisor";
};

caf::behavior cluster_supervisor(caf::stateful_actor<cluster_supervisor_state>* self, cluster_plan plan);

struct cluster_options;
/// The supervision plan of a cluster with these options (embedded: every
/// node listed; the distributed controller clears the nodes, which join).
expected<cluster_plan> make_cluster_plan(const cluster_options& o, std::shared_ptr<cluster_metrics> metrics);

/// The nodes of `plan`, one_for_one; each (re)started node joins `controller`
/// (node_join, with `router` as the hub routers hear it through).
caf::behavior nodes_supervisor(caf::stateful_actor<nodes_supervisor_state>* self, cluster_plan plan,
                               caf::actor controller, caf::actor router, caf::actor health);

}  // namespace exa::actors
