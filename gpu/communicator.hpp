#pragma once
// The collective interface of a tensor-parallel group, and every way to make
// one. The interface lives in runtime/engine (the forward pass calls it, and
// runtime/ must not depend on gpu/); device code names it gpu::communicator.
//
//   make_cpu_group               in-process: threads and shared buffers,
//                                deterministic rank-order sums (CPU devices,
//                                tests)                 gpu/cpu_communicator.hpp
//   hierarchical_communicator    "NVLink first, InfiniBand second": composes
//                                an intra-node and an inter-node communicator
//   make_cpu_hierarchical_group  the same over simulated nodes on the CPU
//                                                  gpu/hierarchical_allreduce.hpp
//   nccl_communicator::create    NCCL on the replica's CUDA stream
//                                                  gpu/nccl_communicator.hpp

#include "engine/communicator.hpp"
#include "gpu/cpu_communicator.hpp"
#include "gpu/hierarchical_allreduce.hpp"
#include "gpu/nccl_communicator.hpp"

namespace exa::gpu {

using communicator = engine::communicator;

}  // namespace exa::gpu
