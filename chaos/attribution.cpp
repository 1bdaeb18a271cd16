// Which detection and which recovery belong to which fault.

#include "chaos/attribution.hpp"

#include <algorithm>
#include <map>
#include <string>

namespace exa::chaos {
namespace {

bool matches(const event& fault, const event& det) {
  const std::string kind = fault.detail;
  if (kind.rfind("kill_replica", 0) == 0) return det.detail == "monitor" && det.replica == fault.replica;
  if (kind == "kill_node") return det.detail == "monitor" && det.node == fault.node && det.replica == 0;
  if (kind == "kill_rack")  // a silent rack, followed on its first node
    return det.node == fault.node && (det.detail == "heartbeat_suspect" || det.detail == "heartbeat_confirmed");
  if (kind == "hang_device") return det.node == fault.node && (det.detail == "device_check" || det.detail == "monitor");
  if (kind == "fail_device") return det.node == fault.node && (det.detail == "monitor" || det.detail == "device_check");
  if (kind == "slow_model_load") return false;
  if (kind == "slow_device")  // detected by the replicas on it going degraded
    return det.node == fault.node && det.detail == "degraded";
  // Process faults: the controller and the gateways need no detecting.
  if (kind == "kill_gateway" || kind == "kill_controller" || kind == "restart_controller" || kind == "cont_process")
    return false;
  if (kind.find(':') != std::string::npos) return false;  // not injected (":no_target", ":skipped")
  if (kind == "kill_process")  // the connection drops, or heartbeats stop
    return det.node == fault.node &&
           (det.detail == "monitor" || det.detail == "heartbeat_suspect" || det.detail == "heartbeat_confirmed");
  // Channel faults: partitions, jitter, drop, delay, duplicate.
  return det.node == fault.node && (det.detail == "heartbeat_suspect" || det.detail == "heartbeat_confirmed");
}

bool disrupts(const event& fault, const event& e) {
  if (e.kind != event_kind::replica_state) return false;
  if (e.detail != "failed" && e.detail != "creating" && e.detail != "stopped") return false;
  if (fault.detail.rfind("kill_replica", 0) == 0) return e.replica == fault.replica;
  if (fault.detail == "kill_rack" && fault.count > 0)
    return e.node >= fault.node && (e.node - fault.node) % static_cast<std::int64_t>(fault.count) == 0;
  return e.node == fault.node;
}

// Faults that end replicas directly. The others (partitions, jitter, dropped
// or delayed messages, slow loads) disrupt only through the control plane's
// decisions, seconds later, so a later one of them must not take over a
// disruption that an earlier fault set in motion.
bool ends_replicas(const event& fault) {
  const std::string& k = fault.detail;
  return k.rfind("kill_", 0) == 0 || k == "fail_device" || k == "hang_device";
}

bool later_fault_explains(const std::vector<event>& log, const event& fault, const event& e) {
  for (const auto& g : log) {
    if (g.t_ns > e.t_ns) break;  // log is sorted by time
    if (g.kind != event_kind::fault_injected || !ends_replicas(g) || !disrupts(g, e)) continue;
    if (g.t_ns > fault.t_ns || (g.t_ns == fault.t_ns && g.fault_id > fault.fault_id)) return true;
  }
  return false;
}

}  // namespace

std::vector<event> attribute_faults(std::vector<event> log, std::uint32_t desired_replicas) {
  std::stable_sort(log.begin(), log.end(), [](const event& a, const event& b) { return a.t_ns < b.t_ns; });
  std::vector<event> added;
  for (const auto& f : log) {
    if (f.kind != event_kind::fault_injected) continue;
    std::int64_t detected = -1, disrupted = -1;
    for (const auto& e : log) {
      if (e.t_ns < f.t_ns) continue;
      if (detected < 0 && e.kind == event_kind::fault_detected && e.fault_id == 0 && matches(f, e)) {
        detected = e.t_ns;
        event d = e;
        d.fault_id = f.fault_id;
        added.push_back(d);
      }
      // A disruption belongs to the latest fault that explains it: a replica
      // failing after a later fault hit the same node is the later fault's.
      if (disrupted < 0 && disrupts(f, e) && !later_fault_explains(log, f, e)) disrupted = e.t_ns;
    }
    if (disrupted < 0) continue;  // nothing was lost: nothing to recover
    // The first moment after the disruption with every replica serving again.
    // Counted by slot: a slot serves when its newest epoch's replica does. A
    // replica that vanished with a lost node never reports its end, and
    // counting replicas would count it alongside its replacement.
    struct slot_state {
      std::uint64_t epoch = 0;
      std::uint64_t replica = 0;
      bool up = false;
    };
    std::map<std::pair<std::string, std::int64_t>, slot_state> live;
    for (const auto& e : log) {
      if (e.kind != event_kind::replica_state) continue;
      // Events without a slot (none in practice) count by replica id.
      std::pair<std::string, std::int64_t> key{e.deployment, e.slot};
      if (e.slot < 0) key = {std::string(), -1 - static_cast<std::int64_t>(e.replica)};
      auto& sl = live[key];
      if (e.epoch >= sl.epoch) sl = {e.epoch, e.replica, e.detail == "ready" || e.detail == "serving"};
      if (e.t_ns < disrupted) continue;
      std::uint32_t n = 0;
      for (const auto& [k, v] : live) n += v.up;
      if (n >= desired_replicas) {
        event r;
        r.t_ns = e.t_ns;
        r.kind = event_kind::fault_recovered;
        r.fault_id = f.fault_id;
        added.push_back(r);
        break;
      }
    }
  }
  log.insert(log.end(), added.begin(), added.end());
  std::stable_sort(log.begin(), log.end(), [](const event& a, const event& b) { return a.t_ns < b.t_ns; });
  return log;
}

}  // namespace exa::chaos
