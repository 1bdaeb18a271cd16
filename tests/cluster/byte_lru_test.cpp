// Eviction by bytes: least recently used unpinned entries go first until
// the total fits; pinned entries are never chosen, even when that leaves
// the cache over capacity; resizing and erasing keep the total right.

#include <catch2/catch.hpp>

#include "cluster/byte_lru.hpp"

using namespace exa::cluster;

TEST_CASE("the least recently used unpinned entries go until the total fits", "[cache]") {
  byte_lru c(100);
  c.insert("a", 40);
  c.insert("b", 30);
  c.insert("c", 20);
  CHECK(c.evict().empty());
  CHECK(c.used_bytes() == 90);
  c.touch("a");         // b is now the oldest
  c.insert("d", 50);    // 140 > 100
  CHECK(c.evict() == std::vector<std::string>{"b", "c"});
  CHECK(c.used_bytes() == 90);
  CHECK(c.contains("a"));
  CHECK(c.contains("d"));
}

TEST_CASE("a pinned entry is never evicted, even over capacity", "[cache]") {
  byte_lru c(100);
  c.insert("big", 80);
  c.pin("big");
  c.insert("other", 60);
  CHECK(c.pinned_bytes() == 80);
  CHECK(c.evict() == std::vector<std::string>{"other"});
  c.insert("huge", 90);
  c.pin("huge");
  CHECK(c.evict().empty());  // both pinned: over capacity until released
  CHECK(c.used_bytes() == 170);
  CHECK_FALSE(c.could_fit(1));
  CHECK(c.unpin("big"));
  CHECK_FALSE(c.unpin("big"));
  CHECK(c.evict() == std::vector<std::string>{"big"});
  CHECK(c.could_fit(10));
  CHECK_FALSE(c.could_fit(11));
}

TEST_CASE("resizing and erasing keep the total right", "[cache]") {
  byte_lru c(1000);
  c.insert("a", 100);
  c.insert("a", 300);  // the file was replaced by a larger one
  CHECK(c.used_bytes() == 300);
  CHECK(c.size() == 1);
  CHECK(c.erase("a"));
  CHECK_FALSE(c.erase("a"));
  CHECK(c.used_bytes() == 0);
  CHECK_FALSE(c.pin("a"));
  CHECK_FALSE(c.touch("a"));
}

TEST_CASE("room is made for a file before it arrives", "[cache]") {
  byte_lru c(100);
  c.insert("a", 30);
  c.insert("b", 30);
  c.pin("b");
  CHECK(c.evict_for(40).empty());                         // 60 + 40 fits
  CHECK(c.evict_for(50) == std::vector<std::string>{"a"});  // 60 + 50 does not: a goes
  CHECK(c.evict_for(90).empty());                         // only b is left, and it is pinned
  CHECK(c.used_bytes() == 30);
}
