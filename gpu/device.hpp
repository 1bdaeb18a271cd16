#pragma once
// A device: one accelerator, or a share of the host's CPUs, as the actors
// see it. Every kind implements the same interface -- the memory pool
// engines take KV pages from, an executor that runs engine work off CAF's
// scheduler and reports its end through a callback, the engine factory, a
// health check and telemetry -- so the device actor holds a `device` and
// knows nothing else about its kind.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.hpp"
#include "engine/block_pool.hpp"
#include "engine/engine.hpp"
#include "gpu/executor.hpp"

namespace exa::model {
class llama_model;
}

namespace exa::gpu {

enum class device_kind : std::uint8_t { cpu, cuda };

/// "cpu" or "cuda".
std::string_view to_string(device_kind kind) noexcept;

/// What an engine on a device is given besides its model.
struct engine_options {
  /// KV capacity granted by the ledger, in tokens (0: the whole pool).
  std::uint32_t kv_tokens = 0;
  /// Speculative decoding: the draft model (checked against the target
  /// here, since the node's files are what runs), null for none, and the
  /// tokens it proposes per step (0: the engine's default).
  std::shared_ptr<const model::llama_model> draft;
  std::uint32_t draft_tokens = 0;
};

/// What a device says about itself (gauges, status, logs).
struct telemetry {
  /// What the ledger may hand out on this device: the configured budget,
  /// on CUDA cut to what the card had free when the device opened.
  std::uint64_t memory_budget_bytes = 0;
  /// The KV pool's region, reserved at start; and its pages in use.
  std::uint64_t memory_reserved_bytes = 0;
  std::uint64_t memory_used_bytes = 0;
  /// The device's error state ("" when well): CUDA's sticky error.
  std::string error;
  /// Through NVML where the driver provides it; empty, never zero, without.
  std::optional<double> temperature_c;
  std::optional<double> utilization_percent;
};

class device : public std::enable_shared_from_this<device> {
 public:
  virtual ~device() = default;

  virtual device_kind kind() const noexcept = 0;
  /// Index among the devices of its kind on this host.
  virtual std::uint32_t index() const noexcept = 0;
  /// A readable name for logs ("cpu", "NVIDIA H200").
  virtual std::string name() const = 0;

  /// KV pages: one region reserved when the device opened, fixed-size pages.
  virtual engine::block_pool& pool() noexcept = 0;
  /// Runs engine work (steps, engine creation) in submission order.
  virtual executor& exec() noexcept = 0;

  /// An engine for `model` on this device. The engine holds the device (its
  /// pool, threads, stream) until it is destroyed. Errors: invalid_argument
  /// (a page too small for one token, a draft that does not fit the model),
  /// unsupported (no engine of this kind is built), out_of_memory.
  /// Call it through exec(), never concurrently with a step.
  virtual expected<std::shared_ptr<engine::inference_engine>> make_engine(
      std::shared_ptr<const model::llama_model> model, const engine_options& options) = 0;

  /// Ok, or why the device cannot be used (CUDA: its sticky error).
  virtual expected<void> check_health() = 0;
  virtual telemetry read_telemetry() const = 0;
};

/// How to open a device.
struct device_options {
  /// The memory budget per device (the ledger's capacity). On CPU it is also
  /// the KV pool's region (reserved lazily, MAP_NORESERVE); on CUDA it is cut
  /// to what the card has free and the pool takes kv_pool_percent of it, the
  /// rest staying free for weights and activations.
  std::uint64_t memory_bytes = 256ull << 20;
  std::uint32_t kv_pool_percent = 50;  // CUDA only: the KV pool's share of the budget
  std::size_t page_bytes = 32 * 1024;  // one KV page
  std::uint32_t threads = 1;           // CPU: engine worker threads (the executor's own thread included)
  /// Run tasks inside submit() (deterministic tests under CAF's test scheduler).
  bool inline_executor = false;
  std::size_t queue_max = 1024;  // tasks queued at most on the executor
};

/// Opens (or hands out again) the device a device actor runs; called when
/// the actor starts, and again when its supervisor restarts it.
using device_opener = std::function<expected<std::shared_ptr<device>>()>;

}  // namespace exa::gpu
