// The prefix cache's bookkeeping without a model: published blocks are found
// again by their tokens, shared with reference counts, copied before a write
// (copy-on-write), kept when unreferenced and evicted least recently used
// first -- never while referenced -- within the cache's quota; a hash match
// with other tokens or another parent is a miss; reserve() stays all or
// nothing when evicting.

#include <catch2/catch.hpp>

#include <cstring>
#include <numeric>

#include "engine/kv_cache.hpp"
#include "gpu/cpu_memory_pool.hpp"
#include "model/prefix_hash.hpp"

using namespace exa;
using engine::block_id;

namespace {

const engine::kv_layout layout{2, 8, 4};  // 4 positions per block

std::unique_ptr<gpu::cpu_memory_pool> pool_of(std::uint32_t blocks) {
  auto p = gpu::cpu_memory_pool::create(layout.block_bytes(), blocks);
  REQUIRE(p.has_value());
  return std::move(*p);
}

std::vector<model::token_id> tokens(std::size_t n, model::token_id first = 10) {
  std::vector<model::token_id> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// Reserves and "computes" a sequence's tokens (a marker in each K slot), then
// publishes them as the engine does after a step.
void compute(engine::kv_cache& c, engine::seq_id seq, const std::vector<model::token_id>& t,
             std::uint32_t from = 0) {
  const auto n = static_cast<std::uint32_t>(t.size());
  REQUIRE(c.reserve(seq, n, from));
  for (std::uint32_t p = from; p < n; ++p) *c.k(c.table(seq), 1, p) = static_cast<std::uint16_t>(t[p]);
  c.publish(seq, t, n);
  c.check_invariants();
}

}  // namespace

TEST_CASE("published blocks are shared by sequences with the same prefix", "[prefix]") {
  auto pool = pool_of(16);
  engine::kv_cache c(*pool, layout, 0, true);
  const auto a = tokens(14);  // 3 full blocks and 2 positions
  compute(c, 1, a);
  CHECK(c.cached_blocks() == 3);  // the partial block is not cached
  CHECK(c.used_blocks() == 4);
  const auto& ta = c.table(1);
  for (int i = 0; i < 3; ++i) CHECK(c.refs(ta[i]) == 1);

  // Same first 10 tokens, then other ones: two blocks match, the third differs.
  auto b = tokens(10);
  for (model::token_id x : {90, 91, 92, 93, 94}) b.push_back(x);
  CHECK(c.attach_prefix(2, b) == 8);
  REQUIRE(c.table(2).size() == 2);
  CHECK(c.table(2)[0] == ta[0]);
  CHECK(c.table(2)[1] == ta[1]);
  CHECK(c.refs(ta[0]) == 2);
  CHECK(c.refs(ta[2]) == 1);
  compute(c, 2, b, 8);
  CHECK(c.table(2)[2] != ta[2]);
  CHECK(*c.k(c.table(2), 1, 5) == 10 + 5);  // read through the shared block
  CHECK(c.cached_blocks() == 4);            // b's own third block joined

  // A sequence that shares nothing attaches nothing.
  CHECK(c.attach_prefix(3, tokens(8, 500)) == 0);
  CHECK_FALSE(c.has(3));

  // With the cache off nothing is published or attached.
  auto pool2 = pool_of(16);
  engine::kv_cache off(*pool2, layout, 0, false);
  compute(off, 1, a);
  CHECK(off.cached_blocks() == 0);
  CHECK(off.attach_prefix(2, a) == 0);
}

TEST_CASE("a shared block is copied before it is written", "[prefix]") {
  auto pool = pool_of(16);
  engine::kv_cache c(*pool, layout, 0, true);
  const auto a = tokens(12);
  compute(c, 1, a);
  const block_id last = c.table(1)[2];
  // The whole prompt is cached; the engine recomputes the last token.
  REQUIRE(c.attach_prefix(2, a) == 12);
  CHECK(c.refs(last) == 2);
  CHECK(c.blocks_needed(2, 12, 11) == 1);  // one copy
  CHECK(c.blocks_needed(2, 12, 12) == 0);  // reading only: none
  REQUIRE(c.reserve(2, 12, 11));
  const block_id copy = c.table(2)[2];
  CHECK(copy != last);
  CHECK(c.refs(last) == 1);
  CHECK(c.refs(copy) == 1);
  CHECK_FALSE(c.is_cached(copy));
  // Every layer's bytes came along.
  CHECK(std::memcmp(pool->address(copy), pool->address(last), layout.block_bytes()) == 0);
  c.check_invariants();
  // Writing the copy leaves the cached block as it was.
  *c.k(c.table(2), 0, 11) = 0xbeef;
  CHECK(*c.k(c.table(1), 0, 11) != 0xbeef);
  // Published again, the copy gives way to the cached block it duplicates.
  *c.k(c.table(2), 0, 11) = *c.k(c.table(1), 0, 11);
  c.publish(2, a, 12);
  CHECK(c.table(2)[2] == last);
  CHECK(c.refs(last) == 2);
  c.check_invariants();
  // A cached block referenced once is copied too: the cache keeps its block.
  c.release(1);
  c.release(2);
  REQUIRE(c.attach_prefix(3, a) == 12);
  CHECK(c.refs(last) == 1);
  REQUIRE(c.reserve(3, 12, 11));
  CHECK(c.table(3)[2] != last);
  CHECK(c.is_cached(last));
  CHECK(c.refs(last) == 0);
  c.check_invariants();
}

TEST_CASE("over device memory a shared block is copied through the block copier", "[prefix]") {
  // A pool whose memory the host cannot touch (a GPU's): kv_cache only keeps
  // its books, and copy-on-write goes through the copier (a device copy).
  class device_ids final : public engine::block_pool {
   public:
    std::size_t block_bytes() const noexcept override { return layout.block_bytes(); }
    std::uint32_t capacity_blocks() const noexcept override { return free_.capacity(); }
    std::uint32_t free_blocks() const noexcept override { return free_.free_count(); }
    std::optional<block_id> allocate() noexcept override { return free_.allocate(); }
    void release(block_id b) override { free_.release(b); }
    void* address(block_id) noexcept override { return nullptr; }
    bool host_accessible() const noexcept override { return false; }

   private:
    engine::block_free_list free_{8};
  } pool;
  std::vector<std::pair<block_id, block_id>> copies;
  engine::kv_cache c(pool, layout, 0, true, [&](block_id dst, block_id src) { copies.emplace_back(dst, src); });
  const auto a = tokens(8);
  REQUIRE(c.reserve(1, 8));
  c.publish(1, a, 8);
  REQUIRE(c.attach_prefix(2, a) == 8);
  REQUIRE(c.reserve(2, 8, 7));  // the engine recomputes the last token: its block is copied
  REQUIRE(copies.size() == 1);
  CHECK(copies[0].first == c.table(2)[1]);
  CHECK(copies[0].second == c.table(1)[1]);
  CHECK(copies[0].first != copies[0].second);
  CHECK(c.table(2)[0] == c.table(1)[0]);  // the block it only reads stays shared
  c.check_invariants();
}

TEST_CASE("two sequences computing one prefix side by side end up sharing it", "[prefix]") {
  auto pool = pool_of(16);
  engine::kv_cache c(*pool, layout, 0, true);
  const auto a = tokens(9);
  REQUIRE(c.reserve(1, 9));
  REQUIRE(c.reserve(2, 9));
  c.publish(1, a, 9);
  CHECK(c.used_blocks() == 6);
  c.publish(2, a, 9);
  CHECK(c.table(2)[0] == c.table(1)[0]);
  CHECK(c.table(2)[1] == c.table(1)[1]);
  CHECK(c.table(2)[2] != c.table(1)[2]);  // the partial block stays private
  CHECK(c.used_blocks() == 4);
  c.check_invariants();
}

TEST_CASE("unreferenced cached blocks are evicted least recently used first", "[prefix]") {
  auto pool = pool_of(8);
  engine::kv_cache c(*pool, layout, 0, true);
  const auto a = tokens(12);
  const auto b = tokens(8, 300);
  compute(c, 1, a);
  compute(c, 2, b);
  const auto ta = c.table(1);
  const auto tb = c.table(2);
  CHECK(c.free_blocks() == 3);
  c.release(1);  // a's blocks: evictable, last block first
  c.release(2);  // then b's: more recent
  CHECK(c.used_blocks() == 5);
  CHECK(c.evictable_blocks() == 5);
  CHECK(c.free_blocks() == 8);  // evictable blocks count as free
  CHECK(c.free_tokens() == 32);
  // Most recently used first: b's chain (its first block first), then a's.
  const auto ha = model::prefix_block_hashes(a, 4);
  const auto hb = model::prefix_block_hashes(b, 4);
  CHECK(c.cached_hashes(99) == std::vector<std::uint64_t>{hb[0], hb[1], ha[0], ha[1], ha[2]});
  CHECK(c.cached_hashes(2) == std::vector<std::uint64_t>{hb[0], hb[1]});

  // Five blocks: three free ones, then a's last two blocks go.
  CHECK(c.evicted_blocks() == 0);
  REQUIRE(c.reserve(3, 20));
  CHECK(c.evicted_blocks() == 2);  // counted (the engine's prefix_evicted_blocks)
  CHECK(c.is_cached(ta[0]));
  CHECK_FALSE(c.is_cached(ta[1]));
  CHECK_FALSE(c.is_cached(ta[2]));
  CHECK(c.is_cached(tb[0]));
  CHECK(c.is_cached(tb[1]));
  CHECK(c.attach_prefix(4, a) == 4);  // what is left of a
  CHECK(c.evicted_run_tokens(4, a) == 8);  // and its two blocks evicted lately
  c.check_invariants();
  c.release(4);
  c.release(3);
  c.check_invariants();
}

TEST_CASE("referenced cached blocks are never evicted, and reserve stays all or nothing", "[prefix]") {
  auto pool = pool_of(6);
  engine::kv_cache c(*pool, layout, 0, true);
  const auto a = tokens(12);
  compute(c, 1, a);
  c.release(1);
  REQUIRE(c.attach_prefix(2, tokens(8)) == 8);  // a's first two blocks in use again
  CHECK(c.evictable_blocks() == 1);
  CHECK(c.free_blocks() == 4);  // three free + a's last block
  const auto hashes = c.cached_hashes(99);
  // Five blocks wanted, four to be had: nothing taken, nothing evicted.
  CHECK_FALSE(c.reserve(3, 20));
  CHECK_FALSE(c.has(3));
  CHECK(c.cached_hashes(99) == hashes);
  CHECK(c.evicted_blocks() == 0);
  CHECK(c.free_blocks() == 4);
  CHECK(pool->free_blocks() == 3);
  // Four fit: the evictable block goes, the referenced ones stay.
  REQUIRE(c.reserve(3, 16));
  CHECK(c.cached_blocks() == 2);
  CHECK(c.evicted_blocks() == 1);
  CHECK(c.attach_prefix(4, a) == 8);
  c.check_invariants();
}

TEST_CASE("cached blocks count against the quota and are evicted to stay within it", "[prefix]") {
  auto pool = pool_of(16);
  engine::kv_cache c(*pool, layout, 4, true);  // this replica's share: 4 of 16
  compute(c, 1, tokens(12));
  c.release(1);
  CHECK(c.used_blocks() == 3);
  CHECK(c.free_blocks() == 4);  // one fresh + three evictable
  REQUIRE(c.reserve(2, 16));    // the pool has 13 free, the quota only 1
  CHECK(c.used_blocks() == 4);
  CHECK(c.cached_blocks() == 0);
  CHECK(c.evicted_blocks() == 3);
  CHECK(pool->free_blocks() == 12);
  CHECK_FALSE(c.reserve(3, 1));
  c.check_invariants();
}

TEST_CASE("all or nothing when another cache takes the shared pool", "[prefix]") {
  auto pool = pool_of(6);
  engine::kv_cache a(*pool, layout, 0, true);
  engine::kv_cache b(*pool, layout, 0, true);
  compute(a, 1, tokens(8));
  a.release(1);  // two evictable blocks in a
  REQUIRE(b.reserve(1, 12));  // b takes three of the four free blocks
  CHECK(a.free_blocks() == 3);
  CHECK_FALSE(a.reserve(2, 16));  // four wanted
  CHECK(a.cached_blocks() == 2);  // nothing evicted
  CHECK(a.evicted_blocks() == 0);
  CHECK(pool->free_blocks() == 1);
  REQUIRE(a.reserve(2, 12));  // the free block, then both evictable ones
  CHECK(a.cached_blocks() == 0);
  CHECK(pool->free_blocks() == 0);
  a.check_invariants();
  b.check_invariants();
}

TEST_CASE("a hash match with other tokens or another parent is a miss", "[prefix]") {
  engine::prefix_index idx(8, 2);
  const std::vector<model::token_id> x{1, 2}, y{3, 4}, z{5, 6};
  const auto s0 = idx.insert(0, 111, 0, x);
  const auto s1 = idx.insert(1, 222, s0, y);
  CHECK(idx.find(111, 0, x) == std::optional<block_id>(0));
  CHECK_FALSE(idx.find(111, 0, z).has_value());  // same hash, other tokens
  CHECK_FALSE(idx.find(222, 0, y).has_value());  // other parent
  CHECK(idx.find(222, s0, y) == std::optional<block_id>(1));
  // The parent's block is evicted and reused for another prefix: its old
  // child no longer matches under the new registration.
  idx.erase(0);
  const auto s2 = idx.insert(0, 333, 0, z);
  CHECK(s2 != s0);
  CHECK_FALSE(idx.find(222, s2, y).has_value());
  CHECK(idx.holder(222) == std::optional<block_id>(1));
  CHECK(idx.serial(1) == s1);
}

TEST_CASE("evicted_hashes keeps the last evictions, a hash evicted twice until its last copy goes", "[prefix]") {
  engine::evicted_hashes g(3);
  g.add(1);
  g.add(2);
  g.add(1);
  CHECK(g.size() == 3);
  CHECK(g.contains(1));
  g.add(4);  // the first 1 goes; the second stays
  CHECK(g.contains(1));
  CHECK(g.contains(2));
  g.add(5);  // 2 goes
  CHECK_FALSE(g.contains(2));
  g.add(6);  // the second 1 goes
  CHECK_FALSE(g.contains(1));
  CHECK(g.size() == 3);
  engine::evicted_hashes none(0);
  none.add(7);
  CHECK_FALSE(none.contains(7));
  CHECK(none.size() == 0);
}

TEST_CASE("a lookup says how many of its missed tokens were evicted lately, not those never cached", "[prefix]") {
  auto pool = pool_of(4);
  engine::kv_cache c(*pool, layout, 0, true);
  const auto a = tokens(12);
  compute(c, 1, a);
  c.release(1);
  CHECK(c.attach_prefix(2, tokens(8, 300)) == 0);  // never cached
  CHECK(c.evicted_run_tokens(2, tokens(8, 300)) == 0);
  c.release(2);
  REQUIRE(c.reserve(3, 16));  // four blocks: a's three go
  CHECK(c.evicted_blocks() == 3);
  c.release(3);
  CHECK(c.attach_prefix(4, a) == 0);
  CHECK(c.evicted_run_tokens(4, a) == 12);
  c.release(4);
  // A prompt that shares a's first block only: the run stops where it differs.
  auto b = a;
  b[5] = 999;
  CHECK(c.attach_prefix(5, b) == 0);
  CHECK(c.evicted_run_tokens(5, b) == 4);
  c.release(5);
  engine::kv_cache off(*pool_of(4), layout, 0, false);
  CHECK(off.attach_prefix(1, a) == 0);
  CHECK(off.evicted_run_tokens(1, a) == 0);
}
