// The simulator's storage model: fetches share the model store's bandwidth
// (max-min fair under each node's link), one fetch per node and file serves
// every load there, and loads read their node's cache at disk speed.

#include <catch2/catch.hpp>

#include <map>

#include "cluster/storage_model.hpp"

using namespace exa;
using namespace exa::cluster;
using Catch::Matchers::WithinRel;

namespace {

storage_model make(double store, double network, double disk) {
  auto m = storage_model::create({store, network, disk});
  REQUIRE(m);
  return std::move(*m);
}

// Runs the model from event to event until idle; when each load finished.
std::map<storage_model::load_id, double> run(storage_model& m) {
  std::map<storage_model::load_id, double> at;
  for (int guard = 0; guard < 100000; ++guard) {
    const auto next = m.next_event_s();
    if (!next) return at;
    for (const auto id : m.advance(*next)) at[id] = *next;
  }
  FAIL("the model never went idle");
  return at;
}

}  // namespace

TEST_CASE("a load fetches its file over the store, then reads it from the disk", "[storage]") {
  auto m = make(10, 0, 2);
  REQUIRE(m.start(1, 0, "f", 100, 0));
  CHECK(m.store_rate_bytes_per_s() == 10);
  const auto at = run(m);
  CHECK_THAT(at.at(1), WithinRel(100.0 / 10 + 100.0 / 2, 1e-9));
  CHECK(m.cached(0, "f"));
  CHECK(m.fetches() == 1);
  CHECK(m.take_fetched() == std::vector<std::pair<node_id, std::string>>{{0, "f"}});
  CHECK(m.take_fetched().empty());
  CHECK_THAT(m.store_bytes(), WithinRel(100.0, 1e-9));
  // The file is in the node's cache now: the next load reads the disk only.
  REQUIRE(m.start(2, 0, "f", 100, 60));
  const auto again = run(m);
  CHECK_THAT(again.at(2), WithinRel(60 + 100.0 / 2, 1e-9));
  CHECK(m.loads_from_cache() == 1);
  CHECK(m.fetches() == 1);
}

TEST_CASE("loads on one node share one fetch and the node's disk", "[storage]") {
  auto m = make(10, 0, 2);
  for (storage_model::load_id id = 1; id <= 3; ++id) REQUIRE(m.start(id, 4, "f", 100, 0));
  const auto at = run(m);
  CHECK(m.fetches() == 1);
  CHECK_THAT(m.store_bytes(), WithinRel(100.0, 1e-9));
  // Fetch 10 s, then three reads at a third of the disk each: 150 s.
  for (storage_model::load_id id = 1; id <= 3; ++id) CHECK_THAT(at.at(id), WithinRel(160.0, 1e-9));
  // A warm node's loads never touch the store.
  auto warm = make(10, 0, 2);
  warm.add_cached(1, "f");
  REQUIRE(warm.start(1, 1, "f", 100, 0));
  CHECK(warm.store_rate_bytes_per_s() == 0);
  CHECK_THAT(run(warm).at(1), WithinRel(50.0, 1e-9));
  CHECK(warm.store_bytes() == 0);
}

TEST_CASE("fetches of many nodes split the store evenly, under each node's link", "[storage]") {
  auto m = make(12, 4, 1000);
  // Node 0 fetches two files (its link allows 2 each); nodes 1-3 one each.
  REQUIRE(m.start(1, 0, "a", 1000, 0));
  REQUIRE(m.start(2, 0, "b", 1000, 0));
  REQUIRE(m.start(3, 1, "a", 1000, 0));
  REQUIRE(m.start(4, 2, "a", 1000, 0));
  REQUIRE(m.start(5, 3, "a", 1000, 0));
  // Max-min fair: node 0's two at 2 each (its link), the others 8/3 each.
  CHECK_THAT(m.store_rate_bytes_per_s(), WithinRel(12.0, 1e-12));
  const auto first = m.next_event_s();
  REQUIRE(first);
  CHECK_THAT(*first, WithinRel(1000 / (8.0 / 3), 1e-9));
  run(m);
  CHECK(m.peak_store_rate_bytes_per_s() <= 12 * (1 + 1e-12));
  CHECK_THAT(m.store_bytes(), WithinRel(5000.0, 1e-9));
  // A lone fetch gets its link, not the whole store.
  auto lone = make(12, 4, 1000);
  REQUIRE(lone.start(1, 0, "a", 100, 0));
  CHECK(lone.store_rate_bytes_per_s() == 4);
}

TEST_CASE("a saturated store is never exceeded and moves every byte once per node", "[storage]") {
  auto m = make(100, 30, 5);
  storage_model::load_id id = 1;
  double now = 0;
  // 64 nodes x 6 loads, started in waves as the controller's gate would.
  for (int wave = 0; wave < 6; ++wave) {
    for (node_id n = 0; n < 64; ++n) REQUIRE(m.start(id++, n, "model", 7000, now));
    now += 3.5;
    for (int guard = 0; guard < 10000; ++guard) {
      const auto next = m.next_event_s();
      if (!next || *next > now) break;
      m.advance(*next);
    }
    m.advance(now);
    CHECK(m.store_rate_bytes_per_s() <= 100 * (1 + 1e-12));
  }
  const auto at = run(m);
  CHECK(at.size() == 64 * 6);
  CHECK(m.fetches() == 64);
  CHECK_THAT(m.store_bytes(), WithinRel(64 * 7000.0, 1e-9));
  CHECK(m.peak_store_rate_bytes_per_s() <= 100 * (1 + 1e-12));
  CHECK_THAT(m.peak_store_rate_bytes_per_s(), WithinRel(100.0, 1e-12));  // it was saturated
}

TEST_CASE("a cancelled load frees its share, and the fetch it waited for still fills the cache", "[storage]") {
  auto m = make(10, 0, 2);
  REQUIRE(m.start(1, 0, "f", 100, 0));
  m.cancel(1, 5);
  CHECK(m.active_loads() == 0);
  CHECK(m.advance(10).empty());  // the fetch ends; nobody reads
  CHECK(m.cached(0, "f"));
  REQUIRE(m.start(2, 0, "f", 100, 10));
  REQUIRE(m.start(3, 0, "f", 100, 10));
  CHECK(m.advance(20).empty());  // both at 1 B/s: 10 bytes each read
  m.cancel(2, 20);
  const auto at = run(m);
  CHECK_THAT(at.at(3), WithinRel(20 + 90.0 / 2, 1e-9));  // alone on the disk now
  CHECK_FALSE(m.start(3, 0, "f", 0, 80));  // zero bytes
  REQUIRE(m.start(4, 0, "f", 1, 80));
  CHECK_FALSE(m.start(4, 0, "f", 1, 80));  // id in use
}

TEST_CASE("the storage model refuses bandwidths that mean nothing", "[storage]") {
  CHECK_FALSE(storage_model::create({0, 0, 1}));
  CHECK_FALSE(storage_model::create({1, 0, 0}));
  CHECK_FALSE(storage_model::create({1, -1, 1}));
  CHECK_THAT(storage_model::create({1, 0, -2}).error().message, Catch::Contains("node_disk_bytes_per_s"));
  CHECK(storage_model::create({1, 0, 1}));
}
