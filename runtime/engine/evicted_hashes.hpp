#pragma once
// The hashes of the last `capacity` blocks a prefix cache evicted, oldest
// first out: a "ghost" list. A lookup that misses on a hash still here would
// have hit in a cache about `capacity` blocks larger, so counting such misses
// tells a cache too small for the prefixes it is sent (it thrashes) from one
// whose prompts share nothing. Bounded: at most `capacity` hashes.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <unordered_map>

namespace exa::engine {

class evicted_hashes {
 public:
  explicit evicted_hashes(std::size_t capacity) : capacity_(capacity) {}

  /// Records an evicted block's hash, forgetting the oldest beyond capacity.
  void add(std::uint64_t hash) {
    if (capacity_ == 0) return;
    order_.push_back(hash);
    ++count_[hash];
    if (order_.size() > capacity_) {
      const auto it = count_.find(order_.front());
      if (--it->second == 0) count_.erase(it);
      order_.pop_front();
    }
  }
  bool contains(std::uint64_t hash) const { return count_.find(hash) != count_.end(); }
  std::size_t size() const noexcept { return order_.size(); }
  std::size_t capacity() const noexcept { return capacity_; }

 private:
  std::size_t capacity_;
  std::deque<std::uint64_t> order_;  // oldest first
  std::unordered_map<std::uint64_t, std::uint32_t> count_;  // a hash evicted twice is kept until its last copy goes
};

}  // namespace exa::engine
