#include "engine/kv_cache.hpp"

#include <algorithm>

#include "common/assert.hpp"

namespace exa::engine {

kv_cache::kv_cache(block_pool& pool, kv_layout layout, std::uint32_t max_blocks)
    : pool_(pool),
      layout_(layout),
      max_blocks_(max_blocks == 0 ? pool.capacity_blocks() : std::min(max_blocks, pool.capacity_blocks())),
      owner_(pool.capacity_blocks(), 0) {
  EXA_ASSERT(layout_.block_tokens > 0 && layout_.n_layers > 0 && layout_.kv_dim > 0);
  EXA_ASSERT_MSG(pool_.host_accessible(), "the CPU engine needs host-accessible KV blocks");
  EXA_ASSERT_MSG(pool_.block_bytes() >= layout_.block_bytes(), "pool blocks too small for the KV layout");
}

kv_cache::~kv_cache() {
  while (!tables_.empty()) release(tables_.begin()->first);
}

std::uint32_t kv_cache::blocks_needed(seq_id seq, std::uint32_t n_tokens) const {
  const std::uint32_t want = (n_tokens + layout_.block_tokens - 1) / layout_.block_tokens;
  const auto it = tables_.find(seq);
  const std::uint32_t have = it == tables_.end() ? 0 : static_cast<std::uint32_t>(it->second.size());
  return want > have ? want - have : 0;
}

std::uint32_t kv_cache::free_blocks() const noexcept {
  return std::min(max_blocks_ - used_blocks_, pool_.free_blocks());
}

bool kv_cache::reserve(seq_id seq, std::uint32_t n_tokens) {
  const std::uint32_t need = blocks_needed(seq, n_tokens);
  if (need > max_blocks_ - used_blocks_) return false;
  // Another cache may take the pool's last blocks between the check and the
  // allocation: take them one by one and roll back on a miss.
  std::vector<block_id> taken;
  taken.reserve(need);
  for (std::uint32_t i = 0; i < need; ++i) {
    const auto b = pool_.allocate();
    if (!b) {
      for (const block_id t : taken) pool_.release(t);
      return false;
    }
    taken.push_back(*b);
  }
  auto& table = tables_[seq];
  for (const block_id b : taken) {
    EXA_ASSERT_MSG(owner_[b] == 0, "KV block owned by two sequences");
    owner_[b] = seq + 1;
    table.push_back(b);
    ++used_blocks_;
  }
  return true;
}

void kv_cache::release(seq_id seq) {
  const auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  for (const block_id b : it->second) {
    EXA_ASSERT_MSG(owner_[b] == seq + 1, "KV block released by a sequence that does not own it");
    owner_[b] = 0;
    pool_.release(b);
    --used_blocks_;
  }
  tables_.erase(it);
}

std::uint32_t kv_cache::reserved_tokens(seq_id seq) const {
  const auto it = tables_.find(seq);
  return it == tables_.end() ? 0 : static_cast<std::uint32_t>(it->second.size()) * layout_.block_tokens;
}

const std::vector<block_id>& kv_cache::table(seq_id seq) const {
  const auto it = tables_.find(seq);
  EXA_ASSERT_MSG(it != tables_.end(), "KV table of an unknown sequence");
  return it->second;
}

std::uint16_t* kv_cache::slot(const std::vector<block_id>& table, std::uint32_t layer,
                              std::uint32_t kv, std::uint32_t pos) noexcept {
  const std::uint32_t bi = pos / layout_.block_tokens;
  EXA_ASSERT(bi < table.size());
  auto* base = static_cast<std::uint16_t*>(pool_.address(table[bi]));
  const std::size_t s = pos % layout_.block_tokens;
  const std::size_t index = ((std::size_t{layer} * 2 + kv) * layout_.block_tokens + s) * layout_.kv_dim;
  return base + index;
}

std::uint16_t* kv_cache::k(const std::vector<block_id>& table, std::uint32_t layer,
                           std::uint32_t pos) noexcept {
  return slot(table, layer, 0, pos);
}

std::uint16_t* kv_cache::v(const std::vector<block_id>& table, std::uint32_t layer,
                           std::uint32_t pos) noexcept {
  return slot(table, layer, 1, pos);
}

std::uint32_t kv_cache::capacity_tokens() const noexcept {
  return max_blocks_ * layout_.block_tokens;
}

std::uint32_t kv_cache::free_tokens() const noexcept {
  return free_blocks() * layout_.block_tokens;
}

}  // namespace exa::engine
