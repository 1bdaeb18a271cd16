// The warm pool: its size, and which live replicas serve and which stand by.

#include <catch2/catch.hpp>

#include <algorithm>

#include "cluster/warm_pool.hpp"

using namespace exa;
using namespace exa::cluster;
using rs = replica_state;

TEST_CASE("the pool is a floor share of the serving replicas, at most half", "[warm_pool]") {
  CHECK(warm_count(10, 10) == 1);
  CHECK(warm_count(9, 10) == 0);
  CHECK(warm_count(3072, 10) == 307);
  CHECK(warm_count(4, 50) == 2);
  CHECK(warm_count(4, 90) == 2);  // clamped to 50 %
  CHECK(warm_count(0, 50) == 0);
  CHECK(warm_count(7, 0) == 0);
}

TEST_CASE("a failure takes a warm standby first, not one still loading", "[warm_pool]") {
  // Serving 3: replica 2 failed (gone from the members), 5 was warm, 6 is loading.
  const std::vector<pool_member> m = {
      {1, false, rs::ready}, {3, false, rs::serving, 2}, {6, true, rs::loading}, {5, true, rs::standby}};
  const auto c = rebalance(m, 3);
  CHECK(c.activate == std::vector<replica_id>{5});
  CHECK(c.deactivate.empty());
}

TEST_CASE("a scale-up takes every standby, warm ones first, and no more than needed", "[warm_pool]") {
  const std::vector<pool_member> m = {{1, false, rs::ready},  {2, true, rs::warming},
                                      {3, true, rs::standby}, {4, true, rs::standby},
                                      {5, true, rs::creating}};
  CHECK(rebalance(m, 3).activate == std::vector<replica_id>{3, 4});
  CHECK(rebalance(m, 4).activate == std::vector<replica_id>{3, 4, 2});
  CHECK(rebalance(m, 9).activate.size() == 4);  // all there is; the rest gets placed
  CHECK(rebalance(m, 1).empty());
}

TEST_CASE("extra serving replicas stand by: unloaded first, then the idlest, never a busy one before an idle one",
          "[warm_pool]") {
  const std::vector<pool_member> m = {{1, false, rs::serving, 5}, {2, false, rs::ready, 0},
                                      {3, false, rs::loading}, {4, false, rs::serving, 1}};
  CHECK(rebalance(m, 3).deactivate == std::vector<replica_id>{3});
  CHECK(rebalance(m, 2).deactivate == std::vector<replica_id>{3, 2});
  CHECK(rebalance(m, 1).deactivate == std::vector<replica_id>{3, 2, 4});
}

TEST_CASE("rebalancing a balanced pool changes nothing, whatever the order", "[warm_pool]") {
  std::vector<pool_member> m = {{4, true, rs::standby}, {1, false, rs::ready}, {2, false, rs::serving, 3},
                                {3, true, rs::loading}};
  CHECK(rebalance(m, 2).empty());
  std::reverse(m.begin(), m.end());
  CHECK(rebalance(m, 2).empty());
}
