#pragma once
// Where a sequence's K and V vectors live: the address arithmetic of the paged
// KV cache (kv_cache.hpp), apart from its bookkeeping. The forward pass reads
// and writes through it. A tensor-parallel member's pages are its own device's
// pool, reached through the group's block map (tp_block_pool.hpp): the block
// tables the scheduler builds hold group-wide ids, and `remap` turns each into
// the member's block.

#include <cstdint>
#include <vector>

#include "common/assert.hpp"
#include "engine/block_pool.hpp"

namespace exa::engine {

struct kv_layout {
  std::uint32_t n_layers = 0;
  std::uint32_t kv_dim = 0;
  std::uint32_t block_tokens = 16;

  /// Bytes of one block: layers × (K and V) × positions × kv_dim × fp16.
  std::size_t block_bytes() const noexcept {
    return std::size_t{n_layers} * 2 * block_tokens * kv_dim * sizeof(std::uint16_t);
  }
};

class kv_pages {
 public:
  /// `pool`'s blocks must be host-accessible and at least layout.block_bytes().
  /// With `remap`, a table entry b means block (*remap)[b] of `pool`; the map
  /// must outlive these pages and not change while a forward pass runs.
  kv_pages(block_pool& pool, kv_layout layout, const std::vector<block_id>* remap = nullptr) noexcept
      : pool_(&pool), layout_(layout), remap_(remap) {}

  const kv_layout& layout() const noexcept { return layout_; }

  /// fp16 K (or V) vector of `layer` at position `pos` of a sequence whose
  /// table covers pos.
  std::uint16_t* k(const std::vector<block_id>& table, std::uint32_t layer, std::uint32_t pos) const noexcept {
    return slot(table, layer, 0, pos);
  }
  std::uint16_t* v(const std::vector<block_id>& table, std::uint32_t layer, std::uint32_t pos) const noexcept {
    return slot(table, layer, 1, pos);
  }
  /// The K part of `layer` in the block holding position `pos`: block_tokens
  /// × kv_dim values. The CPU forward pass keeps it transposed where its
  /// kernel variant prefers that (kernel_table::k_transposed), block_tokens
  /// is a multiple of 16 and a head at most 256 wide: element e of the
  /// block's slot s at [e · block_tokens + s], so that one KV head's keys for
  /// a block are one span and a slot's elements are the lanes its score
  /// kernel wants (kernel_table::dot_f16_kt); else by slot, as k() addresses
  /// it. The CUDA engine keeps its own pools by slot. Whole blocks are copied
  /// and shared (prefix caching, within one engine) the same either way.
  std::uint16_t* k_block(const std::vector<block_id>& table, std::uint32_t layer, std::uint32_t pos) const noexcept {
    return slot(table, layer, 0, pos - pos % layout_.block_tokens);
  }

 private:
  std::uint16_t* slot(const std::vector<block_id>& table, std::uint32_t layer, std::uint32_t kv,
                      std::uint32_t pos) const noexcept {
    const std::uint32_t bi = pos / layout_.block_tokens;
    EXA_ASSERT(bi < table.size());
    block_id b = table[bi];
    if (remap_ != nullptr) {
      EXA_ASSERT(b < remap_->size());
      b = (*remap_)[b];
    }
    auto* base = static_cast<std::uint16_t*>(pool_->address(b));
    const std::size_t s = pos % layout_.block_tokens;
    const std::size_t index = ((std::size_t{layer} * 2 + kv) * layout_.block_tokens + s) * layout_.kv_dim;
    return base + index;
  }

  block_pool* pool_;
  kv_layout layout_;
  const std::vector<block_id>* remap_;
};

}  // namespace exa::engine
