#include "gpu/cuda_graph_policy.hpp"

#include <algorithm>

namespace exa::gpu {

bool graph_policy::contains(graph_key key) const noexcept {
  return std::find(kept_.begin(), kept_.end(), key) != kept_.end();
}

graph_decision graph_policy::next(graph_key key) {
  const std::optional<graph_key> previous = last_;
  last_ = key;
  graph_decision d;
  if (capacity_ == 0 || key.n_tokens == 0) return d;
  if (const auto it = std::find(kept_.begin(), kept_.end(), key); it != kept_.end()) {
    kept_.splice(kept_.begin(), kept_, it);
    d.what = graph_decision::action::replay;
    return d;
  }
  if (previous != key) return d;  // not stable yet
  if (kept_.size() == capacity_) {
    d.evict = kept_.back();
    kept_.pop_back();
  }
  kept_.push_front(key);
  d.what = graph_decision::action::capture;
  return d;
}

void graph_policy::forget(graph_key key) {
  kept_.remove(key);
}

}  // namespace exa::gpu
