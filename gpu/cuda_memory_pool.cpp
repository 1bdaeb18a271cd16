#include "gpu/cuda_memory_pool.hpp"

#include <cuda_runtime_api.h>

#include <limits>

#include "common/assert.hpp"

namespace exa::gpu {

expected<int> cuda_device_count() {
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess)
    return make_error(errc::unavailable, std::string("no usable CUDA device: ") + cudaGetErrorString(rc));
  if (n == 0) return make_error(errc::unavailable, "no CUDA device present");
  return n;
}

expected<std::unique_ptr<cuda_memory_pool>> cuda_memory_pool::create(int device,
                                                                     std::size_t block_bytes,
                                                                     std::uint32_t block_count) {
  if (block_bytes == 0 || block_count == 0)
    return make_error(errc::invalid_argument, "memory pool needs a nonzero block size and count");
  const std::size_t rounded = (block_bytes + 255) / 256 * 256;
  if (rounded > std::numeric_limits<std::size_t>::max() / block_count)
    return make_error(errc::invalid_argument, "memory pool size overflows");
  auto count = cuda_device_count();
  if (!count) return std::unexpected(count.error());
  if (device < 0 || device >= *count)
    return make_error(errc::invalid_argument, "CUDA device " + std::to_string(device) + " does not exist");
  if (cudaError_t rc = cudaSetDevice(device); rc != cudaSuccess)
    return make_error(errc::unavailable, std::string("cudaSetDevice: ") + cudaGetErrorString(rc));
  void* region = nullptr;
  // Plain device memory (not managed): the pool never oversubscribes the card.
  if (cudaError_t rc = cudaMalloc(&region, rounded * block_count); rc != cudaSuccess)
    return make_error(errc::out_of_memory, "cudaMalloc of " + std::to_string(rounded * block_count) +
                                               " bytes: " + cudaGetErrorString(rc));
  return std::unique_ptr<cuda_memory_pool>(new cuda_memory_pool(device, region, rounded, block_count));
}

cuda_memory_pool::cuda_memory_pool(int device, void* region, std::size_t block_bytes,
                                   std::uint32_t block_count)
    : device_(device), region_(region), block_bytes_(block_bytes), free_(block_count) {}

cuda_memory_pool::~cuda_memory_pool() {
  cudaSetDevice(device_);
  cudaFree(region_);
}

std::uint32_t cuda_memory_pool::free_blocks() const noexcept {
  std::lock_guard lock(mutex_);
  return free_.free_count();
}

std::optional<engine::block_id> cuda_memory_pool::allocate() noexcept {
  std::lock_guard lock(mutex_);
  return free_.allocate();
}

void cuda_memory_pool::release(engine::block_id block) {
  std::lock_guard lock(mutex_);
  free_.release(block);
}

void* cuda_memory_pool::address(engine::block_id block) noexcept {
  EXA_ASSERT_MSG(block < free_.capacity(), "block id outside the pool");
  return static_cast<std::byte*>(region_) + std::size_t{block} * block_bytes_;
}

}  // namespace exa::gpu
