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

// Checks what every kind of member needs: a pool with big enough blocks, a
// communicator at its place.
expected<void> check_common(std::size_t r, std::size_t g, const block_pool* pool, const communicator* comm,
                            std::size_t block_bytes) {
  if (pool == nullptr || comm == nullptr)
    return make_error(errc::invalid_argument, member_name(r) + " lacks a KV pool or communicator");
  if (comm->rank() != static_cast<int>(r) || comm->size() != static_cast<int>(g))
    return make_error(errc::invalid_argument, member_name(r) + "'s communicator is rank " + std::to_string(comm->rank()) +
                                                  " of " + std::to_string(comm->size()) + ", not rank " +
                                                  std::to_string(r) + " of " + std::to_string(g));
  if (pool->block_bytes() < block_bytes)
    return make_error(errc::invalid_argument, member_name(r) + "'s KV pool blocks (" +
                                                  std::to_string(pool->block_bytes()) +
                                                  " bytes) are smaller than a member's KV block (" +
                                                  std::to_string(block_bytes) + " bytes)");
  return {};
}

// A device member's forward, given batches whose tables name the member's own
// pool blocks instead of the group's (tp_block_pool::member_block).
class member_blocks_forward final : public forward_executor {
 public:
  member_blocks_forward(std::unique_ptr<forward_executor> inner, const tp_block_pool& blocks, std::size_t rank)
      : inner_(std::move(inner)), blocks_(blocks), rank_(rank) {}

  expected<void> execute(const forward_batch& batch, std::vector<float>& logits) override {
    tables_.resize(batch.tables.size());
    mine_.tokens = batch.tokens;
    mine_.tables.resize(batch.tables.size());
    for (std::size_t s = 0; s < batch.tables.size(); ++s) {
      const std::vector<block_id>& group = *batch.tables[s];
      tables_[s].resize(group.size());
      for (std::size_t i = 0; i < group.size(); ++i) tables_[s][i] = blocks_.member_block(rank_, group[i]);
      mine_.tables[s] = &tables_[s];
    }
    return inner_->execute(mine_, logits);
  }

 private:
  std::unique_ptr<forward_executor> inner_;
  const tp_block_pool& blocks_;
  std::size_t rank_;
  std::vector<std::vector<block_id>> tables_;  // reused across steps
  forward_batch mine_;
};

}  // namespace

expected<std::unique_ptr<tp_engine>> tp_engine::create(std::shared_ptr<const model::llama_model> model,
                                                       std::vector<tp_device_member> members,
                                                       cpu_engine_config config) {
  if (config.draft)
    return make_error(errc::unsupported, "speculative decoding is not supported on a tensor-parallel replica");
  if (members.empty()) return make_error(errc::invalid_argument, "a tensor-parallel engine needs at least one member");
  const auto g = static_cast<std::uint32_t>(members.size());
  const auto& c = model->config();
  if (auto ok = check_tp_split(c, model->weights(), g); !ok) return std::unexpected(ok.error());
  const kv_layout layout{c.n_layers, c.kv_dim() / g, config.kv_block_tokens};
  for (std::size_t r = 0; r < members.size(); ++r) {
    if (auto ok = check_common(r, g, members[r].kv_pool, members[r].comm.get(), layout.block_bytes()); !ok) return std::unexpected(ok.error());
    if (!members[r].make_forward)
      return make_error(errc::invalid_argument, member_name(r) + " has no way to build its forward");
  }
  std::unique_ptr<tp_engine> e(new tp_engine());
  std::vector<block_pool*> pools;
  for (const tp_device_member& m : members) pools.push_back(m.kv_pool);
  e->blocks_ = std::make_unique<tp_block_pool>(std::move(pools));
  std::vector<std::unique_ptr<forward_executor>> forwards;
  std::vector<std::shared_ptr<communicator>> comms;
  for (std::uint32_t r = 0; r < g; ++r) {
    auto f = members[r].make_forward(layout);
    if (!f) return std::unexpected(f.error());
    forwards.push_back(std::make_unique<member_blocks_forward>(std::move(*f), *e->blocks_, r));
    comms.push_back(members[r].comm);
  }
  config.prefix_cache = false;
  e->inner_ = std::make_unique<cpu_engine>(model, *e->blocks_, layout.kv_dim,
                                           std::make_unique<tp_group>(std::move(forwards), std::move(comms)), config);
  return e;
}

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
                                           std::make_unique<tp_group>(c, std::move(group), config.weights), config);
  return e;
}

}  // namespace exa::engine
