#pragma once
// When the CUDA engine records a step's kernels as a CUDA graph and when it
// replays one. A step's launches depend only on its shape -- tokens in the
// batch and tokens that need logits -- because everything else a kernel reads
// (token ids, positions, block tables, which rows get logits) is uploaded into
// fixed device buffers before the step. So a graph recorded for one shape
// replays for every later step of that shape, and decode steps, whose shape is
// the number of running sequences, mostly replay.
//
// A shape is recorded the second step in a row it occurs ("once shapes are
// stable"): prefill chunks of one-off sizes never cost a capture. At most
// `capacity` graphs are kept; the least recently used one goes first. Pure
// logic; the engine holds the graphs.

#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>

namespace exa::gpu {

struct graph_key {
  std::uint32_t n_tokens = 0;
  std::uint32_t n_logits = 0;
  bool operator==(const graph_key&) const = default;
};

struct graph_decision {
  enum class action : std::uint8_t { run_eagerly, capture, replay };
  action what = action::run_eagerly;
  /// With capture: a kept graph to destroy first (capacity reached).
  std::optional<graph_key> evict;
};

class graph_policy {
 public:
  /// capacity 0 disables graphs: every step runs eagerly.
  explicit graph_policy(std::size_t capacity) : capacity_(capacity) {}

  /// What to do for a step of shape `key`; the caller then captures or
  /// replays as told. A capture that fails must be reported with forget().
  graph_decision next(graph_key key);
  /// Drops `key` (its capture failed, or its graph was destroyed).
  void forget(graph_key key);

  std::size_t size() const noexcept { return kept_.size(); }
  bool contains(graph_key key) const noexcept;

 private:
  std::size_t capacity_;
  std::list<graph_key> kept_;  // most recently used first
  std::optional<graph_key> last_;
};

}  // namespace exa::gpu
