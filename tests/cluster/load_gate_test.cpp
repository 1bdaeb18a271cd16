// Staggered loads: at most cluster_max loading at once and per_node_max per
// node, first come first served except that a busy node does not hold up
// the starts behind it on other nodes; finished() lets the next through.

#include <catch2/catch.hpp>

#include "cluster/load_gate.hpp"

using namespace exa;
using namespace exa::cluster;

TEST_CASE("the gate keeps the cluster-wide and per-node limits", "[loads]") {
  load_gate g({.cluster_max = 3, .per_node_max = 2});
  for (replica_id r = 1; r <= 8; ++r) REQUIRE(*g.enqueue(r, r <= 4 ? 0 : 1));  // 1-4 on node 0, 5-8 on node 1
  // Node 0 takes two, then its limit holds 3 and 4 back; 5 goes on node 1.
  CHECK(g.admit() == std::vector<replica_id>{1, 2, 5});
  CHECK(g.loading_count() == 3);
  CHECK(g.loading_on(0) == 2);
  CHECK(g.waiting_on(0) == 2);
  CHECK(g.admit().empty());  // the cluster limit
  CHECK(g.finished(5));
  CHECK(g.admit() == std::vector<replica_id>{6});  // node 0 still full: 3 waits, 6 goes
  CHECK(g.finished(1));
  CHECK(g.admit() == std::vector<replica_id>{3});  // first in line once its node has room
  CHECK(g.waiting_count() == 3);
}

TEST_CASE("a start is queued once, and dropping a waiting one removes it", "[loads]") {
  load_gate g({.cluster_max = 1, .per_node_max = 1});
  REQUIRE(*g.enqueue(1, 0));
  CHECK_FALSE(*g.enqueue(1, 0));
  REQUIRE(*g.enqueue(2, 0));
  CHECK(g.admit() == std::vector<replica_id>{1});
  CHECK_FALSE(*g.enqueue(1, 0));  // loading already
  CHECK(g.waiting(2));
  CHECK(g.finished(2));  // dropped before it started (its deployment went away)
  CHECK_FALSE(g.waiting(2));
  CHECK_FALSE(g.finished(2));
  CHECK(g.finished(1));
  CHECK(g.admit().empty());
  CHECK(g.loading_count() == 0);
}

TEST_CASE("zero limits count as one, and the queue is bounded", "[loads]") {
  load_gate g({.cluster_max = 0, .per_node_max = 0, .waiting_max = 2});
  REQUIRE(*g.enqueue(1, 0));
  REQUIRE(*g.enqueue(2, 1));
  auto full = g.enqueue(3, 2);
  REQUIRE_FALSE(full);
  CHECK(full.error().code == errc::overloaded);
  CHECK(g.admit() == std::vector<replica_id>{1});
}

TEST_CASE("loads from a node's cache need no cluster-wide turn, only their node's", "[loads][node_cache]") {
  load_gate g({.cluster_max = 1, .per_node_max = 2});
  // Node 0 must fetch from the store; node 1's cache holds the file.
  for (replica_id r = 1; r <= 6; ++r) REQUIRE(*g.enqueue(r, r <= 3 ? 0 : 1));
  const auto from_cache = [](replica_id, node_id node) { return node == 1; };
  // One store load (the cluster limit), and node 1's two at once behind it.
  CHECK(g.admit(from_cache) == std::vector<replica_id>{1, 4, 5});
  CHECK(g.loading_count() == 3);
  CHECK(g.loading_from_store() == 1);
  CHECK(g.admit(from_cache).empty());  // node 1 at its limit, the store busy
  CHECK(g.finished(4));                 // a cache load ends: its node's turn, not the store's
  CHECK(g.admit(from_cache) == std::vector<replica_id>{6});
  CHECK(g.loading_from_store() == 1);
  // Node 0 fetched the file with its first replica: the rest load from its cache.
  CHECK(g.finished(1));
  CHECK(g.loading_from_store() == 0);
  CHECK(g.admit([](replica_id, node_id) { return true; }) == std::vector<replica_id>{2, 3});
  CHECK(g.loading_from_store() == 0);
  // Without the cache's word every load takes a cluster-wide turn, as before.
  load_gate plain({.cluster_max = 1, .per_node_max = 2});
  for (replica_id r = 1; r <= 6; ++r) REQUIRE(*plain.enqueue(r, r <= 3 ? 0 : 1));
  CHECK(plain.admit() == std::vector<replica_id>{1});
}

TEST_CASE("a node's finished fetch gives the store turns of its loads back", "[loads][node_cache]") {
  load_gate g({.cluster_max = 2, .per_node_max = 2});
  for (replica_id r = 1; r <= 4; ++r) REQUIRE(*g.enqueue(r, r <= 2 ? 0 : 1));
  const auto nothing_cached = [](replica_id, node_id) { return false; };
  CHECK(g.admit(nothing_cached) == std::vector<replica_id>{1, 2});  // both wait for node 0's fetch
  CHECK(g.loading_from_store() == 2);
  CHECK(g.admit(nothing_cached).empty());
  // Node 0 has the file: its two loads read the disk now, node 1 may fetch.
  CHECK(g.fetched(0, [](replica_id) { return true; }) == 2);
  CHECK(g.loading_from_store() == 0);
  CHECK(g.loading_on(0) == 2);  // still loading there
  CHECK(g.admit(nothing_cached) == std::vector<replica_id>{3, 4});
  CHECK(g.fetched(1, [](replica_id r) { return r == 3; }) == 1);  // only loads of that file
  CHECK(g.loading_from_store() == 1);
  CHECK(g.finished(4));
  CHECK(g.loading_from_store() == 0);
  CHECK(g.fetched(5, [](replica_id) { return true; }) == 0);
}
