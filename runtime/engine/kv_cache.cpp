#include "engine/kv_cache.hpp"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "common/assert.hpp"
#include "model/prefix_hash.hpp"

namespace exa::engine {

kv_cache::kv_cache(block_pool& pool, kv_layout layout, std::uint32_t max_blocks, bool prefix_cache,
                   block_copier copy)
    : pool_(pool),
      copy_(std::move(copy)),
      layout_(layout),
      pages_(pool, layout),
      prefix_enabled_(prefix_cache),
      max_blocks_(max_blocks == 0 ? pool.capacity_blocks() : std::min(max_blocks, pool.capacity_blocks())),
      owner_(pool.capacity_blocks(), 0),
      refs_(pool.capacity_blocks(), 0),
      index_(pool.capacity_blocks(), layout.block_tokens),
      evicted_(prefix_cache ? max_blocks_ : 0) {
  EXA_ASSERT(layout_.block_tokens > 0 && layout_.n_layers > 0 && layout_.kv_dim > 0);
  EXA_ASSERT_MSG(pool_.host_accessible() || copy_ || !prefix_enabled_,
                 "a prefix cache over device memory needs a block copier");
  EXA_ASSERT_MSG(pool_.block_bytes() >= layout_.block_bytes(), "pool blocks too small for the KV layout");
}

kv_cache::~kv_cache() {
  while (!tables_.empty()) release(tables_.begin()->first);
  // Every cached block is evictable now; the pool outlives this cache.
  while (const auto b = index_.lru()) {
    index_.erase(*b);
    free_block(*b);
  }
  EXA_ASSERT(used_blocks_ == 0);
}

std::uint32_t kv_cache::copies_needed(const seq_table* t, std::uint32_t n_tokens,
                                      std::uint32_t write_from) const {
  if (t == nullptr || write_from >= n_tokens) return 0;
  const std::uint32_t end = std::min<std::uint32_t>(static_cast<std::uint32_t>(t->blocks.size()),
                                                    (n_tokens + layout_.block_tokens - 1) / layout_.block_tokens);
  std::uint32_t n = 0;
  for (std::uint32_t i = write_from / layout_.block_tokens; i < end; ++i) n += index_.contains(t->blocks[i]);
  return n;
}

std::uint32_t kv_cache::blocks_needed(seq_id seq, std::uint32_t n_tokens, std::uint32_t write_from) const {
  const std::uint32_t want = (n_tokens + layout_.block_tokens - 1) / layout_.block_tokens;
  const auto it = tables_.find(seq);
  const seq_table* t = it == tables_.end() ? nullptr : &it->second;
  const std::uint32_t have = t == nullptr ? 0 : static_cast<std::uint32_t>(t->blocks.size());
  return (want > have ? want - have : 0) + copies_needed(t, n_tokens, write_from);
}

std::uint32_t kv_cache::free_blocks() const noexcept {
  return std::min(max_blocks_ - used_blocks_, pool_.free_blocks()) + index_.evictable();
}

bool kv_cache::take_blocks(std::uint32_t n, std::vector<block_id>& out) {
  // Fresh pool blocks first (they keep the cache warm), then evictions.
  // Another cache may take the pool's last blocks between our check and the
  // allocation, so nothing is evicted until the rest is known to be enough.
  const std::size_t start = out.size();
  while (out.size() - start < n && used_blocks_ + (out.size() - start) < max_blocks_) {
    const auto b = pool_.allocate();
    if (!b) break;
    out.push_back(*b);
  }
  const auto fresh = static_cast<std::uint32_t>(out.size() - start);
  if (n - fresh > index_.evictable()) {
    for (std::size_t i = start; i < out.size(); ++i) pool_.release(out[i]);
    out.resize(start);
    return false;
  }
  used_blocks_ += fresh;
  while (out.size() - start < n) {
    const block_id victim = *index_.lru();
    evicted_.add(index_.hash(victim));
    index_.erase(victim);  // stays taken: it moves from the cache to a sequence
    ++evicted_blocks_;
    out.push_back(victim);
  }
  return true;
}

void kv_cache::give_private(seq_id seq, block_id b) {
  EXA_ASSERT_MSG(owner_[b] == 0 && refs_[b] == 0, "KV block owned by two sequences");
  owner_[b] = seq + 1;
  refs_[b] = 1;
}

bool kv_cache::reserve(seq_id seq, std::uint32_t n_tokens, std::uint32_t write_from) {
  const std::uint32_t need = blocks_needed(seq, n_tokens, write_from);
  if (need > free_blocks()) return false;
  std::vector<block_id> taken;
  taken.reserve(need);
  if (!take_blocks(need, taken)) return false;
  auto& t = tables_[seq];
  std::size_t next = 0;
  // Copy-on-write: cached blocks the sequence will write become private copies.
  const std::uint32_t end = std::min<std::uint32_t>(static_cast<std::uint32_t>(t.blocks.size()),
                                                    (n_tokens + layout_.block_tokens - 1) / layout_.block_tokens);
  for (std::uint32_t i = write_from / layout_.block_tokens; write_from < n_tokens && i < end; ++i) {
    const block_id shared = t.blocks[i];
    if (!index_.contains(shared)) continue;
    const block_id copy = taken[next++];
    if (copy_)
      copy_(copy, shared);
    else
      std::memcpy(pool_.address(copy), pool_.address(shared), layout_.block_bytes());
    give_private(seq, copy);
    t.blocks[i] = copy;
    drop_ref(shared);
    if (i < t.published) {
      // The cached chain now ends at the block before the copy.
      t.published = i;
      t.last_hash = i == 0 ? 0 : index_.hash(t.blocks[i - 1]);
      t.last_serial = i == 0 ? 0 : index_.serial(t.blocks[i - 1]);
    }
  }
  while (next < taken.size()) {
    give_private(seq, taken[next]);
    t.blocks.push_back(taken[next++]);
  }
  return true;
}

void kv_cache::free_block(block_id b) {
  pool_.release(b);
  --used_blocks_;
}

void kv_cache::drop_ref(block_id b) {
  EXA_ASSERT_MSG(refs_[b] > 0, "KV block released more often than referenced");
  if (--refs_[b] == 0) index_.park(b);
}

void kv_cache::release(seq_id seq) {
  const auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  // Last block first: a prefix's later blocks become evictable before its
  // first ones, which more sequences share.
  auto& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) {
    if (index_.contains(*b)) {
      drop_ref(*b);
      continue;
    }
    EXA_ASSERT_MSG(owner_[*b] == seq + 1 && refs_[*b] == 1, "KV block released by a sequence that does not own it");
    owner_[*b] = 0;
    refs_[*b] = 0;
    free_block(*b);
  }
  tables_.erase(it);
}

