#pragma once
// Paged KV cache. A sequence's keys and values live in fixed-size blocks of
// `block_tokens` positions taken from a device block_pool; its block table maps
// position p to block table[p / block_tokens], slot p % block_tokens. Inside a
// block the layout is [layer][K, V][slot][kv_dim] in fp16 (as llama.cpp keeps
// its cache), so one block holds every layer of its positions; the CPU forward
// pass may keep each layer's K transposed, [kv_dim][slot] (kv_pages::k_block).
//
// Prefix caching (when enabled): a full block whose positions are all
// computed is published under its chained hash (prefix_cache.hpp) and from
// then on is read-only and may be shared: a new sequence attaches the longest
// cached run of its tokens' blocks instead of computing them. Blocks carry
// reference counts; a private block belongs to exactly one sequence, a cached
// one to as many as reference it. A sequence never writes into a cached block:
// reserve() copies it into a private block first (copy-on-write). A cached
// block nobody references stays in the cache, evictable in LRU order; it
// counts as free, and allocation evicts it when the pool or quota is short.
//
// reserve() takes all the blocks it needs or none, so a sequence that cannot
// grow never disturbs another.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/block_pool.hpp"
#include "engine/evicted_hashes.hpp"
#include "engine/kv_pages.hpp"
#include "engine/prefix_cache.hpp"
#include "model/vocab.hpp"

namespace exa::engine {

using seq_id = std::uint64_t;

/// Copies KV block `src` over block `dst` (copy-on-write of a prefix-cached
/// block) where the pool is not host memory: a GPU engine enqueues the copy on
/// its stream, ahead of the step that writes into `dst`.
using block_copier = std::function<void(block_id dst, block_id src)>;

class kv_cache {
 public:
  /// The pool's blocks must be at least layout.block_bytes(), and
  /// host-accessible unless `copy` copies them (or, without a prefix cache,
  /// nothing is ever copied). `max_blocks` caps what this cache may hold
  /// (cached blocks included) when several caches (replicas) share one device
  /// pool; 0 means the whole pool.
  kv_cache(block_pool& pool, kv_layout layout, std::uint32_t max_blocks = 0,
           bool prefix_cache = false, block_copier copy = {});
  ~kv_cache();
  kv_cache(const kv_cache&) = delete;
  kv_cache& operator=(const kv_cache&) = delete;

  const kv_layout& layout() const noexcept { return layout_; }
  bool prefix_cache_enabled() const noexcept { return prefix_enabled_; }

  /// Makes `seq`'s table cover positions [0, n_tokens) and the blocks holding
  /// positions [write_from, n_tokens) private to it (copies of cached blocks),
  /// so they may be written. Returns false -- and changes nothing -- when too
  /// few blocks are free (evictable cached blocks count as free).
  bool reserve(seq_id seq, std::uint32_t n_tokens, std::uint32_t write_from);
  /// reserve() for a sequence that writes only positions in new blocks.
  bool reserve(seq_id seq, std::uint32_t n_tokens) { return reserve(seq, n_tokens, n_tokens); }
  /// Blocks reserve(seq, n_tokens, write_from) would take.
  std::uint32_t blocks_needed(seq_id seq, std::uint32_t n_tokens, std::uint32_t write_from) const;
  std::uint32_t blocks_needed(seq_id seq, std::uint32_t n_tokens) const {
    return blocks_needed(seq, n_tokens, n_tokens);
  }
  /// Drops `seq`'s table (no-op for an unknown sequence): private blocks go
  /// back to the pool, cached ones lose a reference (evictable at none).
  void release(seq_id seq);

  /// Prefix cache: gives `seq` (which must hold no blocks) the cached blocks
  /// of the longest run of full blocks of `tokens` that is cached; returns the
  /// positions they cover (0 when the cache is off or nothing matches).
  std::uint32_t attach_prefix(seq_id seq, std::span<const model::token_id> tokens);
  /// Prefix cache: publishes `seq`'s full blocks whose positions are all below
  /// `computed` (tokens are the sequence's tokens). A block whose prefix is
  /// already cached elsewhere is swapped for the cached one (same contents:
  /// the engine is batch-invariant), so one prefix is held once.
  void publish(seq_id seq, std::span<const model::token_id> tokens, std::uint32_t computed);

