#pragma once
// The KV blocks of a tensor-parallel group: one group block is one block on
// every member's device pool, taken and returned together, so the replica's
// one scheduler and kv_cache account for every member at once while each
// member's K and V (its KV heads only) stay on its own device. Group block ids
// are this pool's own (members' pools may be shared with other replicas, so
// their ids differ); member_pages() maps them to a member's blocks.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/block_pool.hpp"
#include "engine/kv_pages.hpp"

namespace exa::engine {

class tp_block_pool final : public block_pool {
 public:
  /// `members` (at least one) must outlive this pool. Capacity: the smallest
  /// member's. Host-accessible members' blocks are read through
  /// member_pages(); device members' (CUDA) through member_block().
  explicit tp_block_pool(std::vector<block_pool*> members);
  ~tp_block_pool() override;
  tp_block_pool(const tp_block_pool&) = delete;
  tp_block_pool& operator=(const tp_block_pool&) = delete;

  /// The smallest member block.
  std::size_t block_bytes() const noexcept override { return block_bytes_; }
  std::uint32_t capacity_blocks() const noexcept override { return ids_.capacity(); }
  /// Group blocks that can be taken now: limited by the member with the
  /// fewest free blocks (other replicas may share its device).
  std::uint32_t free_blocks() const noexcept override;
  /// A block on every member, or nullopt (and nothing taken) when any member
  /// has none left.
  std::optional<block_id> allocate() noexcept override;
  void release(block_id block) override;
  /// Member 0's block. The forward writes each member's blocks through
  /// member_pages(); a copy through this address (kv_cache's copy-on-write,
  /// used only by its prefix cache) would copy member 0's alone, so a kv_cache
  /// over this pool must not cache prefixes.
  void* address(block_id block) noexcept override;
  bool host_accessible() const noexcept override { return host_; }

  std::size_t members() const noexcept { return members_.size(); }
  /// Member `r`'s view of the group's blocks, for its forward pass.
  kv_pages member_pages(std::size_t r, kv_layout layout) const;
  /// Member `r`'s block for group block `group` (allocated).
  block_id member_block(std::size_t r, block_id group) const;

 private:
  std::vector<block_pool*> members_;
  std::size_t block_bytes_ = 0;
  bool host_ = true;  // every member's blocks are host memory
  block_free_list ids_;
  std::vector<std::vector<block_id>> blocks_;  // [member][group block] -> member block
};

}  // namespace exa::engine
