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

TEST_CASE("chunks_per_thread sets how finely the range is cut", "[thread_pool]") {
  engine::thread_pool pool(2);
  for (std::size_t per_thread : {1u, 4u, 16u}) {
    std::vector<std::atomic<int>> hits(1000);
    std::atomic<int> calls{0};
    std::atomic<std::size_t> largest{0};
    pool.parallel_for(
        1000, 1,
        [&](std::size_t b, std::size_t e) {
          ++calls;
          std::size_t seen = largest.load();
          while (e - b > seen && !largest.compare_exchange_weak(seen, e - b)) {
          }
          for (std::size_t i = b; i < e; ++i) hits[i]++;
        },
        per_thread);
    for (auto& h : hits) CHECK(h == 1);
    // 2 threads × per_thread chunks of ceil(1000 / (2 · per_thread)) indices.
    const std::size_t chunk = (1000 + 2 * per_thread - 1) / (2 * per_thread);
    CHECK(largest == chunk);
    CHECK(calls == static_cast<int>((1000 + chunk - 1) / chunk));
  }
}
