// Built when nvcc is absent: the CUDA device reports itself unavailable, so
// callers need no #ifdef to ask for it.
#include "gpu/cuda_device.hpp"
#include "gpu/cuda_memory_pool.hpp"

namespace exa::gpu {

expected<int> cuda_device_count() {
  return make_error(errc::unavailable, "this build of ExaServe has no CUDA support (nvcc was not found)");
}

expected<std::shared_ptr<device>> open_cuda_device(std::uint32_t, const device_options&) {
  auto count = cuda_device_count();
  return std::unexpected(count.error());
}

}  // namespace exa::gpu
