#pragma once
// A deterministic embedded cluster for actor tests: CAF's test scheduler in
// virtual time, devices inline, a generated tiny model. Helpers run the
// system until it is quiet and advance virtual time.

#include <caf/actor_system.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "actors/embedded_cluster.hpp"
#include "api/gateway.hpp"

namespace exa::test {

/// A sink that records everything (single-threaded under the test scheduler).
struct recording_sink : api::stream_sink {
  std::vector<api::token_chunk> chunks;
  std::optional<api::generate_result> result;
  void on_chunk(const api::token_chunk& c) override { chunks.push_back(c); }
  void on_done(const api::generate_result& r) override { result = r; }
  std::vector<std::int32_t> tokens() const;
  std::string text() const;
};

/// Generates (once) the tiny model used by actor tests.
const std::string& tiny_model_path();

/// Replicas of `deployment` (every deployment's when empty) that are ready
/// or serving in `s`.
std::size_t replicas_up(const api::cluster_status& s, std::string_view deployment = {});

class cluster_fixture {
 public:
  explicit cluster_fixture(actors::cluster_options options);
  ~cluster_fixture();

  /// Runs jobs until none is left (no timers fire).
  void run();
  /// Advances virtual time in steps of `step`, running after each.
  void advance(std::chrono::milliseconds total, std::chrono::milliseconds step = std::chrono::milliseconds(10));

  api::gateway_backend& backend() { return *backend_; }
  actors::embedded_cluster& cluster() { return *cluster_; }
  caf::actor_system& system() { return cluster_->system(); }

  /// Status via the backend (runs the system to get the answer).
  api::cluster_status status();
  bool ready();
  /// Runs at most `jobs` jobs (to stop part-way through a generation).
  void run_some(std::size_t jobs);
  /// The current actor of node `id` (asked from the controller).
  caf::actor node(std::uint32_t id);
  /// Kills a replica actor abruptly through its node (fault injection).
  void kill_replica(std::uint32_t node, std::uint64_t replica);

  /// Starts a generation and returns its sink (run() to make progress).
  std::shared_ptr<recording_sink> generate(api::generate_request req);
  /// A short greedy request ("Hello", 4 tokens) to `model`, run to its end.
  std::shared_ptr<recording_sink> generate_short(std::string model);

  /// Default options: 2 nodes × 2 devices, one "tiny" deployment of 2 replicas.
  static actors::cluster_options defaults(std::uint32_t replicas = 2);

 private:
  std::unique_ptr<actors::embedded_cluster> cluster_;
  caf::scheduler::test_coordinator* sched_ = nullptr;
  std::shared_ptr<api::gateway_backend> backend_;
};

}  // namespace exa::test
