#pragma once
// Paged KV cache. A sequence's keys and values live in fixed-size blocks of
// `block_tokens` positions taken from a device block_pool; its block table maps
// position p to block table[p / block_tokens], slot p % block_tokens. Inside a
// block the layout is [layer][K, V][slot][kv_dim] in fp16 (as llama.cpp keeps
// its cache), so one block holds every layer of its positions.
//
// Every block belongs to at most one sequence; reserve() takes all the blocks
// it needs or none, so a sequence that cannot grow never disturbs another.

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "engine/block_pool.hpp"

namespace exa::engine {

using seq_id = std::uint64_t;

struct kv_layout {
  std::uint32_t n_layers = 0;
  std::uint32_t kv_dim = 0;
  std::uint32_t block_tokens = 16;

  /// Bytes of one block: layers × (K and V) × positions × kv_dim × fp16.
  std::size_t block_bytes() const noexcept {
    return std::size_t{n_layers} * 2 * block_tokens * kv_dim * sizeof(std::uint16_t);
  }
};

class kv_cache {
 public:
  /// The pool's blocks must be host-accessible and at least layout.block_bytes().
  /// `max_blocks` caps what this cache may hold when several caches (replicas)
  /// share one device pool; 0 means the whole pool.
  kv_cache(block_pool& pool, kv_layout layout, std::uint32_t max_blocks = 0);
  ~kv_cache();
  kv_cache(const kv_cache&) = delete;
  kv_cache& operator=(const kv_cache&) = delete;

  const kv_layout& layout() const noexcept { return layout_; }

  /// Makes `seq`'s table cover positions [0, n_tokens). Returns false -- and
  /// changes nothing -- when the pool has too few free blocks.
  bool reserve(seq_id seq, std::uint32_t n_tokens);
  /// Blocks `seq` would still need to cover n_tokens positions.
  std::uint32_t blocks_needed(seq_id seq, std::uint32_t n_tokens) const;
  /// Frees all of `seq`'s blocks (no-op for an unknown sequence).
  void release(seq_id seq);

  bool has(seq_id seq) const { return tables_.count(seq) != 0; }
  /// Positions `seq`'s blocks can hold.
  std::uint32_t reserved_tokens(seq_id seq) const;
  const std::vector<block_id>& table(seq_id seq) const;

  /// fp16 K (or V) vector of `layer` at position `pos` of a sequence whose table
  /// covers pos.
  std::uint16_t* k(const std::vector<block_id>& table, std::uint32_t layer, std::uint32_t pos) noexcept;
  std::uint16_t* v(const std::vector<block_id>& table, std::uint32_t layer, std::uint32_t pos) noexcept;

  std::uint32_t capacity_tokens() const noexcept;
  std::uint32_t free_tokens() const noexcept;
  /// Blocks this cache could still take: its quota left, or the pool's free
  /// blocks if fewer.
  std::uint32_t free_blocks() const noexcept;
  std::uint32_t used_blocks() const noexcept { return used_blocks_; }
  std::size_t sequences() const noexcept { return tables_.size(); }

 private:
  std::uint16_t* slot(const std::vector<block_id>& table, std::uint32_t layer, std::uint32_t kv,
                      std::uint32_t pos) noexcept;

  block_pool& pool_;
  kv_layout layout_;
  std::unordered_map<seq_id, std::vector<block_id>> tables_;
  std::uint32_t max_blocks_;
  std::vector<seq_id> owner_;  // block -> owning sequence + 1, 0 when free (invariant checks)
  std::uint32_t used_blocks_ = 0;
};

}  // namespace exa::engine
