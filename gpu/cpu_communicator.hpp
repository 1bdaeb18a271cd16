#pragma once
// The in-process CPU communicator: the members of a tensor-parallel group are
// threads of one process, each calling its own member object; collectives
// meet at a shared barrier and read each other's buffers directly.
//
// Determinism: a sum over members is always formed in rank order,
// (((m0 + m1) + m2) + ...), element by element, whatever order the threads
// arrive in and however the work is split, so every member gets bitwise the
// same result, equal to a serial rank-order loop, from run to run.
//
// Work split: all_reduce_sum cuts the vector into one slice per member (fewer
// for short vectors); each member sums its slice over all members and writes
// it into every member's buffer, so the reduction scales with the group.
// reduce_scatter_sum: each member sums its own chunk. all_gather and
// broadcast: each member copies into its own buffer.
//
// Buffers: a member's buffers must stay valid until its call returns; a call
// returns only after every member is done with every buffer of that call (a
// collective is two barriers: "all arrived", then "all done"). In-place forms
// are allowed as in NCCL: reduce_scatter_sum with recv == send + rank*count,
// all_gather with send == recv + rank*count. Other overlaps between send and
// recv are not.
//
// Failure: every wait is bounded by the group's timeout; past it the group
// aborts itself with a reason naming the collective and the members that had
// not arrived. abort() from any thread wakes every waiter. Members that
// disagree on the collective, its count or its root abort the group with a
// reason naming them (nothing is read out of bounds); a member that passes an
// invalid argument (null buffer, root out of range) gets invalid_argument and
// the others unavailable. After an abort every call returns `unavailable`
// with the reason, at once. A member already past "all arrived" finishes its
// share of the copy before its call returns, so no thread ever writes into a
// buffer whose call has returned.
//
// Threads: each member object is used by one thread at a time (its member's);
// abort() and aborted() are safe from any thread.

#include <chrono>
#include <memory>
#include <vector>

#include "common/error.hpp"
#include "engine/communicator.hpp"

namespace exa::gpu {

/// Largest group make_cpu_group builds (arrivals are one bit each in a word).
inline constexpr int cpu_group_size_max = 64;

/// A group of `size` members (1..cpu_group_size_max), member r at index r.
/// `timeout` (> 0) bounds every wait inside a collective. Errors:
/// invalid_argument for a size or timeout out of range.
expected<std::vector<std::unique_ptr<engine::communicator>>> make_cpu_group(
    int size, std::chrono::milliseconds timeout);

}  // namespace exa::gpu
