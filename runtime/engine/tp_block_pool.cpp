#include "engine/tp_block_pool.hpp"

#include <algorithm>

#include "common/assert.hpp"

namespace exa::engine {
namespace {

std::uint32_t smallest_capacity(const std::vector<block_pool*>& members) {
  EXA_ASSERT_MSG(!members.empty(), "a tensor-parallel group without members");
  std::uint32_t n = members.front()->capacity_blocks();
  for (const block_pool* m : members) n = std::min(n, m->capacity_blocks());
  return n;
}

}  // namespace

tp_block_pool::tp_block_pool(std::vector<block_pool*> members)
    : members_(std::move(members)), ids_(smallest_capacity(members_)) {
  block_bytes_ = members_.front()->block_bytes();
  for (block_pool* m : members_) {
    EXA_ASSERT(m != nullptr);
    host_ = host_ && m->host_accessible();
    block_bytes_ = std::min(block_bytes_, m->block_bytes());
  }
  blocks_.assign(members_.size(), std::vector<block_id>(ids_.capacity(), 0));
}

tp_block_pool::~tp_block_pool() {
  EXA_ASSERT_MSG(ids_.free_count() == ids_.capacity(), "a tensor-parallel pool destroyed with blocks in use");
}

std::uint32_t tp_block_pool::free_blocks() const noexcept {
  std::uint32_t n = ids_.free_count();
  for (const block_pool* m : members_) n = std::min(n, m->free_blocks());
  return n;
}

std::optional<block_id> tp_block_pool::allocate() noexcept {
  const auto id = ids_.allocate();
  if (!id) return std::nullopt;
  for (std::size_t r = 0; r < members_.size(); ++r) {
    const auto b = members_[r]->allocate();
    if (!b) {  // all or nothing
      while (r-- > 0) members_[r]->release(blocks_[r][*id]);
      ids_.release(*id);
      return std::nullopt;
    }
    blocks_[r][*id] = *b;
  }
  return id;
}

void tp_block_pool::release(block_id block) {
  EXA_ASSERT_MSG(ids_.in_use(block), "release of a tensor-parallel block that is not allocated");
  for (std::size_t r = 0; r < members_.size(); ++r) members_[r]->release(blocks_[r][block]);
  ids_.release(block);
}

void* tp_block_pool::address(block_id block) noexcept {
  EXA_ASSERT(ids_.in_use(block));
  return members_.front()->address(blocks_.front()[block]);
}

block_id tp_block_pool::member_block(std::size_t r, block_id group) const {
  EXA_ASSERT(r < members_.size() && ids_.in_use(group));
  return blocks_[r][group];
}

kv_pages tp_block_pool::member_pages(std::size_t r, kv_layout layout) const {
  EXA_ASSERT(r < members_.size());
  EXA_ASSERT_MSG(members_[r]->host_accessible(), "a CPU tensor-parallel member needs host-accessible KV blocks");
  EXA_ASSERT_MSG(members_[r]->block_bytes() >= layout.block_bytes(), "member pool blocks too small for the KV layout");
  return kv_pages(*members_[r], layout, &blocks_[r]);
}

}  // namespace exa::engine
