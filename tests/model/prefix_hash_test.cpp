#include "model/prefix_hash.hpp"

#include <catch2/catch.hpp>

using exa::model::block_hash;
using exa::model::prefix_block_hashes;
using exa::model::token_id;

TEST_CASE("prefix hashes cover full blocks only and chain through the parent") {
  std::vector<token_id> a(37);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<token_id>(i * 7 + 1);
  const auto h = prefix_block_hashes(a, 16);
  REQUIRE(h.size() == 2);  // 37 tokens: two full blocks of 16, a partial one
  CHECK(h[0] == block_hash(0, std::span(a).first(16)));
  CHECK(h[1] == block_hash(h[0], std::span(a).subspan(16, 16)));
  CHECK(prefix_block_hashes(a, 16, 1).size() == 1);
  CHECK(prefix_block_hashes(a, 0).empty());
}

TEST_CASE("equal blocks under different prefixes hash differently") {
  std::vector<token_id> a(32, 5), b(32, 5);
  b[0] = 6;  // first block differs, second block's tokens are equal
  const auto ha = prefix_block_hashes(a, 16), hb = prefix_block_hashes(b, 16);
  CHECK(ha[0] != hb[0]);
  CHECK(ha[1] != hb[1]);
  // A shared first block gives a shared first hash.
  b[0] = 5;
  b[20] = 9;
  const auto hc = prefix_block_hashes(b, 16);
  CHECK(hc[0] == ha[0]);
  CHECK(hc[1] != ha[1]);
}

TEST_CASE("block hashes are fixed values, the same in every process") {
  // The router and the replicas compute these in different processes (and
  // builds): the function must not depend on a seed or std::hash.
  const std::vector<token_id> t{1, 2, 3, 4};
  const auto h1 = block_hash(0, t);
  CHECK(h1 == block_hash(0, t));
  CHECK(h1 != 0);
  CHECK(block_hash(h1, t) != h1);
  CHECK(block_hash(0, std::span(t).first(3)) != h1);
}
