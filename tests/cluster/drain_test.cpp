// Drains as pure logic: deadlines are checked and defaulted, draining twice
// keeps the first deadline, expire() forces each replica once and in id
// order, and node drains by an operator outlive a restart while a drain for
// shutdown ends with it.

#include <catch2/catch.hpp>

#include <chrono>

#include "cluster/drain.hpp"

using namespace exa;
using namespace exa::cluster;
using namespace std::chrono_literals;

namespace {
constexpr std::int64_t s_ns = 1'000'000'000;
}

TEST_CASE("drain deadlines are defaulted and bounded", "[drain]") {
  drain_tracker t({.default_deadline = 30s, .max_deadline = 10min});
  CHECK(*t.deadline_for(0ms) == 30s);
  CHECK(*t.deadline_for(5s) == 5s);
  CHECK(*t.deadline_for(10min) == 10min);
  auto too_long = t.deadline_for(11min);
  REQUIRE_FALSE(too_long);
  CHECK(too_long.error().code == errc::invalid_argument);
  CHECK_THAT(too_long.error().message, Catch::Contains("660 s") && Catch::Contains("600 s"));
  CHECK_FALSE(t.deadline_for(-1ms));
}

TEST_CASE("a replica drains once, and its deadline forces it once", "[drain]") {
  drain_tracker t;
  REQUIRE(*t.begin(7, 1, {"d", 0}, drain_cause::replica, 10 * s_ns, 5s));
  // A second drain (another operator, or the node's drain) keeps the first deadline.
  REQUIRE_FALSE(*t.begin(7, 1, {"d", 0}, drain_cause::node, 12 * s_ns, 60s));
  REQUIRE(t.find(7));
  CHECK(t.find(7)->cause == drain_cause::replica);
  CHECK(t.find(7)->deadline_ns == 15 * s_ns);
  REQUIRE(*t.begin(3, 2, {"d", 1}, drain_cause::node, 11 * s_ns, 2s));
  CHECK(*t.next_deadline_ns() == 13 * s_ns);

  CHECK(t.expire(12 * s_ns).empty());
  CHECK(t.expire(13 * s_ns) == std::vector<replica_id>{3});
  CHECK(t.expire(14 * s_ns).empty());  // forced already
  CHECK(*t.next_deadline_ns() == 15 * s_ns);
  CHECK(t.expire(100 * s_ns) == std::vector<replica_id>{7});
  CHECK_FALSE(t.next_deadline_ns());
  CHECK(t.draining_count() == 2);  // forced, but not gone until they end
  CHECK(t.draining_on(1) == 1);

  auto gone = t.ended(3);
  REQUIRE(gone);
  CHECK(gone->forced);
  CHECK(gone->slot == slot_ref{"d", 1});
  CHECK_FALSE(t.ended(3));
  CHECK_FALSE(t.draining(3));
  CHECK(t.draining(7));
}

TEST_CASE("a drained replica's slot is moved once, avoiding the nodes named", "[drain]") {
  drain_tracker t;
  REQUIRE(*t.begin(4, 2, {"d", 3}, drain_cause::node, 0, 1s, {2}));
  CHECK(t.find(4)->avoid == std::vector<node_id>{2});
  CHECK_FALSE(t.find(4)->slot_moved);
  CHECK(t.mark_slot_moved(4));
  CHECK_FALSE(t.mark_slot_moved(4));
  CHECK_FALSE(t.mark_slot_moved(99));
  CHECK(t.ended(4)->slot_moved);
}

TEST_CASE("expired replicas come back in id order", "[drain]") {
  drain_tracker t;
  for (std::uint32_t id : {9u, 2u, 5u}) REQUIRE(*t.begin(id, 0, {"d", id}, drain_cause::node, 0, 1s));
  CHECK(t.expire(s_ns) == std::vector<replica_id>{2, 5, 9});
}

TEST_CASE("the number of draining replicas is bounded", "[drain]") {
  drain_tracker t({.draining_max = 2});
  REQUIRE(*t.begin(1, 0, {"d", 0}, drain_cause::node, 0, 1s));
  REQUIRE(*t.begin(2, 0, {"d", 1}, drain_cause::node, 0, 1s));
  auto full = t.begin(3, 0, {"d", 2}, drain_cause::node, 0, 1s);
  REQUIRE_FALSE(full);
  CHECK(full.error().code == errc::overloaded);
  (void)t.ended(1);
  CHECK(*t.begin(3, 0, {"d", 2}, drain_cause::node, 0, 1s));
}

TEST_CASE("an operator's node drain outlives a restart, a shutdown's does not", "[drain]") {
  drain_tracker t;
  CHECK(t.drain_node(4, drain_cause::shutdown));
  CHECK(t.node_drained(4));
  CHECK(t.node_restarted(4));  // the new process may take slots
  CHECK_FALSE(t.node_drained(4));

  CHECK(t.drain_node(5, drain_cause::node));
  CHECK_FALSE(t.drain_node(5, drain_cause::shutdown));  // SIGTERM of a drained node
  CHECK(*t.node_cause(5) == drain_cause::node);         // not downgraded
  CHECK_FALSE(t.node_restarted(5));
  CHECK(t.node_drained(5));

  CHECK(t.drain_node(6, drain_cause::shutdown));
  CHECK_FALSE(t.drain_node(6, drain_cause::node));
  CHECK(*t.node_cause(6) == drain_cause::node);  // upgraded: stays drained after the restart
  CHECK_FALSE(t.node_restarted(6));

  CHECK(t.undrain_node(5));
  CHECK_FALSE(t.undrain_node(5));
  CHECK(t.drained_nodes().size() == 1);
}
