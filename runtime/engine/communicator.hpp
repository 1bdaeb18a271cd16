#pragma once
// Collectives among the members of one tensor-parallel group: the interface
// the forward pass calls (one all-reduce after each row-parallel matmul) and
// the hierarchical all-reduce composes. Implementations live in gpu/: an
// in-process CPU one (threads and shared buffers, fixed reduction order,
// deterministic) and NCCL (one communicator per replica group, operations on
// the replica's stream).
//
// Every member of a group calls the same collectives in the same order with
// the same counts (as with NCCL/MPI). A collective either completes on every
// member or fails on every member: after abort() -- called by any member or
// by a watchdog on a device fault, a lost process or a timeout -- every
// pending and every later collective of the group returns `unavailable`
// naming the reason. No collective waits forever: each is bounded by the
// group's timeout, past which the group aborts itself.
//
// Buffers are the implementation's memory: host memory for the CPU group,
// device memory on the member's GPU for NCCL. With the CPU group a call
// returns when the result is in place; with NCCL it returns once enqueued on
// the member's stream (gpu::nccl_communicator::wait() for completion).
// In-place forms are those of NCCL: reduce_scatter_sum with
// recv == send + rank() * count, all_gather with send == recv + rank() * count;
// other overlaps of send and recv are not allowed.

#include <cstddef>
#include <string>

#include "common/error.hpp"

namespace exa::engine {

class communicator {
 public:
  virtual ~communicator() = default;

  /// This member's index in the group, 0..size()-1.
  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;

  /// In place: `data` (count floats on every member) becomes the element-wise
  /// sum over members. The CPU implementation adds in rank order
  /// (((m0 + m1) + m2) + ...), so the result is bitwise the same from run to
  /// run and on every member.
  virtual expected<void> all_reduce_sum(float* data, std::size_t count) = 0;
  /// `send` holds size() * count floats; member r receives into `recv`
  /// (count floats) the sum over members of chunk r.
  virtual expected<void> reduce_scatter_sum(const float* send, float* recv, std::size_t count) = 0;
  /// Every member contributes `count` floats; `recv` (size() * count floats)
  /// gets them in rank order on every member.
  virtual expected<void> all_gather(const float* send, float* recv, std::size_t count) = 0;
  /// `data` (count floats) of member `root` is copied to every member.
  virtual expected<void> broadcast(float* data, std::size_t count, int root) = 0;
  virtual expected<void> barrier() = 0;

  /// Fails every pending and later collective of the whole group with
  /// `unavailable` and `reason`. Safe from any thread, idempotent (the first
  /// reason is kept).
  virtual void abort(const std::string& reason) = 0;
  virtual bool aborted() const noexcept = 0;
};

}  // namespace exa::engine
