#include "cluster/load_gate.hpp"

#include <algorithm>
#include <string>

namespace exa::cluster {

expected<bool> load_gate::enqueue(replica_id replica, node_id node) {
  if (loading_.count(replica) || waiting(replica)) return false;
  if (queue_.size() >= limits_.waiting_max)
    return make_error(errc::overloaded, std::to_string(queue_.size()) + " replica starts are waiting already (the limit)");
  queue_.push_back({replica, node});
  return true;
}

std::vector<replica_id> load_gate::admit() {
  std::vector<replica_id> out;
  for (auto it = queue_.begin(); it != queue_.end() && loading_.size() < cluster_max();) {
    auto& on_node = per_node_[it->node];
    if (on_node >= per_node_max()) {  // its node is busy: the ones behind it on other nodes may go
      ++it;
      continue;
    }
    ++on_node;
    loading_.emplace(it->replica, it->node);
    out.push_back(it->replica);
    it = queue_.erase(it);
  }
  return out;
}

bool load_gate::finished(replica_id replica) {
  if (const auto it = loading_.find(replica); it != loading_.end()) {
    auto& on_node = per_node_[it->second];
    if (on_node > 0) --on_node;
    if (on_node == 0) per_node_.erase(it->second);
    loading_.erase(it);
    return true;
  }
  const auto q = std::find_if(queue_.begin(), queue_.end(), [&](const entry& e) { return e.replica == replica; });
  if (q == queue_.end()) return false;
  queue_.erase(q);
  return true;
}

bool load_gate::waiting(replica_id replica) const {
  return std::any_of(queue_.begin(), queue_.end(), [&](const entry& e) { return e.replica == replica; });
}

std::size_t load_gate::loading_on(node_id node) const {
  const auto it = per_node_.find(node);
  return it == per_node_.end() ? 0 : it->second;
}

std::size_t load_gate::waiting_on(node_id node) const {
  return static_cast<std::size_t>(std::count_if(queue_.begin(), queue_.end(), [&](const entry& e) { return e.node == node; }));
}

}  // namespace exa::cluster