std::uint32_t kv_cache::attach_prefix(seq_id seq, std::span<const model::token_id> tokens) {
  if (!prefix_enabled_) return 0;
  const auto it = tables_.find(seq);
  EXA_ASSERT_MSG(it == tables_.end() || it->second.blocks.empty(), "prefix attached to a sequence holding blocks");
  const std::uint32_t bt = layout_.block_tokens;
  seq_table found;
  for (std::size_t i = 0; (i + 1) * bt <= tokens.size(); ++i) {
    const auto block = tokens.subspan(i * bt, bt);
    const std::uint64_t h = model::block_hash(found.last_hash, block);
    const auto b = index_.find(h, found.last_serial, block);
    if (!b) break;
    found.blocks.push_back(*b);
    found.last_hash = h;
    found.last_serial = index_.serial(*b);
  }
  if (found.blocks.empty()) return 0;
  found.published = static_cast<std::uint32_t>(found.blocks.size());
  // Most recently used: the first block last, so summaries list prefixes first.
  for (auto b = found.blocks.rbegin(); b != found.blocks.rend(); ++b) {
    if (refs_[*b]++ == 0) index_.unpark(*b);
    index_.touch(*b);
  }
  const auto attached = static_cast<std::uint32_t>(found.blocks.size()) * bt;
  tables_[seq] = std::move(found);
  return attached;
}

std::uint32_t kv_cache::evicted_run_tokens(seq_id seq, std::span<const model::token_id> tokens) const {
  if (evicted_.size() == 0) return 0;  // also: no prefix cache
  // The whole blocks after the attached run, chained to it (from 0 when
  // nothing was attached).
  const auto it = tables_.find(seq);
  std::uint64_t parent = it == tables_.end() ? 0 : it->second.last_hash;
  const std::uint32_t bt = layout_.block_tokens;
  std::uint32_t run = 0;
  for (std::size_t i = it == tables_.end() ? 0 : it->second.published; (i + 1) * bt <= tokens.size(); ++i) {
    const std::uint64_t h = model::block_hash(parent, tokens.subspan(i * bt, bt));
    if (!evicted_.contains(h)) break;
    run += bt;
    parent = h;
  }
  return run;
}

