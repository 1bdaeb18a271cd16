#pragma once
// One replica tensor-parallel over several devices of a node (its placement's
// TP group): engine::tp_engine over each member device's KV pool and worker
// threads, joined by an in-process communicator group. A group of CUDA
// devices runs CUDA member forwards joined by NCCL instead
// (gpu/cuda_tp_engine.hpp; UNPROVEN ON HARDWARE), each on a stream of its own
// next to the device's other replicas; a group mixing kinds is refused.
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
/// for one token's share), unsupported (devices of mixed kinds, a draft
/// model); for CUDA devices also those of make_cuda_tp_engine (unavailable
/// without NCCL, naming why).
expected<group_engine> make_group_engine(std::vector<std::shared_ptr<device>> members,
                                         std::shared_ptr<const model::llama_model> model,
                                         const engine_options& options, std::chrono::milliseconds collective_timeout);

}  // namespace exa::gpu
