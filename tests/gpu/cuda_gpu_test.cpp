// cuda_gpu_test: the CUDA kernels op by op against the CPU engine's ops
// (cuda_ops_check.cpp) and the CUDA engine against the CPU engine end to end,
// with batch invariance on the GPU (cuda_engine_check.cpp). It needs a GPU of
// compute capability 8.0 or newer (the matmul runs mma.sync); without one it
// prints why and exits 77, which ctest reports as SKIPPED -- never as passed.

#define CATCH_CONFIG_RUNNER
#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "gpu/cuda_memory_pool.hpp"

int main(int argc, char** argv) {
  const auto devices = exa::gpu::cuda_device_count();
  if (!devices) {
    std::printf("SKIPPED: %s\n", devices.error().message.c_str());
    return 77;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::printf("SKIPPED: cudaGetDeviceProperties failed\n");
    return 77;
  }
  if (prop.major < 8) {
    std::printf("SKIPPED: %s has compute capability %d.%d; the CUDA engine needs 8.0 or newer\n", prop.name,
                prop.major, prop.minor);
    return 77;
  }
  std::printf("cuda_gpu_test on %s (compute capability %d.%d)\n", prop.name, prop.major, prop.minor);
  return Catch::Session().run(argc, argv);
}
