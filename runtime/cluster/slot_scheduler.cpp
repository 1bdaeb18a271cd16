#include "cluster/slot_scheduler.hpp"

#include <algorithm>

namespace exa::cluster {

epoch_t slot_scheduler::epoch(const slot_ref& slot) const {
  const auto it = epochs_.find(slot);
  return it == epochs_.end() ? 0 : it->second;
}

bool slot_scheduler::raise_epoch(const slot_ref& slot, epoch_t e) {
  auto& current = epochs_[slot];
  if (e <= current) return false;
  current = e;
  return true;
}

slot_scheduler::replacement slot_scheduler::replace(const slot_ref& slot, std::vector<node_id> excluded,
                                                    std::chrono::nanoseconds now) {
  auto& budget = budgets_.try_emplace(slot, config_.slot_max_replacements, config_.slot_replacement_window).first->second;
  if (!budget.allow(now)) return {};
  const epoch_t next = epoch(slot) + 1;
  epochs_[slot] = next;
  queue_.push_back({slot, next, std::move(excluded)});
  return {true, next};
}

epoch_t slot_scheduler::move(const slot_ref& slot, std::vector<node_id> excluded) {
  const epoch_t next = epoch(slot) + 1;
  epochs_[slot] = next;
  queue_.push_back({slot, next, std::move(excluded)});
  return next;
}

bool slot_scheduler::queued(const slot_ref& slot) const {
  return std::any_of(queue_.begin(), queue_.end(), [&](const migration& m) { return m.slot == slot; });
}

bool slot_scheduler::retry(const slot_ref& slot) {
  if (queued(slot)) return false;
  budgets_.erase(slot);
  return true;
}

void slot_scheduler::node_rejoined(node_id node) {
  for (auto& m : queue_) std::erase(m.excluded, node);
}

slot_scheduler::pump_result slot_scheduler::pump(
    cluster_state& placement, const std::function<const deployment_spec*(const std::string&)>& spec_of,
    const std::set<node_id>& down) {
  pump_result out;
  const std::size_t parallel = std::max<std::uint32_t>(1, config_.migration_parallelism);
  while (warming_.size() < parallel && !queue_.empty()) {
    migration m = std::move(queue_.front());
    queue_.pop_front();
    const deployment_spec* spec = spec_of(m.slot.deployment);
    if (!spec || m.slot.index >= spec->replicas) continue;  // undeployed or scaled away meanwhile
    if (epoch(m.slot) != m.epoch) continue;                  // superseded by a newer replacement
    std::vector<node_id> excluded = m.excluded;
    excluded.insert(excluded.end(), cordoned_.begin(), cordoned_.end());
    // Nor onto a node that is down right now (a rack lost at once: its other
    // nodes are not cordoned until the monitor confirms them).
    excluded.insert(excluded.end(), down.begin(), down.end());
    auto placed = place_one(placement, *spec, m.slot.index, excluded);
    if (!placed) {
      out.waiting.emplace(m.slot, placed.error().message);
      queue_.push_front(std::move(m));
      break;
    }
    warming_.insert(placed->replica);
    out.started.push_back({std::move(*placed), m.epoch});
  }
  return out;
}

}  // namespace exa::cluster