  bool has(seq_id seq) const { return tables_.count(seq) != 0; }
  /// Positions `seq`'s blocks can hold.
  std::uint32_t reserved_tokens(seq_id seq) const;
  const std::vector<block_id>& table(seq_id seq) const;

  /// fp16 K (or V) vector of `layer` at position `pos` of a sequence whose table
  /// covers pos.
  std::uint16_t* k(const std::vector<block_id>& table, std::uint32_t layer, std::uint32_t pos) noexcept {
    return pages_.k(table, layer, pos);
  }
  std::uint16_t* v(const std::vector<block_id>& table, std::uint32_t layer, std::uint32_t pos) noexcept {
    return pages_.v(table, layer, pos);
  }
  /// The address arithmetic alone, for the forward pass.
  const kv_pages& pages() const noexcept { return pages_; }

  std::uint32_t capacity_tokens() const noexcept;
  std::uint32_t free_tokens() const noexcept;
  /// Blocks this cache could still take: its quota left, or the pool's free
  /// blocks if fewer, plus its evictable cached blocks.
  std::uint32_t free_blocks() const noexcept;
  /// Blocks this cache holds, cached ones (referenced or evictable) included.
  std::uint32_t used_blocks() const noexcept { return used_blocks_; }
  std::size_t sequences() const noexcept { return tables_.size(); }

  /// Blocks in the prefix cache (referenced or evictable) and evictable ones.
  std::uint32_t cached_blocks() const noexcept { return index_.size(); }
  std::uint32_t evictable_blocks() const noexcept { return index_.evictable(); }
  /// Cached blocks dropped from the prefix cache since it started: evicted
  /// (least recently used first) to make room, or replaced where a new block
  /// takes its hash (a stale entry whose parent was evicted, or a collision).
  /// Not those dropped when the cache itself goes.
  std::uint64_t evicted_blocks() const noexcept { return evicted_blocks_; }
  /// Of `tokens` past the run attach_prefix() attached to `seq` (call it
  /// before reserve()), those in the whole blocks right after that run which
  /// this cache evicted among its last max-blocks evictions (evicted_hashes):
  /// what a cache about twice as large would have served as well. 0 without
  /// a prefix cache.
  std::uint32_t evicted_run_tokens(seq_id seq, std::span<const model::token_id> tokens) const;
  /// Hashes of cached blocks, most recently used first.
  std::vector<std::uint64_t> cached_hashes(std::size_t max) const { return index_.cached_hashes(max); }
  /// Sequences referencing `b` (0 for a free or evictable block).
  std::uint32_t refs(block_id b) const { return refs_.at(b); }
  bool is_cached(block_id b) const noexcept { return index_.contains(b); }
  /// Asserts `seq` owns (privately) the blocks of positions [from, to).
  void assert_writable(seq_id seq, std::uint32_t from, std::uint32_t to) const;
  /// Walks every table and block and asserts the bookkeeping agrees (tests).
  void check_invariants() const;

 private:
  struct seq_table {
    std::vector<block_id> blocks;
    std::uint32_t published = 0;      // leading blocks that are cached
    std::uint64_t last_hash = 0;      // chained hash of block published - 1
    std::uint64_t last_serial = 0;    // its registration in the index
    bool unpublishable = false;       // a hash collision broke the chain
  };

  std::uint32_t copies_needed(const seq_table* t, std::uint32_t n_tokens, std::uint32_t write_from) const;
  bool take_blocks(std::uint32_t n, std::vector<block_id>& out);
  void give_private(seq_id seq, block_id b);
  void drop_ref(block_id b);
  void free_block(block_id b);
  bool publish_block(seq_id seq, seq_table& t, std::uint32_t i, std::span<const model::token_id> tokens);

  block_pool& pool_;
  block_copier copy_;  // empty: memcpy through host addresses
  kv_layout layout_;
  kv_pages pages_;
  bool prefix_enabled_;
  std::unordered_map<seq_id, seq_table> tables_;
  std::uint32_t max_blocks_;
  std::vector<seq_id> owner_;        // private block -> owning sequence + 1; 0 when free or cached
  std::vector<std::uint32_t> refs_;  // tables holding the block
  prefix_index index_;
  std::uint32_t used_blocks_ = 0;    // blocks taken from the pool (private and cached)
  std::uint64_t evicted_blocks_ = 0;  // evicted_blocks()
  evicted_hashes evicted_;            // the last max_blocks_ evicted blocks' hashes
};

}  // namespace exa::engine
