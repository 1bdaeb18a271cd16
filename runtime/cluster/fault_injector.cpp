#include "cluster/fault_injector.hpp"

#include <algorithm>

namespace exa::cluster {

double fault_injector::uniform() { return rng_.uniform(); }

void fault_injector::arm(node_id node, channel_fault kind, std::int64_t until_ns, double probability,
                         std::int64_t delay_ns) {
  std::lock_guard lock(mutex_);
  faults_[node].push_back({kind, until_ns, probability, delay_ns});
}

void fault_injector::clear(node_id node) {
  std::lock_guard lock(mutex_);
  faults_.erase(node);
}

message_verdict fault_injector::decide(node_id node, message_class cls, std::int64_t now_ns) {
  std::lock_guard lock(mutex_);
  message_verdict v;
  auto it = faults_.find(node);
  if (it == faults_.end()) return v;
  auto& list = it->second;
  list.erase(std::remove_if(list.begin(), list.end(), [&](const armed& a) { return a.until_ns <= now_ns; }),
             list.end());
  for (const auto& a : list) {
    switch (a.kind) {
      case channel_fault::partition: v.deliver = false; break;
      case channel_fault::jitter:
        if (cls == message_class::heartbeat) v.delay_ns = std::max(v.delay_ns, a.delay_ns);
        break;
      case channel_fault::drop:
        if (uniform() < a.probability) v.deliver = false;
        break;
      case channel_fault::delay: v.delay_ns = std::max(v.delay_ns, a.delay_ns); break;
      case channel_fault::duplicate:
        if (uniform() < a.probability) v.copies = 2;
        break;
    }
  }
  return v;
}

bool fault_injector::partitioned(node_id node, std::int64_t now_ns) {
  std::lock_guard lock(mutex_);
  auto it = faults_.find(node);
  if (it == faults_.end()) return false;
  return std::any_of(it->second.begin(), it->second.end(),
                     [&](const armed& a) { return a.kind == channel_fault::partition && a.until_ns > now_ns; });
}

}  // namespace exa::cluster
