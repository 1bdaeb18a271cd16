#pragma once
// A device actor owns one device (gpu::device: its memory pool, its
// executor, its engine factory) and runs engine steps for the replicas
// placed on it, one at a time, in arrival order (replicas sharing a device
// take turns). Steps and engine creation run on the device's executor, off
// CAF's scheduler; their completion comes back to this actor as a message
// (with the inline executor of deterministic tests, at once). It knows
// nothing of the device's kind.

#include <caf/fwd.hpp>
#include <caf/response_promise.hpp>

#include <chrono>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "actors/chaos_hooks.hpp"
#include "actors/messages.hpp"
#include "engine/sim_engine.hpp"
#include "gpu/device.hpp"

namespace exa::actors {

struct cluster_metrics;

struct device_config {
  cluster::node_id node = 0;
  std::uint32_t index = 0;
  /// Opens the device when the actor starts (and again when it restarts).
  /// Unset on simulated devices only.
  gpu::device_opener open;
  std::uint64_t memory_bytes = 256ull << 20;  // the memory budget (ledger) and, on CPU, the KV region
  std::size_t page_bytes = 32 * 1024;         // one KV block
  std::uint32_t threads = 1;                  // CPU devices: engine worker threads
  /// Run steps inside the actor's handler (gpu::inline_executor): under the
  /// deterministic test scheduler nothing may run on another thread.
  bool inline_executor = false;
  /// Report measured wall time per step (production) or a modeled cost
  /// (deterministic tests: the same inputs must give the same routing).
  bool measure_wall_time = true;
  /// With measure_wall_time off: answer each step only after its modeled
  /// cost has passed on the actor clock, so virtual time moves while tokens
  /// stream and a fault can land mid-request (chaos plans in virtual time).
  bool model_step_time = false;
  /// Simulated device (exaserve sim): no memory is reserved and engine steps
  /// take their modeled duration in virtual time, several replicas' steps
  /// overlapping and sharing the device's bandwidth.
  std::optional<engine::sim_device> sim;
  /// Simulated device: its engines' prefix cache block size (0: none).
  std::uint32_t sim_prefix_block_tokens = 0;
  /// Simulated device: whether and how its engines stop a decode step or a
  /// prefill chunk at a layer boundary for a lighter arrival (engine::sim_step_stop).
  engine::sim_step_stop sim_step_stop = engine::sim_step_stop::none;
  chaos_hooks hooks;
  /// The node's metrics: this device's memory, reserved and in use (KV
  /// pages), and where the device reports them, temperature and
  /// utilization; null: none.
  std::shared_ptr<cluster_metrics> metrics;
};

/// The device options a device_config asks for (gpu::open_device).
gpu::device_options device_options_of(const device_config& config);

/// device -> replica (simulated devices): what a simulated engine needs.
struct device_resources {
  std::size_t page_bytes = 0;
  std::optional<engine::sim_device> sim;
  std::uint32_t sim_prefix_block_tokens = 0;  // engines' prefix cache (0: none)
  engine::sim_step_stop sim_step_stop = engine::sim_step_stop::none;  // engines stop steps at layer boundaries
};

/// replica -> device: build an engine for this model on the device (on its
/// executor: a CUDA engine uploads its weights there). Replies engine_reply,
/// or the device's error (unsupported, invalid_argument, out_of_memory).
struct engine_request {
  std::shared_ptr<const model::llama_model> model;
  gpu::engine_options options;
  /// A tensor-parallel replica: the other devices of its group (ranks 1..,
  /// this device being rank 0; gpu/tensor_parallel.hpp). Empty: one device.
  std::vector<std::shared_ptr<gpu::device>> peers;
  /// A collective of the group waiting this long aborts the group.
  std::chrono::milliseconds collective_timeout{60000};
};
struct engine_reply {
  std::shared_ptr<engine::inference_engine> engine;
  /// A tensor-parallel engine: aborts its group's collectives (a member
  /// device was lost). Empty for one device.
  std::function<void(const std::string&)> abort;
};

/// Asks a device actor for its device (a tensor-parallel group's first
/// member builds the engine over the others'); replies device_handle.
using device_atom = caf::atom_constant<caf::atom("device")>;
struct device_handle {
  std::shared_ptr<gpu::device> device;
};

/// executor -> device actor: a task it ran has completed (or failed).
struct task_finished {
  std::uint64_t id = 0;
  gpu::task_outcome outcome;
};

/// replica -> device (simulated): a request arrived while my step runs; cut
/// the step at its next boundary so the request can join there.
struct interrupt_step {
  engine::inference_engine* engine = nullptr;
};
/// device -> device (simulated): a step's modeled duration is over.
struct deliver_step {
  engine::inference_engine* engine = nullptr;
  std::uint64_t token = 0;  // which (re)schedule of that step
};

/// Asks a simulated device for its parameters; replies device_resources.
using resources_atom = caf::atom_constant<caf::atom("resources")>;

struct device_state {
  device_config config;
  std::shared_ptr<gpu::device> device;  // null on simulated devices
  std::uint64_t steps = 0;
  /// Tasks out on the executor: what to do with each one's outcome.
  std::uint64_t next_task = 0;
  std::map<std::uint64_t, std::function<void(gpu::task_outcome)>> tasks;
  /// Fault injection: while hung, steps and health checks get no answer
  /// (they wait here and run when the hang ends).
  bool hung = false;
  /// Fault injection: until slow_until_ns, every step takes slow_delay_ns longer.
  std::int64_t slow_until_ns = 0;
  std::int64_t slow_delay_ns = 0;
  std::vector<std::function<void()>> held;
  /// Simulated steps in progress, by engine.
  struct sim_step {
    std::shared_ptr<engine::inference_engine> engine;
    caf::response_promise promise;
    std::shared_ptr<engine::step_result> result;
    std::int64_t start_ns = 0;
    std::uint64_t token = 0;
  };
  std::map<engine::inference_engine*, sim_step> sim_steps;
  /// Modeled-time steps (model_step_time) waiting for their cost to pass.
  struct timed_step {
    caf::response_promise promise;
    std::shared_ptr<engine::step_result> result;
    double seconds = 0;
  };
  std::map<std::uint64_t, timed_step> timed_steps;
  std::int64_t busy_until_ns = 0;  // modeled-time steps run one after another
  std::uint64_t next_token = 0;
  double busy_s = 0;  // modeled busy time (utilization)
  static inline const char* name = "device";
};

caf::behavior device_actor(caf::stateful_actor<device_state>* self, device_config config);

}  // namespace exa::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::device_resources)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::engine_request)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::engine_reply)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::device_handle)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::task_finished)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::interrupt_step)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::deliver_step)
