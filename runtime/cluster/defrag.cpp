#include "cluster/defrag.hpp"

#include <algorithm>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "cluster/ledger.hpp"

namespace exa::cluster {

namespace {

struct device_cost {
  std::uint32_t device = 0;
  std::vector<const placed_slot*> movers;  // largest first
  std::uint64_t bytes = 0;
  bool feasible = true;
};

std::uint64_t shard_bytes(const placed_slot& p) { return p.per_device.total_bytes(); }

}  // namespace

expected<defrag_plan> plan_defrag(const cluster_state& state, const defrag_request& req) {
  if (req.bytes_per_device == 0) return make_error(errc::invalid_argument, "defrag: the replica takes 0 bytes");
  if (!valid_tensor_parallel(req.tensor_parallel))
    return make_error(errc::invalid_argument, fmt::format("defrag: tensor_parallel {} is not one of 1, 2, 4, 8",
                                                          req.tensor_parallel));
  // Free memory per device, and the single-device replicas on each.
  std::map<device_ref, std::uint64_t> free;
  std::uint64_t total_free = 0;
  for (const auto& n : state.nodes()) {
    if (req.excluded.count(n.id)) continue;
    for (std::uint32_t d = 0; d < n.devices; ++d) {
      const auto* l = state.ledger({n.id, d});
      if (!l) continue;
      free[{n.id, d}] = l->free_bytes();
      total_free += l->free_bytes();
    }
  }
  const std::uint64_t need_total = req.bytes_per_device * req.tensor_parallel;
  if (total_free < need_total)
    return make_error(errc::not_found, fmt::format("defrag: {} free in total, the replica needs {}",
                                                   format_bytes(total_free), format_bytes(need_total)));
  std::map<device_ref, std::vector<const placed_slot*>> on_device;
  for (const auto& [id, p] : state.replicas())
    if (p.devices.size() == 1 && !req.pinned.count(id)) on_device[{p.node, p.devices.front()}].push_back(&p);
  for (auto& [d, v] : on_device)
    std::sort(v.begin(), v.end(), [](const placed_slot* a, const placed_slot* b) {
      return shard_bytes(*a) != shard_bytes(*b) ? shard_bytes(*a) > shard_bytes(*b) : a->replica < b->replica;
    });

  std::optional<defrag_plan> best;
  std::vector<std::string> whys;  // one reason per node that could not take it
  for (const auto& n : state.nodes()) {
    if (req.excluded.count(n.id) || n.devices < req.tensor_parallel) continue;
    if (req.may_target && !req.may_target(n.id)) continue;
    std::vector<device_cost> costs;
    for (std::uint32_t d = 0; d < n.devices; ++d) {
      device_cost c;
      c.device = d;
      std::uint64_t have = free.count({n.id, d}) ? free[{n.id, d}] : 0;
      if (have < req.bytes_per_device) {
        const auto it = on_device.find({n.id, d});
        if (it != on_device.end())
          for (const auto* p : it->second) {
            if (have >= req.bytes_per_device) break;
            c.movers.push_back(p);
            c.bytes += shard_bytes(*p);
            have += shard_bytes(*p);
          }
        c.feasible = have >= req.bytes_per_device;
      }
      costs.push_back(std::move(c));
    }
    std::stable_sort(costs.begin(), costs.end(), [](const device_cost& a, const device_cost& b) {
      if (a.feasible != b.feasible) return a.feasible;
      if (a.movers.size() != b.movers.size()) return a.movers.size() < b.movers.size();
      return a.bytes < b.bytes;
    });
    if (!costs[req.tensor_parallel - 1].feasible) {
      whys.push_back(fmt::format("node {}: moving every movable replica would not free {} on {} device(s)", n.id,
                        format_bytes(req.bytes_per_device), req.tensor_parallel));
      continue;
    }
    // Target sets, cheapest first: each feasible device alone for one
    // shard; the tp cheapest together for a group.
    std::vector<std::vector<const device_cost*>> sets;
    if (req.tensor_parallel == 1) {
      for (const auto& c : costs)
        if (c.feasible) sets.push_back({&c});
    } else {
      std::vector<const device_cost*> group;
      for (std::uint32_t i = 0; i < req.tensor_parallel; ++i) group.push_back(&costs[i]);
      sets.push_back(std::move(group));
    }
    for (const auto& set : sets) {
      defrag_plan plan;
      plan.node = n.id;
      std::set<std::uint32_t> target;
      std::vector<const placed_slot*> movers;
      for (const auto* c : set) {
        target.insert(c->device);
        movers.insert(movers.end(), c->movers.begin(), c->movers.end());
        plan.bytes_moved += c->bytes;
      }
      plan.devices.assign(target.begin(), target.end());
      if (movers.size() > req.max_moves) {
        whys.push_back(
            fmt::format("node {} needs {} moves, more than the limit of {}", n.id, movers.size(), req.max_moves));
        continue;
      }
      if (best && (movers.size() > best->moves.size() ||
                   (movers.size() == best->moves.size() && plan.bytes_moved >= best->bytes_moved)))
        continue;
      // Destinations: largest mover first, best fit off the target devices.
      std::sort(movers.begin(), movers.end(), [](const placed_slot* a, const placed_slot* b) {
        return shard_bytes(*a) != shard_bytes(*b) ? shard_bytes(*a) > shard_bytes(*b) : a->replica < b->replica;
      });
      auto room = free;
      bool placed_all = true;
      for (const auto* p : movers) {
        const std::uint64_t b = shard_bytes(*p);
        std::optional<device_ref> dest;
        for (const auto& [d, f] : room) {
          if (d.node == n.id) continue;  // off the target node: drained from it, placed elsewhere
          if (f < b || (req.may_host && !req.may_host(*p, d.node))) continue;
          if (!dest || f < room[*dest]) dest = d;
        }
        if (!dest) {
          placed_all = false;
          whys.push_back(
              fmt::format("node {}: no room elsewhere for replica {} ({})", n.id, p->replica, format_bytes(b)));
          break;
        }
        room[*dest] -= b;
        plan.moves.push_back({p->replica, p->slot, p->node, p->devices.front(), dest->node, dest->device, b});
      }
      if (placed_all) best = std::move(plan);
    }
  }
  if (!best) {
    std::string why = whys.empty() ? "no node has devices enough for it" : "";
    for (std::size_t i = 0; i < whys.size() && i < 4; ++i) why += (i ? "; " : "") + whys[i];
    if (whys.size() > 4) why += fmt::format("; and {} more nodes", whys.size() - 4);
    return make_error(errc::not_found, "defrag: " + why);
  }
  return *best;
}

}  // namespace exa::cluster
