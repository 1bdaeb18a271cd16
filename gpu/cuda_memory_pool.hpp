#pragma once
// The CUDA device's memory pool: the same block_pool interface as the CPU
// device, over one cudaMalloc'd region reserved when the device starts. Built
// only when nvcc is found (EXASERVE_HAVE_CUDA); on a machine without a GPU,
// create() returns `unavailable` with the CUDA runtime's reason, and nothing
// else changes.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "common/error.hpp"
#include "engine/block_pool.hpp"

namespace exa::gpu {

/// Number of CUDA devices visible, or an `unavailable` error naming why none
/// can be used (no driver, no device). Always an error without CUDA support.
expected<int> cuda_device_count();

#if defined(EXASERVE_HAVE_CUDA)
class cuda_memory_pool final : public engine::block_pool {
 public:
  static expected<std::unique_ptr<cuda_memory_pool>> create(int device, std::size_t block_bytes,
                                                            std::uint32_t block_count);
  ~cuda_memory_pool() override;

  std::size_t block_bytes() const noexcept override { return block_bytes_; }
  std::uint32_t capacity_blocks() const noexcept override { return free_.capacity(); }
  std::uint32_t free_blocks() const noexcept override;
  std::optional<engine::block_id> allocate() noexcept override;
  void release(engine::block_id block) override;
  void* address(engine::block_id block) noexcept override;
  bool host_accessible() const noexcept override { return false; }

  int device() const noexcept { return device_; }

 private:
  cuda_memory_pool(int device, void* region, std::size_t block_bytes, std::uint32_t block_count);

  int device_;
  void* region_;
  std::size_t block_bytes_;
  // Engines on the device's thread take blocks while an engine destroyed on
  // an actor's thread returns its own: the free list is locked.
  mutable std::mutex mutex_;
  engine::block_free_list free_;  // guarded by mutex_
};
#endif

}  // namespace exa::gpu
