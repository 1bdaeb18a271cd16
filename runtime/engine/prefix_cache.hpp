#pragma once
// Which KV blocks hold which token prefixes (the prefix cache's index). A full
// block whose positions are all computed is registered under its chained hash
// (model/prefix_hash.hpp); a later sequence with the same prefix finds it and
// shares the block instead of recomputing it. This class only keeps the
// bookkeeping: hash -> block, each cached block's tokens and parent, recency,
// and the LRU list of cached blocks nobody references (evictable). Reference
// counts and the blocks' memory belong to kv_cache.
//
// A 64-bit hash can collide, so a hit is verified: the block's own tokens must
// equal the query's, and its parent must be the very block registration the
// query matched one block earlier (by serial number, which a block's id
// reused after eviction never repeats). By induction an attached run of
// blocks holds exactly the query's prefix.

#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/block_pool.hpp"
#include "model/vocab.hpp"

namespace exa::engine {

class prefix_index {
 public:
  prefix_index(std::uint32_t capacity_blocks, std::uint32_t block_tokens);

  std::uint32_t block_tokens() const noexcept { return block_tokens_; }

  /// The block registered under `hash` whose parent registration is
  /// `parent_serial` (0: first block of a sequence) and whose tokens equal
  /// `tokens`, or nullopt (a hash match with other tokens is a miss).
  std::optional<block_id> find(std::uint64_t hash, std::uint64_t parent_serial,
                               std::span<const model::token_id> tokens) const;
  /// The block registered under `hash`, whatever its tokens.
  std::optional<block_id> holder(std::uint64_t hash) const;

  bool contains(block_id b) const noexcept { return b < entries_.size() && entries_[b].serial != 0; }
  /// Registration number of a cached block: unique over the index's life.
  std::uint64_t serial(block_id b) const;
  std::uint64_t hash(block_id b) const;

  /// Registers a referenced block under a free hash; returns its serial.
  std::uint64_t insert(block_id b, std::uint64_t hash, std::uint64_t parent_serial,
                       std::span<const model::token_id> tokens);
  /// Drops a cached block from the index (evictable or not).
  void erase(block_id b);

  /// Marks a block most recently used (the order cached_hashes reports).
  void touch(block_id b);
  /// A cached block's last reference went: evictable, most recently released.
  void park(block_id b);
  /// An evictable block is referenced again.
  void unpark(block_id b);
  bool parked(block_id b) const noexcept { return contains(b) && entries_[b].is_parked; }
  /// The least recently released evictable block, or nullopt.
  std::optional<block_id> lru() const;

  /// Cached blocks (referenced or evictable) and evictable ones.
  std::uint32_t size() const noexcept { return static_cast<std::uint32_t>(by_hash_.size()); }
  std::uint32_t evictable() const noexcept { return static_cast<std::uint32_t>(lru_.size()); }

  /// Hashes of cached blocks, most recently used first, at most `max`.
  std::vector<std::uint64_t> cached_hashes(std::size_t max) const;

 private:
  struct entry {
    std::uint64_t serial = 0;  // 0: not cached
    std::uint64_t parent_serial = 0;
    std::uint64_t hash = 0;
    std::uint64_t used_tick = 0;
    std::vector<model::token_id> tokens;
    bool is_parked = false;
    std::list<block_id>::iterator lru_pos;
  };

  const entry& at(block_id b) const;

  std::uint32_t block_tokens_;
  std::vector<entry> entries_;  // by block id
  std::unordered_map<std::uint64_t, block_id> by_hash_;
  std::list<block_id> lru_;  // evictable blocks, least recently released first
  std::uint64_t next_serial_ = 1;
  std::uint64_t tick_ = 0;
};

}  // namespace exa::engine
