#include "cluster/byte_lru.hpp"

namespace exa::cluster {

void byte_lru::insert(const std::string& key, std::uint64_t bytes) {
  auto& e = entries_[key];
  used_ = used_ - e.bytes + bytes;
  e.bytes = bytes;
  e.last_used = ++clock_;
}

bool byte_lru::touch(const std::string& key) {
  const auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  it->second.last_used = ++clock_;
  return true;
}

bool byte_lru::pin(const std::string& key) {
  const auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  ++it->second.pins;
  it->second.last_used = ++clock_;
  return true;
}

bool byte_lru::unpin(const std::string& key) {
  const auto it = entries_.find(key);
  if (it == entries_.end() || it->second.pins == 0) return false;
  --it->second.pins;
  return true;
}

bool byte_lru::erase(const std::string& key) {
  const auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  used_ -= it->second.bytes;
  entries_.erase(it);
  return true;
}

std::vector<std::string> byte_lru::evict() { return evict_for(0); }

std::vector<std::string> byte_lru::evict_for(std::uint64_t incoming) {
  std::vector<std::string> out;
  while (used_ + incoming > capacity_) {
    auto victim = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->second.pins == 0 && (victim == entries_.end() || it->second.last_used < victim->second.last_used))
        victim = it;
    if (victim == entries_.end()) break;  // the rest is pinned
    out.push_back(victim->first);
    used_ -= victim->second.bytes;
    entries_.erase(victim);
  }
  return out;
}

std::uint32_t byte_lru::pins(const std::string& key) const {
  const auto it = entries_.find(key);
  return it == entries_.end() ? 0 : it->second.pins;
}

std::uint64_t byte_lru::pinned_bytes() const {
  std::uint64_t n = 0;
  for (const auto& [k, e] : entries_)
    if (e.pins > 0) n += e.bytes;
  return n;
}

}  // namespace exa::cluster
