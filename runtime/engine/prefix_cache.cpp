#include "engine/prefix_cache.hpp"

#include <algorithm>

#include "common/assert.hpp"

namespace exa::engine {

prefix_index::prefix_index(std::uint32_t capacity_blocks, std::uint32_t block_tokens)
    : block_tokens_(block_tokens), entries_(capacity_blocks) {
  EXA_ASSERT(block_tokens_ > 0);
}

const prefix_index::entry& prefix_index::at(block_id b) const {
  EXA_ASSERT_MSG(contains(b), "prefix cache entry of a block that is not cached");
  return entries_[b];
}

std::optional<block_id> prefix_index::holder(std::uint64_t hash) const {
  const auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  return it->second;
}

std::optional<block_id> prefix_index::find(std::uint64_t hash, std::uint64_t parent_serial,
                                           std::span<const model::token_id> tokens) const {
  const auto b = holder(hash);
  if (!b) return std::nullopt;
  const entry& e = at(*b);
  if (e.parent_serial != parent_serial) return std::nullopt;
  if (!std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin(), tokens.end())) return std::nullopt;
  return b;
}

std::uint64_t prefix_index::serial(block_id b) const { return at(b).serial; }
std::uint64_t prefix_index::hash(block_id b) const { return at(b).hash; }

std::uint64_t prefix_index::insert(block_id b, std::uint64_t hash, std::uint64_t parent_serial,
                                   std::span<const model::token_id> tokens) {
  EXA_ASSERT(b < entries_.size());
  EXA_ASSERT_MSG(!contains(b), "block cached twice");
  EXA_ASSERT_MSG(tokens.size() == block_tokens_, "only full blocks are cached");
  const bool fresh = by_hash_.emplace(hash, b).second;
  EXA_ASSERT_MSG(fresh, "two blocks cached under one hash");
  entry& e = entries_[b];
  e.serial = next_serial_++;
  e.parent_serial = parent_serial;
  e.hash = hash;
  e.used_tick = ++tick_;
  e.tokens.assign(tokens.begin(), tokens.end());
  e.is_parked = false;
  return e.serial;
}

void prefix_index::erase(block_id b) {
  entry& e = entries_[b];
  EXA_ASSERT_MSG(contains(b), "erase of a block that is not cached");
  if (e.is_parked) lru_.erase(e.lru_pos);
  by_hash_.erase(e.hash);
  e = entry{};
}

void prefix_index::touch(block_id b) {
  EXA_ASSERT(contains(b));
  entries_[b].used_tick = ++tick_;
}

void prefix_index::park(block_id b) {
  EXA_ASSERT(contains(b));
  entry& e = entries_[b];
  EXA_ASSERT_MSG(!e.is_parked, "cached block released twice");
  e.is_parked = true;
  e.lru_pos = lru_.insert(lru_.end(), b);
  e.used_tick = ++tick_;
}

void prefix_index::unpark(block_id b) {
  EXA_ASSERT(contains(b));
  entry& e = entries_[b];
  EXA_ASSERT_MSG(e.is_parked, "unpark of a referenced block");
  lru_.erase(e.lru_pos);
  e.is_parked = false;
}

std::optional<block_id> prefix_index::lru() const {
  if (lru_.empty()) return std::nullopt;
  return lru_.front();
}

std::vector<std::uint64_t> prefix_index::cached_hashes(std::size_t max) const {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> by_tick;  // (tick, hash)
  by_tick.reserve(by_hash_.size());
  for (const auto& [hash, b] : by_hash_) by_tick.emplace_back(entries_[b].used_tick, hash);
  const std::size_t n = std::min(max, by_tick.size());
  std::partial_sort(by_tick.begin(), by_tick.begin() + static_cast<std::ptrdiff_t>(n), by_tick.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::uint64_t> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) out.push_back(by_tick[i].second);
  return out;
}

}  // namespace exa::engine
