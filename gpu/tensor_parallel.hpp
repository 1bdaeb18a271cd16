#pragma once
// One replica tensor-parallel over several devices of a node (its placement's
// TP group): engine::tp_engine over each member device's KV pool and worker
// threads, joined by an in-process communicator group. CPU devices only for
// now; a group of CUDA devices needs NCCL groups (gpu/nccl_communicator) and
// a sharded CUDA forward, and is refused as unsupported.
//
// Sharing a device: a member device may also run other replicas. Its worker
// threads serve one step at a time, so the group's step runs on the first
// member's executor (which holds that device) and takes the other members'
// compute locks in ascending device order for the step; every TP group takes
// them in that order, so groups that overlap never wait on each other in a
// cycle.
//
// Failure: abort(reason) fails every collective of the group at once (a
// member device was lost); the engine then reports fault() and steps nothing,
// and the replica ends. A collective that waits past `collective_timeout`
// aborts the group by itself: never a hang.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "gpu/device.hpp"

namespace exa::gpu {

struct group_engine {
  /// The replica's engine; it holds every member device.
  std::shared_ptr<engine::inference_engine> engine;
  /// Aborts the group's communicators (safe from any thread, idempotent).
  std::function<void(const std::string& reason)> abort;
};

/// A tensor-parallel engine over `members` (rank r = members[r], ascending
/// device indices on one node). Errors: invalid_argument (fewer than two
/// members, a model that does not split evenly over them, pages too small
/// for one token's share), unsupported (non-CPU devices, a draft model).
expected<group_engine> make_group_engine(std::vector<std::shared_ptr<device>> members,
                                         std::shared_ptr<const model::llama_model> model,
                                         const engine_options& options, std::chrono::milliseconds collective_timeout);

}  // namespace exa::gpu
