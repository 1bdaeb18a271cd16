#pragma once
// The NCCL communicator: one per member of a replica's tensor-parallel group
// on CUDA devices. UNPROVEN ON HARDWARE: it compiles against nccl.h, but no
// machine this was written on had a GPU; tests/gpu/nccl_test.cpp is the check
// to run on one (it reports SKIPPED without a GPU or NCCL).
//
// How a group forms: rank 0 calls nccl_make_unique_id(); the 128 bytes travel
// to the other members in our own messages; every member calls create() with
// them, on its own thread or process, within the timeout.
//
// Buffers are device pointers on the member's device. Collectives are
// enqueued on the member's CUDA stream (the replica's) and return at once;
// wait() returns when everything enqueued so far has completed, bounded by the
// timeout: past it, or on an asynchronous NCCL error, the communicator is
// aborted (ncclCommAbort) and every later call returns `unavailable`. barrier()
// is a one-float all-reduce followed by wait(). NCCL gives a collective no
// deadline of its own: a member whose peer died only learns of it through
// wait() (or a peer's abort message reaching the replica actor, which calls
// abort()).
//
// NCCL is loaded with dlopen("libnccl.so.2") the first time it is needed, so
// programs start on machines without it and get a clear `unavailable` error
// instead of a loader failure. Builds without CUDA or without nccl.h compile
// a stub whose functions all return `unavailable`.

#include <array>
#include <chrono>
#include <cstddef>
#include <memory>

#include "common/error.hpp"
#include "engine/communicator.hpp"

namespace exa::gpu {

/// The opaque name of one NCCL group (ncclUniqueId's 128 bytes).
using nccl_unique_id = std::array<std::byte, 128>;

/// Ok when this build has NCCL support and libnccl.so.2 loads and is new
/// enough; otherwise `unavailable` naming why not.
expected<void> nccl_available();

/// A fresh group id; called once per group, by its rank 0.
expected<nccl_unique_id> nccl_make_unique_id();

class nccl_communicator : public engine::communicator {
 public:
  /// Joins group `id` as `rank` of `size` (1..) on CUDA device `device`,
  /// enqueueing on `stream` (a cudaStream_t; nullptr is the legacy default
  /// stream). Returns once every member has joined; past `timeout` (> 0) the
  /// half-made communicator is aborted and the result is `unavailable`.
  static expected<std::unique_ptr<nccl_communicator>> create(const nccl_unique_id& id, int rank, int size,
                                                             int device, void* stream,
                                                             std::chrono::milliseconds timeout);

  /// Blocks until every collective enqueued so far has completed on the
  /// stream, bounded by the timeout (see above).
  virtual expected<void> wait() = 0;

  virtual int device() const noexcept = 0;
  virtual void* stream() const noexcept = 0;
};

}  // namespace exa::gpu
