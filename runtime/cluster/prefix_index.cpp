#include "cluster/prefix_index.hpp"

#include <algorithm>

#include "common/assert.hpp"

namespace exa::cluster {

prefix_index::prefix_index(prefix_index_config config) : config_(config) {
  EXA_ASSERT(config_.reported_max > 0);
}

void prefix_index::replace(replica_id id, std::uint32_t block_tokens,
                           std::span<const std::uint64_t> hashes_mru_first) {
  if (block_tokens == 0) {
    forget(id);
    return;
  }
  block_tokens_ = block_tokens;
  entry& e = replicas_[id];
  if (e.block_tokens != block_tokens) {
    // A new block size (an engine restarted with another configuration):
    // nothing held under the old one can match any more.
    e = entry{};
    e.block_tokens = block_tokens;
  }
  e.reported.clear();
  const std::size_t n = std::min<std::size_t>(hashes_mru_first.size(), config_.reported_max);
  e.reported.insert(hashes_mru_first.begin(), hashes_mru_first.begin() + static_cast<std::ptrdiff_t>(n));
  // Blocks routed since the previous report may still be on their way to
  // the engine: keep them through this report, drop the older ones.
  e.carried = std::move(e.pending);
  e.pending.clear();
  e.pending_order.clear();
}

void prefix_index::note_routed(replica_id id, std::uint32_t block_tokens, std::span<const std::uint64_t> hashes) {
  const auto it = replicas_.find(id);
  if (it == replicas_.end() || block_tokens == 0 || it->second.block_tokens != block_tokens) return;
  entry& e = it->second;
  for (const std::uint64_t h : hashes) {
    // Also a hash the replica reported: the next report may no longer have
    // it (evicted), while this request will bring it back.
    if (e.pending.count(h) > 0) continue;
    e.pending.insert(h);
    e.pending_order.push_back(h);
    if (e.pending_order.size() > config_.pending_max) {
      e.pending.erase(e.pending_order.front());
      e.pending_order.pop_front();
    }
  }
  EXA_ASSERT(e.pending.size() == e.pending_order.size() && e.pending.size() <= config_.pending_max);
}

void prefix_index::forget(replica_id id) { replicas_.erase(id); }

std::size_t prefix_index::matched_blocks(replica_id id, std::uint32_t block_tokens,
                                         std::span<const std::uint64_t> hashes) const {
  const auto it = replicas_.find(id);
  if (it == replicas_.end() || block_tokens == 0 || it->second.block_tokens != block_tokens) return 0;
  std::size_t n = 0;
  while (n < hashes.size() && holds(it->second, hashes[n])) ++n;
  return n;
}

std::size_t prefix_index::held(replica_id id) const {
  const auto it = replicas_.find(id);
  if (it == replicas_.end()) return 0;
  return it->second.reported.size() + it->second.pending.size() + it->second.carried.size();
}

}  // namespace exa::cluster
