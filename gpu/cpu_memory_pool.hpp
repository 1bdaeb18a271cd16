#pragma once
// The CPU device's memory pool: one host region reserved (and touched) once
// when the device starts, carved into equal blocks. Block addresses never
// change and nothing is allocated afterwards. Replicas sharing a device take
// and return blocks from different threads, so the free list is locked.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "common/error.hpp"
#include "engine/block_pool.hpp"

namespace exa::gpu {

class cpu_memory_pool final : public engine::block_pool {
 public:
  /// Reserves `block_count` blocks of `block_bytes` (rounded up to 64 bytes).
  /// With `prefault` every page is touched now, so the first requests do not
  /// pay for page faults; without it the host commits memory as blocks are
  /// first used (a large CPU device then costs only what it holds).
  /// Errors: invalid_argument for zero sizes or an overflowing total,
  /// out_of_memory when the host cannot provide the region.
  static expected<std::unique_ptr<cpu_memory_pool>> create(std::size_t block_bytes, std::uint32_t block_count,
                                                           bool prefault = false);
  ~cpu_memory_pool() override;

  std::size_t block_bytes() const noexcept override { return block_bytes_; }
  std::uint32_t capacity_blocks() const noexcept override { return free_.capacity(); }
  std::uint32_t free_blocks() const noexcept override;
  std::optional<engine::block_id> allocate() noexcept override;
  void release(engine::block_id block) override;
  void* address(engine::block_id block) noexcept override;
  bool host_accessible() const noexcept override { return true; }

  std::size_t total_bytes() const noexcept { return region_bytes_; }

 private:
  cpu_memory_pool(std::byte* region, std::size_t region_bytes, std::size_t block_bytes,
                  std::uint32_t block_count);

  std::byte* region_;
  std::size_t region_bytes_;
  std::size_t block_bytes_;
  mutable std::mutex mutex_;
  engine::block_free_list free_;  // guarded by mutex_
};

}  // namespace exa::gpu
