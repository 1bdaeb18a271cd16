#pragma once
// A replica tensor-parallel over G CPU devices (llama_forward.hpp describes
// the split): one scheduler, one KV accounting and one sampler, as on one
// device; every step runs each member's share of the forward pass on its own
// device -- its weight shard, its thread_pool, its KV blocks (its KV heads
// only) -- joined by two all-reduces per layer through the group's
// communicators. Rank 0 computes the logits and the engine samples them.
//
// Under tensor parallelism the prefix cache is off (copy-on-write of a shared
// block would have to copy it on every member: tp_block_pool.hpp) and
// speculative decoding is refused (unsupported). A failed collective -- a
// member's device faulted, its communicator was aborted, a collective timed
// out -- fails the engine for good: fault() says why, submit() refuses,
// step() runs nothing (cpu_engine.hpp).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/communicator.hpp"
#include "engine/cpu_engine.hpp"
#include "engine/tp_block_pool.hpp"
#include "engine/tp_weights.hpp"

namespace exa::engine {

class thread_pool;

/// What a replica needs of each device of its placement.
struct tp_member {
  /// The device's KV pool (host-accessible), blocks of at least
  /// tp_engine::kv_block_bytes(); shared with the device's other replicas.
  block_pool* kv_pool = nullptr;
  /// The device's worker threads: this member's matmuls run on them, driven
  /// by a thread of the engine's own. Two members may not share one.
  thread_pool* threads = nullptr;
  /// This member's communicator of the group (rank == its index in the
  /// member list, size == the member count), used only from the engine's
  /// threads. Others may hold it too (a watchdog that aborts the group).
  std::shared_ptr<communicator> comm;
};

/// A member on a device whose forward the caller builds (a CUDA GPU:
/// gpu/cuda_tp_engine.hpp): the engine gives the member's forward batches
/// whose block tables name `kv_pool`'s own blocks.
struct tp_device_member {
  /// The device's KV pool, blocks of at least tp_engine::kv_block_bytes();
  /// shared with the device's other replicas; any memory (a GPU's too).
  block_pool* kv_pool = nullptr;
  /// This member's communicator of the group, as for tp_member.
  std::shared_ptr<communicator> comm;
  /// Builds this member's forward over its shard (rank = its index in the
  /// member list, of the member count) with KV blocks of `layout` (n_kv_heads
  /// / G heads) in `kv_pool`; it all-reduces through `comm` and returns
  /// logits on rank 0 only. Called once per member, in rank order, by create().
  std::function<expected<std::unique_ptr<forward_executor>>(kv_layout layout)> make_forward;
};

class tp_engine final : public inference_engine {
 public:
  /// Shards `model` over `members` (member i has rank i). config.prefix_cache
  /// is ignored (off); config.kv_max_blocks caps the group blocks (0: the
  /// smallest member pool). Errors: invalid_argument for a model that does not
  /// split evenly over the member count (check_tp_split names the dimension),
  /// no members, a null pool, thread pool or communicator, a communicator
  /// whose rank or size differs from its place, two members sharing a thread
  /// pool, or pool blocks smaller than kv_block_bytes(); unsupported for a
  /// draft model or a pool that is not host-accessible.
  static expected<std::unique_ptr<tp_engine>> create(std::shared_ptr<const model::llama_model> model,
                                                     std::vector<tp_member> members, cpu_engine_config config = {});
  /// The same over members whose forwards the caller builds. Errors: those
  /// above (no host-memory or thread-pool requirement), invalid_argument for
  /// a member without make_forward, and whatever a make_forward returns.
  static expected<std::unique_ptr<tp_engine>> create(std::shared_ptr<const model::llama_model> model,
                                                     std::vector<tp_device_member> members,
                                                     cpu_engine_config config = {});
  ~tp_engine() override;

  /// Bytes of one member's KV block: n_kv_heads / tp heads of every layer.
  static std::size_t kv_block_bytes(const model::llama_config& c, std::uint32_t block_tokens, std::uint32_t tp);

  expected<void> submit(generation_request request) override { return inner_->submit(std::move(request)); }
  void cancel(seq_id id) override { inner_->cancel(id); }
  bool idle() const override { return inner_->idle(); }
  step_result step() override { return inner_->step(); }
  engine_stats stats() const override { return inner_->stats(); }
  std::optional<std::string> fault() const override { return inner_->fault(); }

  std::size_t members() const noexcept { return blocks_->members(); }
  const model::llama_model& model() const noexcept { return inner_->model(); }

 private:
  tp_engine() = default;

  std::unique_ptr<tp_block_pool> blocks_;  // outlives inner_, whose cache holds its blocks
  std::unique_ptr<cpu_engine> inner_;      // owns the tp_group that runs each batch
};

}  // namespace exa::engine
