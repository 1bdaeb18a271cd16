#include "engine/tp_engine.hpp"

#include <string>

#include "engine/tp_group.hpp"

namespace exa::engine {
namespace {

std::string member_name(std::size_t r) { return "tensor-parallel member " + std::to_string(r); }

expected<void> check_members(const std::vector<tp_member>& members, std::size_t block_bytes) {
  if (members.empty()) return make_error(errc::invalid_argument, "a tensor-parallel engine needs at least one member");
  const auto g = static_cast<int>(members.size());
  for (std::size_t r = 0; r < members.size(); ++r) {
    const tp_member& m = members[r];
    if (m.kv_pool == nullptr || m.threads == nullptr || m.comm == nullptr)
      return make_error(errc::invalid_argument, member_name(r) + " lacks a KV pool, thread pool or communicator");
    if (m.comm->rank() != static_cast<int>(r) || m.comm->size() != g)
      return make_error(errc::invalid_argument, member_name(r) + "'s communicator is rank " +
                                                    std::to_string(m.comm->rank()) + " of " +
                                                    std::to_string(m.comm->size()) + ", not rank " +
                                                    std::to_string(r) + " of " + std::to_string(g));
    if (!m.kv_pool->host_accessible())
      return make_error(errc::unsupported, member_name(r) + "'s KV pool is not host memory: tensor parallelism "
                                                            "runs on CPU devices only");
    if (m.kv_pool->block_bytes() < block_bytes)
      return make_error(errc::invalid_argument, member_name(r) + "'s KV pool blocks (" +
                                                    std::to_string(m.kv_pool->block_bytes()) +
                                                    " bytes) are smaller than a member's KV block (" +
                                                    std::to_string(block_bytes) + " bytes)");
    for (std::size_t o = 0; o < r; ++o)
      if (members[o].threads == m.threads)
        return make_error(errc::invalid_argument, member_name(o) + " and " + std::to_string(r) +
                                                      " share a thread pool; each member needs its own");
  }
  return {};
}

}  // namespace

std::size_t tp_engine::kv_block_bytes(const model::llama_config& c, std::uint32_t block_tokens, std::uint32_t tp) {
  return kv_layout{c.n_layers, c.kv_dim() / tp, block_tokens}.block_bytes();
}

tp_engine::~tp_engine() = default;

expected<std::unique_ptr<tp_engine>> tp_engine::create(std::shared_ptr<const model::llama_model> model,
                                                       std::vector<tp_member> members, cpu_engine_config config) {
  if (config.draft)
    return make_error(errc::unsupported, "speculative decoding is not supported on a tensor-parallel replica");
  const auto g = static_cast<std::uint32_t>(members.size());
  const auto& c = model->config();
  if (auto ok = check_tp_split(c, model->weights(), g); !ok) return std::unexpected(ok.error());
  const kv_layout layout{c.n_layers, c.kv_dim() / g, config.kv_block_tokens};
  if (auto ok = check_members(members, layout.block_bytes()); !ok) return std::unexpected(ok.error());

  std::unique_ptr<tp_engine> e(new tp_engine());
  std::vector<block_pool*> pools;
  for (const tp_member& m : members) pools.push_back(m.kv_pool);
  e->blocks_ = std::make_unique<tp_block_pool>(std::move(pools));
  std::vector<tp_group::member> group;
  for (std::uint32_t r = 0; r < g; ++r) {
    auto w = tp_weights::shard(c, model->weights(), r, g);
    if (!w) return std::unexpected(w.error());
    group.push_back({std::move(*w), e->blocks_->member_pages(r, layout), members[r].threads, members[r].comm});
  }
  config.prefix_cache = false;
  e->inner_ = std::make_unique<cpu_engine>(model, *e->blocks_, layout.kv_dim,
                                           std::make_unique<tp_group>(c, std::move(group)), config);
  return e;
}

}  // namespace exa::engine