bool kv_cache::publish_block(seq_id seq, seq_table& t, std::uint32_t i,
                             std::span<const model::token_id> tokens) {
  const std::uint32_t bt = layout_.block_tokens;
  const auto block = tokens.subspan(std::size_t{i} * bt, bt);
  const std::uint64_t h = model::block_hash(t.last_hash, block);
  block_id& b = t.blocks[i];
  if (!index_.contains(b)) {
    EXA_ASSERT_MSG(owner_[b] == seq + 1, "KV block published by a sequence that does not own it");
    if (const auto cached = index_.find(h, t.last_serial, block)) {
      // Computed twice (two sequences prefilled it side by side): share the
      // cached copy, give ours back.
      owner_[b] = 0;
      refs_[b] = 0;
      free_block(b);
      if (refs_[*cached]++ == 0) index_.unpark(*cached);
      b = *cached;
    } else {
      if (const auto other = index_.holder(h)) {
        // A different prefix under this hash (a collision, or an entry whose
        // parent was evicted): replace it if nobody uses it, else stop here.
        if (!index_.parked(*other)) return false;
        evicted_.add(index_.hash(*other));
        index_.erase(*other);
        free_block(*other);
        ++evicted_blocks_;
      }
      index_.insert(b, h, t.last_serial, block);
      owner_[b] = 0;
    }
  }
  EXA_ASSERT(index_.hash(b) == h);
  index_.touch(b);
  t.last_hash = h;
  t.last_serial = index_.serial(b);
  t.published = i + 1;
  return true;
}

void kv_cache::publish(seq_id seq, std::span<const model::token_id> tokens, std::uint32_t computed) {
  if (!prefix_enabled_) return;
  const auto it = tables_.find(seq);
  EXA_ASSERT_MSG(it != tables_.end(), "publish of an unknown sequence");
  seq_table& t = it->second;
  const std::uint32_t bt = layout_.block_tokens;
  const std::uint32_t full = std::min<std::size_t>(computed, tokens.size()) / bt;
  EXA_ASSERT(full <= t.blocks.size());
  while (!t.unpublishable && t.published < full)
    if (!publish_block(seq, t, t.published, tokens)) t.unpublishable = true;
}

void kv_cache::assert_writable(seq_id seq, std::uint32_t from, std::uint32_t to) const {
  if (from >= to) return;
  const auto& blocks = table(seq);
  EXA_ASSERT_MSG((to + layout_.block_tokens - 1) / layout_.block_tokens <= blocks.size(),
                 "writing past a sequence's reserved blocks");
  for (std::uint32_t i = from / layout_.block_tokens; i * layout_.block_tokens < to; ++i)
    EXA_ASSERT_MSG(owner_[blocks[i]] == seq + 1, "a sequence would write a KV block it does not own");
}

std::uint32_t kv_cache::reserved_tokens(seq_id seq) const {
  const auto it = tables_.find(seq);
  return it == tables_.end() ? 0 : static_cast<std::uint32_t>(it->second.blocks.size()) * layout_.block_tokens;
}

const std::vector<block_id>& kv_cache::table(seq_id seq) const {
  const auto it = tables_.find(seq);
  EXA_ASSERT_MSG(it != tables_.end(), "KV table of an unknown sequence");
  return it->second.blocks;
}

std::uint32_t kv_cache::capacity_tokens() const noexcept {
  return max_blocks_ * layout_.block_tokens;
}

std::uint32_t kv_cache::free_tokens() const noexcept {
  return free_blocks() * layout_.block_tokens;
}

void kv_cache::check_invariants() const {
  std::vector<std::uint32_t> seen(refs_.size(), 0);
  std::uint32_t private_blocks = 0;
  for (const auto& [seq, t] : tables_) {
    std::unordered_set<block_id> in_table;
    EXA_ASSERT(t.published <= t.blocks.size());
    for (std::size_t i = 0; i < t.blocks.size(); ++i) {
      const block_id b = t.blocks[i];
      EXA_ASSERT_MSG(in_table.insert(b).second, "a block twice in one table");
      ++seen[b];
      if (index_.contains(b)) {
        EXA_ASSERT_MSG(owner_[b] == 0, "a cached block with an owner");
      } else {
        EXA_ASSERT_MSG(owner_[b] == seq + 1, "a private block in another sequence's table");
        EXA_ASSERT_MSG(i >= t.published, "a published block that is not cached");
        ++private_blocks;
      }
    }
  }
  for (block_id b = 0; b < refs_.size(); ++b) {
    EXA_ASSERT_MSG(refs_[b] == seen[b], "reference count differs from the tables");
    EXA_ASSERT_MSG(index_.parked(b) == (index_.contains(b) && refs_[b] == 0), "evictable iff cached and unreferenced");
    if (owner_[b] != 0) EXA_ASSERT(refs_[b] == 1 && !index_.contains(b));
  }
  EXA_ASSERT_MSG(used_blocks_ == private_blocks + index_.size(), "held blocks differ from the count");
  EXA_ASSERT_MSG(used_blocks_ <= max_blocks_, "over the quota");
}

}  // namespace exa::engine
