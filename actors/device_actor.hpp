#pragma once
// A device actor owns one device's resources -- its memory pool (KV pages)
// and its worker threads -- and runs engine steps for the replicas placed on
// it, one at a time, in arrival order (replicas sharing a device take turns).
// In production it is spawned detached, so a step never blocks one of CAF's
// scheduler threads; under the deterministic test scheduler it runs inline.

#include <caf/fwd.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "actors/chaos_hooks.hpp"
#include "actors/messages.hpp"
#include <caf/response_promise.hpp>

#include <map>
#include <optional>

#include "engine/block_pool.hpp"
#include "engine/sim_engine.hpp"
#include "engine/thread_pool.hpp"

namespace exa::actors {

struct cluster_metrics;

struct device_config {
  cluster::node_id node = 0;
  std::uint32_t index = 0;
  std::uint64_t memory_bytes = 256ull << 20;  // the KV region reserved at start
  std::size_t page_bytes = 32 * 1024;         // one KV block
  std::uint32_t threads = 1;                  // engine worker threads
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
  chaos_hooks hooks;
  /// The node's metrics: this device's memory, reserved and in use (KV
  /// pages); null: none.
  std::shared_ptr<cluster_metrics> metrics;
};

/// device -> replica: what an engine needs from its device. Shared, so an
/// engine never outlives the pool its KV blocks come from.
struct device_resources {
  std::shared_ptr<engine::block_pool> pool;
  std::shared_ptr<engine::thread_pool> threads;
  std::size_t page_bytes = 0;
  std::optional<engine::sim_device> sim;  // set on simulated devices
  std::uint32_t sim_prefix_block_tokens = 0;  // simulated devices: engines' prefix cache (0: none)
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

/// Asks a device for its resources; replies device_resources.
using resources_atom = caf::atom_constant<caf::atom("resources")>;

struct device_state {
  device_config config;
  std::shared_ptr<engine::block_pool> pool;
  std::shared_ptr<engine::thread_pool> threads;
  std::uint64_t steps = 0;
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
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::interrupt_step)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::deliver_step)
