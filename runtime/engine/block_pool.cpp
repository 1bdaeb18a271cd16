#include "engine/block_pool.hpp"

#include "common/assert.hpp"

namespace exa::engine {

block_free_list::block_free_list(std::uint32_t capacity) : in_use_(capacity, false) {
  free_.reserve(capacity);
  for (std::uint32_t i = capacity; i > 0; --i) free_.push_back(i - 1);
}

std::optional<block_id> block_free_list::allocate() noexcept {
  if (free_.empty()) return std::nullopt;
  const block_id b = free_.back();
  free_.pop_back();
  EXA_ASSERT_MSG(!in_use_[b], "block handed out twice");
  in_use_[b] = true;
  return b;
}

void block_free_list::release(block_id b) {
  EXA_ASSERT_MSG(b < in_use_.size(), "release of a block id outside the pool");
  EXA_ASSERT_MSG(in_use_[b], "release of a block that is not allocated");
  in_use_[b] = false;
  free_.push_back(b);
}

}  // namespace exa::engine
