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

#include "actors/messages.hpp"
#include "engine/block_pool.hpp"
#include "engine/thread_pool.hpp"

namespace exa::actors {

struct device_config {
  cluster::node_id node = 0;
  std::uint32_t index = 0;
  std::uint64_t memory_bytes = 256ull << 20;  // the KV region reserved at start
  std::size_t page_bytes = 32 * 1024;         // one KV block
  std::uint32_t threads = 1;                  // engine worker threads
  /// Report measured wall time per step (production) or a modeled cost
  /// (deterministic tests: the same inputs must give the same routing).
  bool measure_wall_time = true;
};

/// device -> replica: what an engine needs from its device. Shared, so an
/// engine never outlives the pool its KV blocks come from.
struct device_resources {
  std::shared_ptr<engine::block_pool> pool;
  std::shared_ptr<engine::thread_pool> threads;
  std::size_t page_bytes = 0;
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
  std::vector<std::function<void()>> held;
  static inline const char* name = "device";
};

caf::behavior device_actor(caf::stateful_actor<device_state>* self, device_config config);

}  // namespace exa::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::device_resources)
