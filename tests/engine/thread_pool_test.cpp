// The worker pool covers every index exactly once, however the work is split.

#include <catch2/catch.hpp>

#include <atomic>
#include <vector>

#include "engine/thread_pool.hpp"

using namespace exa;

TEST_CASE("parallel_for covers each index exactly once", "[thread_pool]") {
  for (std::size_t threads : {1u, 2u, 4u}) {
    engine::thread_pool pool(threads);
    CHECK(pool.size() == threads);
    for (std::size_t n : {0u, 1u, 7u, 64u, 1000u}) {
      for (std::size_t grain : {1u, 3u, 100u}) {
        std::vector<std::atomic<int>> hits(n);
        pool.parallel_for(n, grain, [&](std::size_t b, std::size_t e) {
          REQUIRE(b < e);
          for (std::size_t i = b; i < e; ++i) hits[i]++;
        });
        for (std::size_t i = 0; i < n; ++i) CHECK(hits[i] == 1);
      }
    }
  }
}

TEST_CASE("many short sections in a row", "[thread_pool]") {
  engine::thread_pool pool(3);
  std::atomic<long> sum{0};
  for (int round = 0; round < 2000; ++round)
    pool.parallel_for(64, 1, [&](std::size_t b, std::size_t e) { sum += static_cast<long>(e - b); });
  CHECK(sum == 2000 * 64);
}
