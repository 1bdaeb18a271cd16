#pragma once
// The CUDA inference engine: the CPU engine's scheduler, KV accounting and
// sampler on the host (engine/cpu_engine.hpp) driving the Llama forward pass
// on one CUDA device (gpu/cuda_forward.hpp, kernels in gpu/ops). The weights
// are uploaded once; K and V live in pages of the device's cuda_memory_pool;
// each step runs on one stream and returns when its logits are on the host.
//
// Declared in every build. Without CUDA support make_cuda_engine returns
// `unavailable` ("built without CUDA"); with it but no usable device,
// `unavailable` with the CUDA runtime's reason.
//
// The prefix cache works as on the CPU (a shared page is copied on the
// device when a sequence must write into it); batch invariance keeps cached
// pages exact. Not yet on the GPU: speculative decoding (refused as
// unsupported).

#include <cstdint>
#include <memory>

#include "common/error.hpp"
#include "engine/block_pool.hpp"
#include "engine/cpu_engine.hpp"
#include "engine/engine.hpp"
#include "model/llama_model.hpp"

namespace exa::gpu {

struct cuda_engine_options {
  /// Scheduling bounds, KV block size (kv_block_tokens), the replica's share
  /// of the pool (kv_max_blocks) and the prefix cache, as for the CPU engine;
  /// a draft model is refused; kv_block_copy is the engine's own.
  engine::cpu_engine_config engine;
  /// The device's KV pool (a cuda_memory_pool on `device`), shared with its
  /// other replicas; it must outlive the engine. Null: the engine reserves a
  /// pool of its own of `own_kv_blocks` blocks.
  engine::block_pool* kv_pool = nullptr;
  std::uint32_t own_kv_blocks = 0;
  /// The cudaStream_t to run on (the device's); null: a stream of its own.
  void* stream = nullptr;
  /// CUDA graphs kept for repeated step shapes; 0 runs every step eagerly.
  std::size_t max_graphs = 16;
};

/// What the CUDA engine reports beyond engine_stats (tests, benchmarks).
struct cuda_engine_counters {
  std::uint64_t steps = 0;
  std::uint64_t graph_captures = 0;
  std::uint64_t graph_replays = 0;
  std::uint64_t weight_bytes = 0;
  /// Steps stopped at a stage boundary for a lighter arrival (engine_stats'
  /// yielded_steps counts the same stops from the scheduler's side).
  std::uint64_t stopped_steps = 0;
  /// Stages launched one by one in steps that may stop, and the host's
  /// seconds launching them (cuda_forward_stats).
  std::uint64_t stages_launched = 0;
  double stage_launch_s = 0;
};

/// The CUDA engine's counters, or nullopt when `e` is not a CUDA engine.
std::optional<cuda_engine_counters> cuda_counters(const engine::inference_engine& e);

/// A CUDA engine for `model` on CUDA device `device`. Errors: unavailable
/// (built without CUDA; no usable device, with the runtime's reason; a CUDA
/// call failed), unsupported (a weight type or shape the kernels do not take,
/// named; a draft model), invalid_argument (no model, a device index out of
/// range, a pool on another device or with blocks too small), out_of_memory
/// (the weights or buffers do not fit on the device).
expected<std::unique_ptr<engine::inference_engine>> make_cuda_engine(std::shared_ptr<const model::llama_model> model,
                                                                     int device, cuda_engine_options options);

}  // namespace exa::gpu
