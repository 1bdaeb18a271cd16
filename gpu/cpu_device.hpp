#pragma once
// The CPU device: a share of the host. Its pool is one host region (see
// cpu_memory_pool), its engine is the CPU engine, and its executor is one
// worker thread that runs each step with the device's thread pool (the
// worker takes part in every parallel section), or the inline executor in
// deterministic tests. A thread pool runs one parallel section at a time, so
// every task holds the device's compute lock (see compute_mutex()).

#include <memory>
#include <mutex>

#include "engine/thread_pool.hpp"
#include "gpu/cpu_memory_pool.hpp"
#include "gpu/device.hpp"

namespace exa::gpu {

class cpu_device final : public device {
 public:
  /// Reserves the pool (memory_bytes / page_bytes pages) and starts the
  /// worker. Errors: invalid_argument (a budget under one page, zero
  /// threads), out_of_memory (the host refused the region).
  static expected<std::shared_ptr<cpu_device>> open(std::uint32_t index, const device_options& options);
  ~cpu_device() override;

  device_kind kind() const noexcept override { return device_kind::cpu; }
  std::uint32_t index() const noexcept override { return index_; }
  std::string name() const override { return "cpu"; }
  engine::block_pool& pool() noexcept override { return *pool_; }
  executor& exec() noexcept override { return *exec_; }
  expected<std::shared_ptr<engine::inference_engine>> make_engine(std::shared_ptr<const model::llama_model> model,
                                                                  const engine_options& options) override;
  expected<void> check_health() override { return {}; }
  telemetry read_telemetry() const override;

  engine::thread_pool& threads() noexcept { return *threads_; }
  /// Held while anything runs on this device's threads: by every task of
  /// its executor, and by a tensor-parallel group's step for each member
  /// device other than the one it runs on (gpu/tensor_parallel.hpp).
  std::mutex& compute_mutex() noexcept { return compute_; }

 private:
  cpu_device(std::uint32_t index, const device_options& options, std::unique_ptr<cpu_memory_pool> pool);

  std::uint32_t index_;
  device_options options_;
  std::unique_ptr<cpu_memory_pool> pool_;
  std::unique_ptr<engine::thread_pool> threads_;
  std::mutex compute_;
  std::unique_ptr<executor> worker_;  // the thread (or inline) executor
  std::unique_ptr<executor> exec_;    // worker_, each task under compute_; last: stopped first
};

}  // namespace exa::gpu
