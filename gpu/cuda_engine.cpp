#include "gpu/cuda_engine.hpp"

#include "common/assert.hpp"
#include "gpu/cuda_forward.hpp"
#include "gpu/cuda_memory_pool.hpp"
#include "gpu/cuda_weight_plan.hpp"

namespace exa::gpu {
namespace {

// kv_cache (under the CPU engine's scheduler) keeps the replica's block
// bookkeeping over the device pool's block ids; the prefix cache's
// copy-on-write goes through the forward's copy_block, on the stream. The
// device pool is shared with the device's other replicas and outlives the
// engine, which owns only this view of it.
class device_page_ids final : public engine::block_pool {
 public:
  explicit device_page_ids(engine::block_pool& device_pool) : pool_(device_pool) {}

  std::size_t block_bytes() const noexcept override { return pool_.block_bytes(); }
  std::uint32_t capacity_blocks() const noexcept override { return pool_.capacity_blocks(); }
  std::uint32_t free_blocks() const noexcept override { return pool_.free_blocks(); }
  std::optional<engine::block_id> allocate() noexcept override { return pool_.allocate(); }
  void release(engine::block_id block) override { pool_.release(block); }
  void* address(engine::block_id block) noexcept override { return pool_.address(block); }
  bool host_accessible() const noexcept override { return false; }

 private:
  engine::block_pool& pool_;
};

class cuda_engine final : public engine::inference_engine {
 public:
  cuda_engine(std::unique_ptr<cuda_memory_pool> own_pool, std::unique_ptr<device_page_ids> ids,
              const cuda_forward* forward, std::unique_ptr<engine::cpu_engine> inner)
      : own_pool_(std::move(own_pool)), ids_(std::move(ids)), forward_(forward), inner_(std::move(inner)) {}

  expected<void> submit(engine::generation_request request) override { return inner_->submit(std::move(request)); }
  void cancel(engine::seq_id id) override { inner_->cancel(id); }
  bool idle() const override { return inner_->idle(); }
  engine::step_result step() override { return inner_->step(); }
  // A long step (a prompt chunk, or decode reads that outlast its launches)
  // may stop at a stage boundary for a lighter arrival
  // (cuda_forward::execute_yielding), as on the CPU.
  void offer_arrival(engine::arrival_hint hint) override { inner_->offer_arrival(std::move(hint)); }
  engine::engine_stats stats() const override { return inner_->stats(); }
  engine::prefix_summary cached_prefixes(std::size_t max_hashes) const override {
    return inner_->cached_prefixes(max_hashes);
  }
  std::optional<std::string> fault() const override { return inner_->fault(); }

  cuda_engine_counters counters() const {
    const cuda_forward_stats s = forward_->stats();
    return {s.steps, s.graph_captures, s.graph_replays, s.weight_bytes, s.stopped_steps, s.stages_launched,
            s.stage_launch_s};
  }

 private:
  // Destroyed bottom up: the engine returns its blocks before the pool goes.
  std::unique_ptr<cuda_memory_pool> own_pool_;  // null when the device's pool is used
  std::unique_ptr<device_page_ids> ids_;
  const cuda_forward* forward_;  // owned by inner_
  std::unique_ptr<engine::cpu_engine> inner_;
};

expected<void> check_request(const model::llama_model* model, const cuda_engine_options& options) {
  if (model == nullptr) return make_error(errc::invalid_argument, "no model to run");
  if (options.engine.draft)
    return make_error(errc::unsupported, "speculative decoding is not supported by the CUDA engine yet");
  if (options.engine.kv_block_tokens == 0)
    return make_error(errc::invalid_argument, "KV blocks must hold at least one token");
  if (options.kv_pool == nullptr && options.own_kv_blocks == 0)
    return make_error(errc::invalid_argument, "give the CUDA engine a KV pool or a number of blocks to reserve");
  // The model first: an unsupported weight is named on any machine.
  if (auto plan = plan_weights(model->config(), model->weights()); !plan) return std::unexpected(plan.error());
  return {};
}

}  // namespace

std::optional<cuda_engine_counters> cuda_counters(const engine::inference_engine& e) {
  if (const auto* c = dynamic_cast<const cuda_engine*>(&e)) return c->counters();
  return std::nullopt;
}

expected<std::unique_ptr<engine::inference_engine>> make_cuda_engine(std::shared_ptr<const model::llama_model> model,
                                                                     int device, cuda_engine_options options) {
  if (auto ok = check_request(model.get(), options); !ok) return std::unexpected(ok.error());
  auto count = cuda_device_count();
  if (!count) return std::unexpected(count.error());
  if (device < 0 || device >= *count)
    return make_error(errc::invalid_argument, "CUDA device " + std::to_string(device) + " does not exist (" +
                                                  std::to_string(*count) + " present)");
  const auto& c = model->config();
  const std::uint32_t bt = options.engine.kv_block_tokens;
  std::unique_ptr<cuda_memory_pool> own_pool;
  engine::block_pool* pool = options.kv_pool;
  if (pool == nullptr) {
    auto created = cuda_memory_pool::create(device, engine::kv_layout{c.n_layers, c.kv_dim(), bt}.block_bytes(),
                                            options.own_kv_blocks);
    if (!created) return std::unexpected(created.error());
    own_pool = std::move(*created);
    pool = own_pool.get();
  }
  cuda_forward_config fc;
  fc.device = device;
  fc.stream = options.stream;
  fc.kv_pool = pool;
  fc.block_tokens = bt;
  fc.max_tokens = options.engine.scheduler.max_batch_tokens;
  fc.max_sequences = options.engine.scheduler.max_running;
  fc.max_graphs = options.max_graphs;
  auto forward = cuda_forward::create(model, fc);
  if (!forward) return std::unexpected(forward.error());
  cuda_forward* fwd = forward->get();
  auto ids = std::make_unique<device_page_ids>(*pool);
  engine::cpu_engine_config ec = options.engine;
  // The forward outlives every call: the cache is the engine's, the forward too.
  ec.kv_block_copy = [fwd](engine::block_id dst, engine::block_id src) { fwd->copy_block(dst, src); };
  auto inner = std::make_unique<engine::cpu_engine>(std::move(model), *ids, c.kv_dim(), std::move(*forward), ec);
  return std::unique_ptr<engine::inference_engine>(
      new cuda_engine(std::move(own_pool), std::move(ids), fwd, std::move(inner)));
}

}  // namespace exa::gpu
