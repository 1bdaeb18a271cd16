#include "gpu/tensor_parallel.hpp"

#include <spdlog/spdlog.h>

#include <mutex>

#include "engine/tp_engine.hpp"
#include "gpu/cpu_communicator.hpp"
#include "gpu/cpu_device.hpp"
#include "gpu/cuda_tp_engine.hpp"
#include "gpu/device_engine.hpp"
#include "model/llama_model.hpp"

namespace exa::gpu {
namespace {

// tp_engine bound to its devices: each step (and every other engine call
// that runs members' threads) holds the compute locks of members 1..G-1;
// member 0's own executor holds its lock already.
class tp_device_engine final : public engine::inference_engine {
 public:
  tp_device_engine(std::vector<std::shared_ptr<cpu_device>> members, std::unique_ptr<engine::tp_engine> inner)
      : members_(std::move(members)), inner_(std::move(inner)) {}

  expected<void> submit(engine::generation_request request) override { return inner_->submit(std::move(request)); }
  void cancel(engine::seq_id id) override { inner_->cancel(id); }
  bool idle() const override { return inner_->idle(); }
  engine::step_result step() override {
    std::vector<std::unique_lock<std::mutex>> locks;
    for (std::size_t r = 1; r < members_.size(); ++r) locks.emplace_back(members_[r]->compute_mutex());
    return inner_->step();
  }
  engine::engine_stats stats() const override { return inner_->stats(); }
  std::optional<std::string> fault() const override { return inner_->fault(); }

 private:
  std::vector<std::shared_ptr<cpu_device>> members_;  // first: they outlive the engine
  std::unique_ptr<engine::tp_engine> inner_;
};

// A group of CUDA devices: NCCL communicators and CUDA member forwards
// (cuda_tp_engine.hpp) over each member device's KV pool. UNPROVEN ON HARDWARE.
expected<group_engine> make_cuda_group(const std::vector<std::shared_ptr<device>>& members,
                                       std::shared_ptr<const model::llama_model> model, const engine_options& options,
                                       std::chrono::milliseconds collective_timeout) {
  cuda_tp_options o;
  std::size_t page_bytes = members.front()->pool().block_bytes();
  for (const auto& m : members) {
    if (m->kind() != device_kind::cuda)
      return make_error(errc::unsupported, "a tensor-parallel group mixes CUDA and " +
                                               std::string(to_string(m->kind())) + " devices");
    if (!o.devices.empty() && o.devices.back() >= static_cast<int>(m->index()))
      return make_error(errc::invalid_argument, "a tensor-parallel group lists its devices once each, ascending");
    o.devices.push_back(static_cast<int>(m->index()));
    o.kv_pools.push_back(&m->pool());
    page_bytes = std::min(page_bytes, m->pool().block_bytes());
  }
  const auto tp = static_cast<std::uint32_t>(members.size());
  auto ec = paged_kv_config(engine::tp_engine::kv_block_bytes(model->config(), 1, tp), page_bytes, options.kv_tokens);
  if (!ec) return std::unexpected(ec.error());
  o.engine = *ec;
  o.collective_timeout = collective_timeout;
  auto made = make_cuda_tp_engine(std::move(model), std::move(o));
  if (!made) return std::unexpected(made.error());
  group_engine out;
  out.engine = std::shared_ptr<engine::inference_engine>(std::move(made->engine));
  out.abort = std::move(made->abort);
  return out;
}

}  // namespace

expected<group_engine> make_group_engine(std::vector<std::shared_ptr<device>> members,
                                         std::shared_ptr<const model::llama_model> model,
                                         const engine_options& options, std::chrono::milliseconds collective_timeout) {
  if (!model) return make_error(errc::invalid_argument, "no model to run");
  if (members.size() < 2) return make_error(errc::invalid_argument, "a tensor-parallel group needs two devices or more");
  if (options.draft) return make_error(errc::unsupported, "speculative decoding under tensor parallelism is not supported");
  if (members.front()->kind() == device_kind::cuda)
    return make_cuda_group(members, std::move(model), options, collective_timeout);
  std::vector<std::shared_ptr<cpu_device>> cpus;
  for (const auto& m : members) {
    auto cpu = std::dynamic_pointer_cast<cpu_device>(m);
    if (!cpu)
      return make_error(errc::unsupported, "a tensor-parallel group mixes CPU and " +
                                               std::string(to_string(m->kind())) + " devices");
    for (const auto& c : cpus)
      if (c->index() >= cpu->index())
        return make_error(errc::invalid_argument, "a tensor-parallel group lists its devices once each, ascending");
    cpus.push_back(std::move(cpu));
  }
  const auto tp = static_cast<std::uint32_t>(members.size());
  std::size_t page_bytes = cpus.front()->pool().block_bytes();
  for (const auto& c : cpus) page_bytes = std::min(page_bytes, c->pool().block_bytes());
  auto ec = paged_kv_config(engine::tp_engine::kv_block_bytes(model->config(), 1, tp), page_bytes, options.kv_tokens);
  if (!ec) return std::unexpected(ec.error());
  auto group = make_cpu_group(static_cast<int>(tp), collective_timeout);
  if (!group) return std::unexpected(group.error());
  std::vector<std::shared_ptr<engine::communicator>> comms;
  std::vector<engine::tp_member> tm;
  for (std::uint32_t r = 0; r < tp; ++r) {
    comms.push_back(std::move((*group)[r]));
    tm.push_back({&cpus[r]->pool(), &cpus[r]->threads(), comms.back()});
  }
  std::unique_ptr<engine::tp_engine> inner;
  {
    // Sharding reads the model, and each member's forward copies its shard
    // on that member's thread pool (engine/weight_store.hpp): pools that
    // steps share, so hold the others as a step would.
    std::vector<std::unique_lock<std::mutex>> locks;
    for (std::size_t r = 1; r < cpus.size(); ++r) locks.emplace_back(cpus[r]->compute_mutex());
    auto made = engine::tp_engine::create(std::move(model), std::move(tm), *ec);
    if (!made) return std::unexpected(made.error());
    inner = std::move(*made);
  }
  std::string devices;
  for (const auto& c : cpus) devices += (devices.empty() ? "" : ",") + std::to_string(c->index());
  spdlog::info("event=tensor_parallel_engine devices={} tp={} kv_block_tokens={} kv_max_blocks={}", devices, tp,
               ec->kv_block_tokens, ec->kv_max_blocks);
  group_engine out;
  out.engine = std::make_shared<tp_device_engine>(std::move(cpus), std::move(inner));
  out.abort = [comms](const std::string& reason) {
    for (const auto& c : comms) c->abort(reason);
  };
  return out;
}

}  // namespace exa::gpu
