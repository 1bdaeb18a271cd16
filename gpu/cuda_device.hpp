#pragma once
// The CUDA device: one GPU. Its pool is one cudaMalloc'd region (see
// cuda_memory_pool), its executor a host thread that runs engine work
// against the device's stream and reports each task's end from the stream
// itself (cudaLaunchHostFunc), so no CAF thread ever waits on the GPU. Built
// only with nvcc (EXASERVE_HAVE_CUDA); without it, and on a host without a
// usable GPU, open_cuda_device() is `unavailable` naming the CUDA runtime's
// reason, so callers need no #ifdef.

#include <cstdint>
#include <memory>

#include "common/error.hpp"
#include "gpu/cuda_memory_pool.hpp"
#include "gpu/device.hpp"

namespace exa::gpu {

/// The GPU with CUDA runtime index `index`. Its memory budget is
/// options.memory_bytes cut to what the card has free (less 5 % of it for
/// the CUDA context and libraries); its KV pool takes kv_pool_percent of
/// the budget. Errors: unavailable (no usable GPU, no CUDA support in this
/// build), invalid_argument (no such GPU, a budget under one page),
/// out_of_memory.
expected<std::shared_ptr<device>> open_cuda_device(std::uint32_t index, const device_options& options);

/// The budget a CUDA device of `requested` bytes gets on a card with
/// `free_bytes` of `total_bytes` free: pure, so it is tested without a GPU.
std::uint64_t cuda_memory_budget(std::uint64_t requested, std::uint64_t free_bytes, std::uint64_t total_bytes);

}  // namespace exa::gpu
