#pragma once
// One replica tensor-parallel over G CUDA devices: engine::tp_engine (one
// scheduler, one KV accounting, one sampler; tp_engine.hpp) whose members are
// CUDA forwards in tensor-parallel mode (cuda_forward_config::comm), one per
// GPU, each on a stream of its own, joined by an NCCL group
// (nccl_communicator.hpp). The group forms here: rank 0 makes the unique id,
// then every member joins on a thread of its own (ncclCommInitRank returns
// only once all have called it), bounded by the collective timeout.
//
// UNPROVEN ON HARDWARE: compiled against CUDA and nccl.h, tested here only
// for its refusals (no GPU, no NCCL, bad requests); tests/gpu/cuda_tp_test.cpp
// compares its logits with one GPU's on a machine with two GPUs or more.
//
// Declared in every build; without CUDA support make_cuda_tp_engine returns
// `unavailable` ("built without CUDA"); with it but no usable device,
// `unavailable` with the CUDA runtime's reason; without NCCL, `unavailable`
// with the loader's.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "engine/block_pool.hpp"
#include "engine/cpu_engine.hpp"
#include "engine/engine.hpp"
#include "model/llama_model.hpp"

namespace exa::gpu {

struct cuda_tp_options {
  /// Scheduling bounds and KV block size as for the CUDA engine; the prefix
  /// cache is off and a draft model is refused (tp_engine.hpp).
  engine::cpu_engine_config engine;
  /// Member r runs on CUDA device devices[r]; two or more, distinct.
  std::vector<int> devices;
  /// Each member device's KV pool (a cuda_memory_pool on devices[r]), shared
  /// with its other replicas; they must outlive the engine. Empty: the engine
  /// reserves a pool of `own_kv_blocks` blocks on each device.
  std::vector<engine::block_pool*> kv_pools;
  std::uint32_t own_kv_blocks = 0;
  /// Bounds the group's forming and every step's collectives; past it the
  /// group is aborted and the engine fails.
  std::chrono::milliseconds collective_timeout{60000};
};

struct cuda_tp_engine {
  std::unique_ptr<engine::inference_engine> engine;
  /// Aborts the group's NCCL communicators (any thread, idempotent).
  std::function<void(const std::string& reason)> abort;
};

/// Errors: unavailable (no CUDA in this build, no usable GPU or NCCL -- with
/// the runtime's or loader's reason -- or the group did not form in time),
/// invalid_argument (fewer than two devices, a device repeated or absent, a
/// model that does not split evenly over them, pools not one per device),
/// unsupported (a weight the CUDA kernels do not take, a draft model),
/// out_of_memory.
expected<cuda_tp_engine> make_cuda_tp_engine(std::shared_ptr<const model::llama_model> model, cuda_tp_options options);

}  // namespace exa::gpu
