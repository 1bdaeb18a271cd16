#include <catch2/catch.hpp>

#include <vector>

#include "cluster/token_sequencer.hpp"

using exa::cluster::token_sequencer;
using ids = std::vector<std::int32_t>;

TEST_CASE("chunks in order pass straight through", "[cluster][sequencer]") {
  token_sequencer s;
  CHECK(s.offer(0, ids{1, 2}).ready == ids{1, 2});
  CHECK(s.offer(2, ids{3}).ready == ids{3});
  CHECK(s.next() == 3);
  CHECK_FALSE(s.gap());
  CHECK(s.complete(3));
  CHECK_FALSE(s.complete(4));
}

TEST_CASE("a chunk that overtook an earlier one waits for it", "[cluster][sequencer]") {
  token_sequencer s;
  CHECK(s.offer(0, ids{1}).ready == ids{1});
  // Tokens 3..4 came the direct way; 1..2 are still going through the controller.
  auto early = s.offer(3, ids{4, 5});
  CHECK(early.ready.empty());
  CHECK_FALSE(early.overflow);
  CHECK(s.gap());
  CHECK_FALSE(s.complete(5));
  auto late = s.offer(1, ids{2, 3});
  CHECK(late.ready == ids{2, 3, 4, 5});
  CHECK_FALSE(s.gap());
  CHECK(s.next() == 5);
  CHECK(s.complete(5));
}

TEST_CASE("several held chunks are released in order and overlaps counted once", "[cluster][sequencer]") {
  token_sequencer s;
  CHECK(s.offer(6, ids{7}).ready.empty());
  CHECK(s.offer(2, ids{3, 4}).ready.empty());
  CHECK(s.offer(4, ids{5, 6}).ready.empty());
  CHECK(s.held() == 3);
  CHECK(s.offer(0, ids{1, 2, 3}).ready == ids{1, 2, 3, 4, 5, 6, 7});  // 3 arrives twice, kept once
  CHECK(s.next() == 7);
  CHECK(s.held() == 0);
}

TEST_CASE("what a resumed replica re-sends is dropped", "[cluster][sequencer]") {
  token_sequencer s;
  s.restart(4);  // the request had 4 tokens when this replica took over
  CHECK(s.offer(0, ids{1, 2}).ready.empty());
  CHECK(s.offer(2, ids{3, 4, 5}).ready == ids{5});
  CHECK(s.next() == 5);
}

TEST_CASE("a new replica drops what the last one left held", "[cluster][sequencer]") {
  token_sequencer s;
  CHECK(s.offer(0, ids{1}).ready == ids{1});
  CHECK(s.offer(5, ids{6}).ready.empty());
  s.restart(1);
  CHECK_FALSE(s.gap());
  CHECK(s.offer(1, ids{2}).ready == ids{2});  // the old held chunk is not released
  CHECK(s.next() == 2);
}

TEST_CASE("more held chunks than the bound is an overflow", "[cluster][sequencer]") {
  token_sequencer s(2);
  CHECK_FALSE(s.offer(10, ids{1}).overflow);
  CHECK_FALSE(s.offer(20, ids{1}).overflow);
  CHECK(s.offer(30, ids{1}).overflow);
  CHECK_FALSE(s.offer(0, {}).overflow);  // an empty chunk changes nothing
  CHECK(s.next() == 0);
}
