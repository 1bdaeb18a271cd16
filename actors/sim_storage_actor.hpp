#pragma once
// The simulator's model store and node disks (cluster::storage_model) as an
// actor: simulated replicas ask it to load their model (sim_load) and are
// answered when the bytes are on their device, in virtual time. One per
// simulated cluster; only the simulator spawns it.

#include <caf/fwd.hpp>
#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/typed_response_promise.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cluster/node_cache.hpp"
#include "cluster/storage_model.hpp"

namespace exa::actors {

/// What the simulator reports about its storage after a run.
struct sim_storage_stats {
  double peak_store_bytes_per_s = 0;
  double store_bytes = 0;          // read from the store
  std::uint32_t fetches = 0;       // node-file copies from the store
  std::uint32_t loads = 0;         // replica loads
  std::uint32_t loads_from_cache = 0;
  /// The store's rate over time: (virtual seconds since start, bytes/s) at
  /// each change, at most `series_max` points (then every other one goes).
  std::vector<std::pair<double, double>> store_rate_series;
  static constexpr std::size_t series_max = 4096;
};

struct sim_storage_state {
  std::optional<cluster::storage_model> model;
  std::map<cluster::storage_model::load_id, caf::typed_response_promise<caf::atom_constant<caf::atom("ok")>>> waiting;
  cluster::storage_model::load_id next_id = 1;
  std::uint64_t timer_generation = 0;
  std::int64_t start_ns = 0;
  std::shared_ptr<sim_storage_stats> stats;
  std::map<std::string, cluster::cached_file> files;  // by name, as loads named them
  caf::actor controller;  // told of each finished fetch (sim_storage_watch)
  static inline const char* name = "sim_storage";
};

/// `warm`: (node, file) pairs whose node cache holds the file at start.
caf::behavior sim_storage_actor(caf::stateful_actor<sim_storage_state>* self, cluster::storage_model model,
                                std::vector<std::pair<cluster::node_id, std::string>> warm,
                                std::shared_ptr<sim_storage_stats> stats);

}  // namespace exa::actors
