// A node's hub replays what a late subscriber missed: each live replica's
// last lifecycle event (with its actor, so the gateway can route to it) and
// its last load report; a replica that ended is not replayed.

#include <catch2/catch.hpp>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

#include "actors/hub_actor.hpp"
#include "actors/messages.hpp"
#include "cluster/lifecycle.hpp"

using namespace exa;

TEST_CASE("a late subscriber of a hub learns every live replica and its load", "[actors][hub]") {
  caf::actor_system_config cfg;
  actors::register_message_types(cfg);
  caf::actor_system sys{cfg};
  auto hub = sys.spawn(actors::hub_actor);
  caf::scoped_actor replica{sys};  // stands in for a replica actor
  const auto state = [](cluster::replica_state s) { return static_cast<std::uint8_t>(s); };
  caf::anon_send(hub, actors::replica_event{1, "d", 0, 1, 7, 0, state(cluster::replica_state::ready), "", replica});
  caf::anon_send(hub, actors::replica_event{1, "d", 0, 1, 7, 0, state(cluster::replica_state::serving), "", caf::actor{}});
  caf::anon_send(hub, actors::replica_load{1, 2, 0, 10, 0, 0, 5, 2048, 0, {}});
  caf::anon_send(hub, actors::replica_event{2, "d", 1, 1, 7, 0, state(cluster::replica_state::ready), "", replica});
  caf::anon_send(hub, actors::replica_event{2, "d", 1, 1, 7, 0, state(cluster::replica_state::stopped), "", caf::actor{}});
  caf::scoped_actor gateway{sys};
  caf::anon_send(hub, actors::subscribe_msg{gateway});
  std::vector<actors::replica_event> events;
  std::vector<actors::replica_load> loads;
  for (int i = 0; i < 2; ++i)
    gateway->receive([&](const actors::replica_event& e) { events.push_back(e); },
                     [&](const actors::replica_load& l) { loads.push_back(l); },
                     caf::after(std::chrono::seconds(10)) >> [&] { FAIL("the hub replayed nothing"); });
  REQUIRE(events.size() == 1);  // replica 2 ended: not replayed
  CHECK(events[0].id == 1);
  CHECK(events[0].state == state(cluster::replica_state::serving));
  CHECK(events[0].handle == caf::actor{replica});  // kept from the event that carried it
  REQUIRE(loads.size() == 1);
  CHECK(loads[0].kv_capacity_tokens == 2048);
  // Nothing more: exactly one event and one load.
  bool more = false;
  gateway->receive([&](const caf::message&) { more = true; }, caf::after(std::chrono::milliseconds(200)) >> [] {});
  CHECK_FALSE(more);
  caf::anon_send_exit(hub, caf::exit_reason::user_shutdown);
}
