#pragma once
// A communicator for a group that spans nodes, composed from two smaller ones
// as the design's "NVLink first, InfiniBand second" asks: the node-local group
// (fast links) carries most of the bytes, the cross-node group carries only
// 1/ranks_per_node of them from each member.
//
// The group has nodes x ranks_per_node members, global rank
// node * ranks_per_node + local (node-major). Each member holds
//   intra: its node's group       (rank = local index, size = ranks per node)
//   inter: the members with its local index on every node
//          (rank = node index, size = nodes).
//
// all_reduce_sum (every member takes part in every step, so every link is used):
//   1. intra reduce-scatter: local rank l gets the node's sum of chunk l
//      (the vector is padded with zeros to a multiple of ranks_per_node);
//   2. inter all-reduce of chunk l among the members with local index l;
//   3. intra all-gather: every member gets all chunks.
// Each element is summed within each node in local-rank order, then across
// nodes in node order: fixed, so bitwise the same on every member and from
// run to run with deterministic sub-communicators. It differs from the flat
// rank-order sum only by reassociation: both orders are within
// (size - 1) * 2^-24 * sum_m |x_m| of the exact sum (first order), so they
// differ by at most twice that per element (tests check this bound).
//
// reduce_scatter_sum, all_gather, broadcast and barrier are composed the same
// way (see the .cpp) and are exact where the flat ones are.
//
// Failure: a failed step aborts both sub-communicators with the step's reason,
// so the failure spreads to every node-mate and every peer with the same local
// index, and from them to the whole group, without waiting for a timeout.
// abort() aborts both. Not thread-safe beyond the interface's promise (one
// thread per member; abort/aborted from any thread).

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "engine/communicator.hpp"

namespace exa::gpu {

class hierarchical_communicator final : public engine::communicator {
 public:
  /// Both non-null; `inter` has one member per node, all with the same local
  /// index as this member has in `intra`.
  hierarchical_communicator(std::unique_ptr<engine::communicator> intra,
                            std::unique_ptr<engine::communicator> inter);

  int rank() const noexcept override { return inter_->rank() * intra_->size() + intra_->rank(); }
  int size() const noexcept override { return inter_->size() * intra_->size(); }

  expected<void> all_reduce_sum(float* data, std::size_t count) override;
  expected<void> reduce_scatter_sum(const float* send, float* recv, std::size_t count) override;
  expected<void> all_gather(const float* send, float* recv, std::size_t count) override;
  expected<void> broadcast(float* data, std::size_t count, int root) override;
  expected<void> barrier() override;

  void abort(const std::string& reason) override;
  bool aborted() const noexcept override { return intra_->aborted() || inter_->aborted(); }

  engine::communicator& intra() noexcept { return *intra_; }
  engine::communicator& inter() noexcept { return *inter_; }

 private:
  std::unexpected<error> fail(const char* collective, const char* step, const error& e);
  std::unexpected<error> fail_if_aborted(const char* collective);

  std::unique_ptr<engine::communicator> intra_;
  std::unique_ptr<engine::communicator> inter_;
  // Padded or rearranged copies; they only grow, so steady state allocates nothing.
  std::vector<float> scratch_;
};

/// A simulated multi-node group on the CPU: `nodes` x `per_node` members
/// (each 1..cpu_group_size_max), global ranks node-major, each a
/// hierarchical_communicator over in-process CPU groups (one per node, one per
/// local index). `timeout` bounds every wait of every sub-group.
expected<std::vector<std::unique_ptr<engine::communicator>>> make_cpu_hierarchical_group(
    int nodes, int per_node, std::chrono::milliseconds timeout);

}  // namespace exa::gpu
