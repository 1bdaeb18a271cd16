#include "gpu/cpu_memory_pool.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <string>

#include "common/assert.hpp"

namespace exa::gpu {

expected<std::unique_ptr<cpu_memory_pool>> cpu_memory_pool::create(std::size_t block_bytes,
                                                                    std::uint32_t block_count, bool prefault) {
  if (block_bytes == 0 || block_count == 0)
    return make_error(errc::invalid_argument, "memory pool needs a nonzero block size and count");
  const std::size_t rounded = (block_bytes + 63) / 64 * 64;
  if (rounded > std::numeric_limits<std::size_t>::max() / block_count)
    return make_error(errc::invalid_argument, "memory pool size overflows");
  const std::size_t total = rounded * block_count;
  // Anonymous mapping: page-aligned, zeroed, and returned to the OS whole.
  void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    return make_error(errc::out_of_memory, "cannot reserve " + std::to_string(total) +
                                               " bytes for the CPU device pool: " + std::strerror(errno));
  auto* region = static_cast<std::byte*>(p);
  if (prefault)
    for (std::size_t off = 0; off < total; off += 4096) region[off] = std::byte{0};
  return std::unique_ptr<cpu_memory_pool>(new cpu_memory_pool(region, total, rounded, block_count));
}

cpu_memory_pool::cpu_memory_pool(std::byte* region, std::size_t region_bytes,
                                 std::size_t block_bytes, std::uint32_t block_count)
    : region_(region), region_bytes_(region_bytes), block_bytes_(block_bytes), free_(block_count) {}

cpu_memory_pool::~cpu_memory_pool() { ::munmap(region_, region_bytes_); }

std::uint32_t cpu_memory_pool::free_blocks() const noexcept {
  std::lock_guard lock(mutex_);
  return free_.free_count();
}

std::optional<engine::block_id> cpu_memory_pool::allocate() noexcept {
  std::lock_guard lock(mutex_);
  return free_.allocate();
}

void cpu_memory_pool::release(engine::block_id block) {
  std::lock_guard lock(mutex_);
  free_.release(block);
}

void* cpu_memory_pool::address(engine::block_id block) noexcept {
  EXA_ASSERT_MSG(block < free_.capacity(), "block id outside the pool");
  return region_ + std::size_t{block} * block_bytes_;
}

}  // namespace exa::gpu
