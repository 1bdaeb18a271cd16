#pragma once
// The interface between the engine and a device's memory: a region reserved
// once when the device starts, carved into equal blocks (KV-cache pages).
// Creating and destroying sequences or replicas never allocates device memory,
// so nothing fragments. The CPU device (gpu/cpu_memory_pool) and the CUDA
// device (gpu/cuda_memory_pool) implement it; the bookkeeping they share is
// block_free_list below.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace exa::engine {

using block_id = std::uint32_t;

class block_pool {
 public:
  virtual ~block_pool() = default;

  virtual std::size_t block_bytes() const noexcept = 0;
  virtual std::uint32_t capacity_blocks() const noexcept = 0;
  virtual std::uint32_t free_blocks() const noexcept = 0;

  /// A free block, or nullopt when none is left (never allocates memory).
  virtual std::optional<block_id> allocate() noexcept = 0;
  /// Returns a block; releasing a block that is not allocated is a bug (asserts).
  virtual void release(block_id block) = 0;

  /// Address of a block: a host pointer for CPU memory, a device pointer for
  /// GPU memory (see host_accessible()).
  virtual void* address(block_id block) noexcept = 0;
  virtual bool host_accessible() const noexcept = 0;
};

/// Free-list bookkeeping over `capacity` blocks: O(1) allocate and release,
/// lowest ids first after construction, and a per-block flag so a double
/// allocation or double release trips an assertion instead of corrupting a
/// sequence's cache.
class block_free_list {
 public:
  explicit block_free_list(std::uint32_t capacity);

  std::uint32_t capacity() const noexcept { return static_cast<std::uint32_t>(in_use_.size()); }
  std::uint32_t free_count() const noexcept { return static_cast<std::uint32_t>(free_.size()); }
  bool in_use(block_id b) const noexcept { return b < in_use_.size() && in_use_[b]; }

  std::optional<block_id> allocate() noexcept;
  void release(block_id b);

 private:
  std::vector<block_id> free_;  // stack; back() is handed out next
  std::vector<bool> in_use_;
};

}  // namespace exa::engine
