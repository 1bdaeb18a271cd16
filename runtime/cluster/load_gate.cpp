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

std::vector<replica_id> load_gate::admit(const std::function<bool(replica_id, node_id)>& from_cache) {
  std::vector<replica_id> out;
  // Without a cache to ask, nothing behind a full cluster can go: stop there.
  for (auto it = queue_.begin(); it != queue_.end() && (from_cache || from_store_ < cluster_max());) {
    const auto node_it = per_node_.find(it->node);
    if (node_it != per_node_.end() && node_it->second >= per_node_max()) {
      ++it;  // its node is busy: the ones behind it on other nodes may go
      continue;
    }
    const bool from_store = !from_cache || !from_cache(it->replica, it->node);
    if (from_store && from_store_ >= cluster_max()) {
      ++it;  // the store is busy: loads from node caches behind it may go
      continue;
    }
    ++per_node_[it->node];
    from_store_ += from_store;
    loading_.emplace(it->replica, loading_entry{it->node, from_store});
    out.push_back(it->replica);
    it = queue_.erase(it);
  }
  return out;
}

bool load_gate::finished(replica_id replica) {
  if (const auto it = loading_.find(replica); it != loading_.end()) {
    auto& on_node = per_node_[it->second.node];
    if (on_node > 0) --on_node;
    if (on_node == 0) per_node_.erase(it->second.node);
    if (it->second.from_store) --from_store_;
    loading_.erase(it);
    return true;
  }
  const auto q = std::find_if(queue_.begin(), queue_.end(), [&](const entry& e) { return e.replica == replica; });
  if (q == queue_.end()) return false;
  queue_.erase(q);
  return true;
}

std::size_t load_gate::fetched(node_id node, const std::function<bool(replica_id)>& from_cache) {
  std::size_t n = 0;
  for (auto& [replica, e] : loading_) {
    if (e.node != node || !e.from_store || !from_cache(replica)) continue;
    e.from_store = false;
    --from_store_;
    ++n;
  }
  return n;
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
