#pragma once
// A cache's eviction decisions by bytes, as pure logic: entries with a size,
// pinned while in use; least recently used unpinned entries go first when
// the total is over capacity. A pinned entry is never chosen, so a cache
// whose pinned entries alone exceed it stays over capacity (and says so)
// until they are released. The node's model cache uses it: a file an
// active replica maps is never evicted.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace exa::cluster {

class byte_lru {
 public:
  explicit byte_lru(std::uint64_t capacity_bytes) : capacity_(capacity_bytes) {}

  /// Adds (or resizes) an entry and marks it used now. Not pinned.
  void insert(const std::string& key, std::uint64_t bytes);
  /// Marks an entry used now; false for an unknown key.
  bool touch(const std::string& key);
  bool pin(const std::string& key);
  /// Releases one pin; false when unknown or not pinned.
  bool unpin(const std::string& key);
  bool erase(const std::string& key);

  /// Keys to evict, least recently used first, so that the total is back
  /// within capacity; each is removed from the cache. Pinned entries stay.
  std::vector<std::string> evict();
  /// The same, so that `incoming` more bytes would fit too (room made before
  /// a new file is fetched, not after).
  std::vector<std::string> evict_for(std::uint64_t incoming);
  /// Whether `bytes` more would fit once every unpinned entry went (a load
  /// that cannot fit even then should be refused up front).
  bool could_fit(std::uint64_t bytes) const { return pinned_bytes() + bytes <= capacity_; }

  bool contains(const std::string& key) const { return entries_.count(key) != 0; }
  std::uint32_t pins(const std::string& key) const;
  std::uint64_t used_bytes() const noexcept { return used_; }
  std::uint64_t pinned_bytes() const;
  std::uint64_t capacity_bytes() const noexcept { return capacity_; }
  std::size_t size() const noexcept { return entries_.size(); }

 private:
  struct entry {
    std::uint64_t bytes = 0;
    std::uint32_t pins = 0;
    std::uint64_t last_used = 0;
  };
  std::uint64_t capacity_;
  std::uint64_t used_ = 0;
  std::uint64_t clock_ = 0;
  std::map<std::string, entry> entries_;
};

}  // namespace exa::cluster
