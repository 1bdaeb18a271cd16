#pragma once
// The Llama forward pass on one CUDA device: the CPU engine's llama_forward
// step for step (engine/llama_forward.hpp), with the kernels of gpu/ops. The
// weights are uploaded once (gpu/cuda_weight_plan.hpp); K and V live in the
// pages of the device's cuda_memory_pool, laid out as the CPU engine lays out
// its pages; every kernel runs on one stream; the logits of the tokens that
// need them are copied back for the host's sampler. A prefix-cached page is
// copied on the device (copy_block) when a sequence must write into it. A step's launches are
// recorded as a CUDA graph once its shape repeats (cuda_graph_policy.hpp) and
// replayed from then on.
//
// Batch invariance holds as on the CPU: every kernel computes a token's
// values from that token's inputs alone, with reduction orders fixed by the
// model's shapes, never by the batch (gpu/ops/matmul.cuh says how the matmul
// does it). A sequence's logits are bitwise the same alone or in any batch,
// eager or replayed from a graph, on one kind of device.
//
// Built only with CUDA (EXASERVE_HAVE_CUDA).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/error.hpp"
#include "engine/block_pool.hpp"
#include "engine/llama_forward.hpp"
#include "model/llama_model.hpp"

namespace exa::gpu {

struct cuda_forward_config {
  int device = 0;
  /// The cudaStream_t to run on (the device's); null: a stream of its own.
  void* stream = nullptr;
  /// The KV pages: a cuda_memory_pool on `device`, blocks of at least
  /// engine::kv_layout{n_layers, kv_dim, block_tokens}.block_bytes().
  engine::block_pool* kv_pool = nullptr;
  std::uint32_t block_tokens = 16;
  /// Bounds of one step: tokens, sequences (each sequence's last token may
  /// want logits; nothing else does: there is no speculative decoding here).
  std::uint32_t max_tokens = 512;
  std::uint32_t max_sequences = 64;
  /// Graphs kept (cuda_graph_policy.hpp); 0 runs every step eagerly.
  std::size_t max_graphs = 16;
  /// Tensor parallelism: member comm->rank() of comm->size(), which must be a
  /// gpu::nccl_communicator on `device` (it must outlive the forward). The
  /// forward uploads only its shard (engine::tp_weights), its KV pages hold
  /// n_kv_heads / size heads, it runs on the communicator's stream (`stream`
  /// is ignored) and eagerly (no graphs), all-reduces x after the O and down
  /// projections (rank 0 adds the residual and the O bias into its partial
  /// product, the others contribute theirs alone), and only rank 0 returns
  /// logits. UNPROVEN ON HARDWARE: compiled, never run on a GPU yet.
  engine::communicator* comm = nullptr;
};

struct cuda_forward_stats {
  std::uint64_t steps = 0;
  std::uint64_t graph_captures = 0;
  std::uint64_t graph_replays = 0;
  std::uint64_t weight_bytes = 0;  // device memory holding the weights
  std::uint64_t stopped_steps = 0;  // steps stopped part way (execute_yielding)
  /// Stages launched one by one (steps that may stop), and the host's time
  /// spent launching them: the launch cost behind which decode steps may
  /// stop (engine::fair::cuda_stage_launch_s is its estimate).
  std::uint64_t stages_launched = 0;
  double stage_launch_s = 0;
};

class cuda_forward final : public engine::forward_executor {
 public:
  /// Plans and uploads the weights and reserves the step's buffers. Errors:
  /// unsupported (a weight the CUDA kernels do not take: plan_weights names
  /// it), invalid_argument (no pool, blocks too small, a bound of 0),
  /// unavailable (a CUDA call failed, with the runtime's reason),
  /// out_of_memory (cudaMalloc failed).
  static expected<std::unique_ptr<cuda_forward>> create(std::shared_ptr<const model::llama_model> model,
                                                        const cuda_forward_config& config);
  ~cuda_forward() override;
  cuda_forward(const cuda_forward&) = delete;
  cuda_forward& operator=(const cuda_forward&) = delete;

  /// Runs the batch and returns when the logits are on the host. Errors:
  /// unavailable naming the CUDA error (the device is then unusable),
  /// invalid_argument for a batch over the configured bounds; for a
  /// tensor-parallel member, unavailable when a collective failed or did not
  /// complete within the group's timeout (the group is aborted then).
  expected<void> execute(const engine::forward_batch& batch, std::vector<float>& logits) override;
  /// On one device (a tensor-parallel member's layers are collectives its
  /// group runs together, as on the CPU).
  bool can_yield() const noexcept override;
  /// A long step (a prompt chunk in it, or decode reads that outlast its
  /// launches: stoppable_step in cuda_stage_pipeline.hpp) runs stage by
  /// stage, eagerly, and may stop before any stage after the first one it
  /// runs: the hidden state then comes back to `state` (tokens × dim floats)
  /// and goes up again when the step goes on. Any other step runs whole, as
  /// execute() runs it (graphs included).
  /// Bitwise what one uninterrupted pass computes: the same kernels, in the
  /// same order, on the same inputs (tests/gpu/cuda_engine_check.cpp checks
  /// it; it passed on an H200, 4 December 2026).
  expected<bool> execute_yielding(const engine::forward_batch& batch, std::vector<float>& logits,
                                  engine::forward_suspension& state,
                                  const std::function<bool()>& should_yield) override;

  /// Copies KV page `src` over page `dst` on the stream, ahead of the next
  /// step (the prefix cache's copy-on-write: kv_cache's block_copier). A
  /// failure is reported by the next execute().
  void copy_block(engine::block_id dst, engine::block_id src);

  cuda_forward_stats stats() const noexcept;

  struct impl;

 private:
  explicit cuda_forward(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace exa::gpu
