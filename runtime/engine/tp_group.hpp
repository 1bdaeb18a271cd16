#pragma once
// Runs a forward batch on every member of a tensor-parallel group at once:
// member 0 on the calling thread, each other member on a driver thread of its
// own that lives as long as the group (a thread per member per step would cost
// more than a small model's decode step). Each member's matmuls run on its
// own device's thread_pool, which its driving thread joins; the collectives
// block only the driving threads, so no pool ever waits on another.
//
// A collective that fails on one member fails on all (communicator.hpp); the
// group also aborts the communicator of any member that failed, so a member
// stuck in a collective is released at once, not at the group's timeout.
// execute() returns when every member has returned: never a hang past the
// communicator's bound, and no member still running when it reports.
//
// Members are CPU llama_forwards over their shards (the first constructor), or
// forwards of any device kind built by the caller (the second: tp_engine's
// device members, e.g. CUDA forwards joined by NCCL).

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "engine/communicator.hpp"
#include "engine/kv_pages.hpp"
#include "engine/llama_forward.hpp"
#include "engine/tp_weights.hpp"

namespace exa::engine {

class thread_pool;

class tp_group final : public forward_executor {
 public:
  struct member {
    tp_weights weights;                  // the member's shard
    kv_pages pages;                      // its KV blocks (tp_block_pool::member_pages)
    thread_pool* threads = nullptr;      // its device's workers
    std::shared_ptr<communicator> comm;  // rank == its index in the group
  };

  /// Starts members.size() - 1 driver threads. Each member's communicator
  /// must have rank == its index and size == members.size(); each member its
  /// own thread_pool.
  /// `resident`: where each member's forward reads its weights
  /// (weight_store.hpp).
  tp_group(const model::llama_config& config, std::vector<member> members, resident_options resident = {});
  /// Members that are already forwards: `forwards[r]` is member r's, over its
  /// shard and KV blocks, all-reducing through `comms[r]` (rank r of
  /// forwards.size()); only member 0 returns logits.
  tp_group(std::vector<std::unique_ptr<forward_executor>> forwards, std::vector<std::shared_ptr<communicator>> comms);
  ~tp_group() override;
  tp_group(const tp_group&) = delete;
  tp_group& operator=(const tp_group&) = delete;

  /// Rank 0's logits. Errors: unavailable (with the first failing member's
  /// reason) when a collective failed; the group is aborted then.
  expected<void> execute(const forward_batch& batch, std::vector<float>& logits) override;

  std::size_t size() const noexcept { return forwards_.size(); }
  /// The members' weight copies together (huge_pages: every member's).
  resident_memory weights_memory() const noexcept override;

 private:
  void drive(std::size_t r);  // a driver thread's loop, for member r
  void run_member(std::size_t r, std::vector<float>& logits);

  void start_drivers();

  std::vector<member> members_;  // CPU members' shards and pages (empty for device members)
  std::vector<std::unique_ptr<forward_executor>> forwards_;
  std::vector<std::shared_ptr<communicator>> comms_;  // [rank]
  std::vector<std::optional<error>> errors_;  // per member, of the current step
  std::vector<std::vector<float>> scratch_;   // logits of members > 0 (none: only rank 0 computes them)

  std::mutex mutex_;
  std::condition_variable start_;
  std::condition_variable done_;
  std::uint64_t generation_ = 0;  // one per execute(); guarded by mutex_
  std::size_t running_ = 0;       // drivers still in the current step; guarded by mutex_
  bool stopping_ = false;         // guarded by mutex_
  const forward_batch* batch_ = nullptr;
  std::vector<std::thread> drivers_;  // last: they start once everything above exists
};

}  // namespace exa::engine
