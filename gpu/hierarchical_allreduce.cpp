#include "gpu/hierarchical_allreduce.hpp"

#include <algorithm>
#include <cstring>

#include "common/assert.hpp"
#include "gpu/cpu_communicator.hpp"

namespace exa::gpu {

hierarchical_communicator::hierarchical_communicator(std::unique_ptr<engine::communicator> intra,
                                                     std::unique_ptr<engine::communicator> inter)
    : intra_(std::move(intra)), inter_(std::move(inter)) {
  EXA_ASSERT_MSG(intra_ != nullptr && inter_ != nullptr, "hierarchical communicator needs both sub-groups");
}

void hierarchical_communicator::abort(const std::string& reason) {
  intra_->abort(reason);
  inter_->abort(reason);
}

std::unexpected<error> hierarchical_communicator::fail(const char* collective, const char* step,
                                                       const error& e) {
  // The sub-group that failed is already aborted; aborting the other one
  // carries the failure to the members that share only that group with us.
  abort(e.message);
  return std::unexpected(error{e.code, std::string("hierarchical ") + collective + ": " + step + ": " + e.message});
}

std::unexpected<error> hierarchical_communicator::fail_if_aborted(const char* collective) {
  // One sub-group is aborted (by a member we share only that group with):
  // take the other down too before failing, so our other peers learn of it
  // now. The interface has no accessor for the reason, but every call on an
  // aborted communicator fails at once with it, and a barrier is the cheapest.
  const bool intra_dead = intra_->aborted();
  auto probe = (intra_dead ? intra_ : inter_)->barrier();
  const error e = probe ? error{errc::unavailable, "sub-group aborted"} : probe.error();
  return fail(collective, intra_dead ? "intra-node group" : "inter-node group", e);
}

expected<void> hierarchical_communicator::all_reduce_sum(float* data, std::size_t count) {
  constexpr const char* name = "all_reduce_sum";
  if (aborted()) return fail_if_aborted(name);
  const auto local = static_cast<std::size_t>(intra_->size());
  const std::size_t chunk = (count + local - 1) / local;
  float* buf = data;
  if (chunk * local != count) {
    // Zero-padded copy: the padding sums to zero and is dropped at the end.
    if (scratch_.size() < chunk * local) scratch_.resize(chunk * local);
    buf = scratch_.data();
    if (count > 0) std::memcpy(buf, data, count * sizeof(float));
    std::fill(buf + count, buf + chunk * local, 0.0f);
  }
  // In-place forms (as NCCL defines them): this member's chunk lives at its
  // own offset of the full vector throughout.
  float* mine = buf + static_cast<std::size_t>(intra_->rank()) * chunk;
  if (auto r = intra_->reduce_scatter_sum(buf, mine, chunk); !r) return fail(name, "intra-node reduce_scatter_sum", r.error());
  if (auto r = inter_->all_reduce_sum(mine, chunk); !r) return fail(name, "inter-node all_reduce_sum", r.error());
  if (auto r = intra_->all_gather(mine, buf, chunk); !r) return fail(name, "intra-node all_gather", r.error());
  if (buf != data && count > 0) std::memcpy(data, buf, count * sizeof(float));
  return {};
}

expected<void> hierarchical_communicator::reduce_scatter_sum(const float* send, float* recv,
                                                             std::size_t count) {
  constexpr const char* name = "reduce_scatter_sum";
  if (aborted()) return fail_if_aborted(name);
  // Global chunk g = node * local_size + l. Regroup `send` so that local rank
  // l's block holds, node by node, the chunks that end on the members with
  // local index l: [l][node] <- send chunk (node * local_size + l).
  const auto local = static_cast<std::size_t>(intra_->size());
  const auto nodes = static_cast<std::size_t>(inter_->size());
  const std::size_t block = nodes * count;
  if (scratch_.size() < local * block) scratch_.resize(local * block);
  float* arranged = scratch_.data();
  if (count > 0) {
    for (std::size_t l = 0; l < local; ++l)
      for (std::size_t n = 0; n < nodes; ++n)
        std::memcpy(arranged + l * block + n * count, send + (n * local + l) * count, count * sizeof(float));
  }
  // 1. Node sums of this member's block, in place; 2. across nodes, chunk `node`.
  float* mine = arranged + static_cast<std::size_t>(intra_->rank()) * block;
  if (auto r = intra_->reduce_scatter_sum(arranged, mine, block); !r) return fail(name, "intra-node reduce_scatter_sum", r.error());
  if (auto r = inter_->reduce_scatter_sum(mine, recv, count); !r) return fail(name, "inter-node reduce_scatter_sum", r.error());
  return {};
}

expected<void> hierarchical_communicator::all_gather(const float* send, float* recv, std::size_t count) {
  constexpr const char* name = "all_gather";
  if (aborted()) return fail_if_aborted(name);
  // The node's members land at the node's offset of `recv`, then the node
  // blocks are exchanged in place: node-major is global rank order.
  const std::size_t node_block = static_cast<std::size_t>(intra_->size()) * count;
  float* node_part = recv + static_cast<std::size_t>(inter_->rank()) * node_block;
  if (auto r = intra_->all_gather(send, node_part, count); !r) return fail(name, "intra-node all_gather", r.error());
  if (auto r = inter_->all_gather(node_part, recv, node_block); !r) return fail(name, "inter-node all_gather", r.error());
  return {};
}

expected<void> hierarchical_communicator::broadcast(float* data, std::size_t count, int root) {
  constexpr const char* name = "broadcast";
  if (aborted()) return fail_if_aborted(name);
  if (root < 0 || root >= size()) {
    const std::string why = "broadcast root " + std::to_string(root) + " outside 0.." + std::to_string(size() - 1);
    abort("member " + std::to_string(rank()) + " passed an invalid " + why);
    return make_error(errc::invalid_argument, why);
  }
  const int root_node = root / intra_->size();
  const int root_local = root % intra_->size();
  // The root's peers on other nodes (same local index) get it first, then
  // every node spreads it locally. The other inter-node groups sit this out.
  if (intra_->rank() == root_local) {
    if (auto r = inter_->broadcast(data, count, root_node); !r) return fail(name, "inter-node broadcast", r.error());
  }
  if (auto r = intra_->broadcast(data, count, root_local); !r) return fail(name, "intra-node broadcast", r.error());
  return {};
}

expected<void> hierarchical_communicator::barrier() {
  constexpr const char* name = "barrier";
  if (aborted()) return fail_if_aborted(name);
  // Leaving the inter-node barrier means every peer with our local index left
  // its node's barrier, so every member of every node has arrived.
  if (auto r = intra_->barrier(); !r) return fail(name, "intra-node barrier", r.error());
  if (auto r = inter_->barrier(); !r) return fail(name, "inter-node barrier", r.error());
  return {};
}

expected<std::vector<std::unique_ptr<engine::communicator>>> make_cpu_hierarchical_group(
    int nodes, int per_node, std::chrono::milliseconds timeout) {
  if (nodes < 1 || nodes > cpu_group_size_max)
    return make_error(errc::invalid_argument, "node count " + std::to_string(nodes) + " outside 1.." +
                                                  std::to_string(cpu_group_size_max));
  if (per_node < 1 || per_node > cpu_group_size_max)
    return make_error(errc::invalid_argument, "ranks per node " + std::to_string(per_node) + " outside 1.." +
                                                  std::to_string(cpu_group_size_max));
  std::vector<std::vector<std::unique_ptr<engine::communicator>>> intra, inter;
  for (int n = 0; n < nodes; ++n) {
    auto group = make_cpu_group(per_node, timeout);
    if (!group) return std::unexpected(group.error());
    intra.push_back(std::move(*group));
  }
  for (int l = 0; l < per_node; ++l) {
    auto group = make_cpu_group(nodes, timeout);
    if (!group) return std::unexpected(group.error());
    inter.push_back(std::move(*group));
  }
  std::vector<std::unique_ptr<engine::communicator>> members;
  for (int n = 0; n < nodes; ++n)
    for (int l = 0; l < per_node; ++l)
      members.push_back(std::make_unique<hierarchical_communicator>(
          std::move(intra[static_cast<std::size_t>(n)][static_cast<std::size_t>(l)]),
          std::move(inter[static_cast<std::size_t>(l)][static_cast<std::size_t>(n)])));
  return members;
}

}  // namespace exa::gpu
