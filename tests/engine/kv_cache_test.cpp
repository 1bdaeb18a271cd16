// The paged KV cache and the CPU device's block pool: capacity in tokens,
// all-or-nothing reservation, exhaustion, release, and no block ever owned by
// two sequences.

#include <catch2/catch.hpp>

#include <set>

#include "engine/kv_cache.hpp"
#include "gpu/cpu_memory_pool.hpp"

using namespace exa;

namespace {
const engine::kv_layout layout{2, 32, 16};

std::unique_ptr<gpu::cpu_memory_pool> pool_of(std::uint32_t blocks) {
  auto p = gpu::cpu_memory_pool::create(layout.block_bytes(), blocks);
  REQUIRE(p.has_value());
  return std::move(*p);
}
}  // namespace

TEST_CASE("block pool hands out each block once", "[kv]") {
  auto pool = pool_of(8);
  std::set<engine::block_id> seen;
  std::set<void*> addresses;
  for (int i = 0; i < 8; ++i) {
    auto b = pool->allocate();
    REQUIRE(b.has_value());
    CHECK(seen.insert(*b).second);
    CHECK(addresses.insert(pool->address(*b)).second);
  }
  CHECK_FALSE(pool->allocate().has_value());
  CHECK(pool->free_blocks() == 0);
  pool->release(3);
  CHECK(pool->allocate() == std::optional<engine::block_id>(3));
}

TEST_CASE("block pool refuses bad sizes", "[kv]") {
  CHECK(gpu::cpu_memory_pool::create(0, 4).error().code == errc::invalid_argument);
  CHECK(gpu::cpu_memory_pool::create(64, 0).error().code == errc::invalid_argument);
  CHECK(gpu::cpu_memory_pool::create(SIZE_MAX / 2, 4).error().code == errc::invalid_argument);
}

TEST_CASE("kv cache reserves whole blocks, all or nothing", "[kv]") {
  auto pool = pool_of(4);
  engine::kv_cache cache(*pool, layout);
  CHECK(cache.capacity_tokens() == 64);
  REQUIRE(cache.reserve(1, 17));  // two blocks
  CHECK(cache.table(1).size() == 2);
  CHECK(cache.free_tokens() == 32);
  CHECK(cache.reserve(1, 20));  // still two blocks: nothing taken
  CHECK(cache.free_tokens() == 32);
  REQUIRE(cache.reserve(2, 16));
  // Sequence 3 needs two blocks but one is left: refused, nothing changes.
  CHECK_FALSE(cache.reserve(3, 30));
  CHECK(cache.free_blocks() == 1);
  CHECK_FALSE(cache.has(3));
  CHECK(cache.blocks_needed(3, 30) == 2);
  // Exhaustion then release.
  REQUIRE(cache.reserve(3, 10));
  CHECK(cache.free_blocks() == 0);
  CHECK_FALSE(cache.reserve(2, 17));
  cache.release(1);
  CHECK(cache.free_blocks() == 2);
  CHECK(cache.reserve(2, 48));
  cache.release(99);  // unknown: no-op
  CHECK(cache.used_blocks() == 4);
}

TEST_CASE("sequences never share a block and their data stays apart", "[kv]") {
  auto pool = pool_of(16);
  engine::kv_cache cache(*pool, layout);
  for (engine::seq_id s = 0; s < 4; ++s) REQUIRE(cache.reserve(s, 64));
  std::set<engine::block_id> all;
  for (engine::seq_id s = 0; s < 4; ++s)
    for (auto b : cache.table(s)) CHECK(all.insert(b).second);
  // Write a distinct pattern per sequence, then read all back.
  for (engine::seq_id s = 0; s < 4; ++s)
    for (std::uint32_t p = 0; p < 64; ++p)
      for (std::uint32_t l = 0; l < 2; ++l) {
        cache.k(cache.table(s), l, p)[5] = static_cast<std::uint16_t>(s * 1000 + p * 2 + l);
        cache.v(cache.table(s), l, p)[31] = static_cast<std::uint16_t>(s * 1000 + p * 2 + l + 7);
      }
  for (engine::seq_id s = 0; s < 4; ++s)
    for (std::uint32_t p = 0; p < 64; ++p)
      for (std::uint32_t l = 0; l < 2; ++l) {
        CHECK(cache.k(cache.table(s), l, p)[5] == s * 1000 + p * 2 + l);
        CHECK(cache.v(cache.table(s), l, p)[31] == s * 1000 + p * 2 + l + 7);
      }
}
