#pragma once
// A hub stands in for "the routers" where there may be any number of them:
// in a node process (its replicas' lifecycle events and loads go to every
// gateway's router) and in the controller process (fences, deployments and
// node health go to every gateway). Routers subscribe; the hub forwards
// every other message it gets to each live subscriber and forgets the ones
// that go down. A router's load table request (loads_atom) is answered with
// an empty table: loads live in the gateways.

#include <caf/fwd.hpp>

#include "actors/messages.hpp"

#include <map>
#include <vector>

namespace exa::actors {

struct hub_state {
  std::vector<caf::actor> subscribers;
  std::size_t subscribers_max = 1024;  // a bound: gateways are few
  /// The last lifecycle event and load report of each live replica behind
  /// this hub, replayed to a new subscriber. A gateway that subscribes
  /// after a replica became ready still learns of it (else it would never
  /// route there), and one joining a quiet cluster knows every replica's KV
  /// capacity at once, not after its next step.
  std::map<cluster::replica_id, replica_event> last_events;
  std::map<cluster::replica_id, replica_load> last_loads;
  std::size_t last_max = 4096;  // a bound on each: oldest replica ids go first
  static inline const char* name = "hub";
};

caf::behavior hub_actor(caf::stateful_actor<hub_state>* self);

}  // namespace exa::actors
