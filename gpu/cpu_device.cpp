#include "gpu/cpu_device.hpp"

#include "engine/cpu_engine.hpp"
#include "engine/speculative.hpp"
#include "gpu/device_engine.hpp"
#include "model/llama_model.hpp"

namespace exa::gpu {
namespace {

// Every task under the device's compute lock.
class locked_executor final : public executor {
 public:
  locked_executor(executor& inner, std::mutex& compute) : inner_(inner), compute_(compute) {}
  void submit(task work, completion done) override {
    inner_.submit(
        [&m = compute_, w = std::move(work)] {
          std::lock_guard lock(m);
          w();
        },
        std::move(done));
  }
  std::size_t pending() const noexcept override { return inner_.pending(); }

 private:
  executor& inner_;
  std::mutex& compute_;
};

}  // namespace

expected<std::shared_ptr<cpu_device>> cpu_device::open(std::uint32_t index, const device_options& options) {
  if (options.page_bytes == 0 || options.memory_bytes < options.page_bytes)
    return make_error(errc::invalid_argument, "CPU device " + std::to_string(index) + ": a memory budget of " +
                                                  std::to_string(options.memory_bytes) + " bytes holds no page of " +
                                                  std::to_string(options.page_bytes) + " bytes");
  if (options.threads == 0) return make_error(errc::invalid_argument, "a CPU device needs at least one thread");
  const auto pages = options.memory_bytes / options.page_bytes;
  if (pages > UINT32_MAX) return make_error(errc::invalid_argument, "CPU device: more than 2^32 pages; raise the page size");
  auto pool = cpu_memory_pool::create(options.page_bytes, static_cast<std::uint32_t>(pages));
  if (!pool) return std::unexpected(pool.error());
  return std::shared_ptr<cpu_device>(new cpu_device(index, options, std::move(*pool)));
}

cpu_device::cpu_device(std::uint32_t index, const device_options& options, std::unique_ptr<cpu_memory_pool> pool)
    : index_(index), options_(options), pool_(std::move(pool)),
      threads_(std::make_unique<engine::thread_pool>(options.threads)) {
  if (options.inline_executor) worker_ = std::make_unique<inline_executor>();
  else worker_ = std::make_unique<thread_executor>("exa-cpu" + std::to_string(index), options.queue_max);
  exec_ = std::make_unique<locked_executor>(*worker_, compute_);
}

cpu_device::~cpu_device() {
  exec_.reset();
  worker_.reset();  // stops the worker before the pool and threads go
}

expected<std::shared_ptr<engine::inference_engine>> cpu_device::make_engine(
    std::shared_ptr<const model::llama_model> model, const engine_options& options) {
  if (!model) return make_error(errc::invalid_argument, "no model to run");
  auto ec = paged_kv_config(engine::cpu_engine::kv_block_bytes(model->config(), 1), options_.page_bytes,
                            options.kv_tokens);
  if (!ec) return std::unexpected(ec.error());
  if (options.draft) {
    auto k = checked_draft_tokens(*model, options);
    if (!k) return std::unexpected(k.error());
    ec->draft = options.draft;
    ec->draft_tokens = *k;
  }
  return bind_to_device<engine::cpu_engine>(shared_from_this(), std::move(model), *pool_, *threads_, *ec);
}

telemetry cpu_device::read_telemetry() const {
  telemetry t;
  t.memory_budget_bytes = options_.memory_bytes;
  const auto block = static_cast<std::uint64_t>(pool_->block_bytes());
  t.memory_reserved_bytes = block * pool_->capacity_blocks();
  t.memory_used_bytes = block * (pool_->capacity_blocks() - pool_->free_blocks());
  return t;
}

}  // namespace exa::gpu
