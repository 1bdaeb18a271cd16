#include "cluster/placement.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <set>
#include <utility>

#include "common/assert.hpp"

namespace exa::cluster {

// ---------------------------------------------------------------------------
// cluster_state

expected<cluster_state> cluster_state::create(std::vector<node_info> nodes, std::uint64_t device_reserved_bytes) {
  if (nodes.empty()) return make_error(errc::invalid_argument, "topology has no nodes");
  std::sort(nodes.begin(), nodes.end(), [](const node_info& a, const node_info& b) { return a.id < b.id; });
  cluster_state s;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const node_info& n = nodes[i];
    if (i > 0 && nodes[i - 1].id == n.id) {
      return make_error(errc::invalid_argument, fmt::format("topology lists node {} twice", n.id));
    }
    if (n.devices == 0 || n.devices > max_devices_per_node) {
      return make_error(errc::invalid_argument, fmt::format("node {}: devices = {} must be in 1..{}", n.id,
                                                            n.devices, max_devices_per_node));
    }
    if (n.device_memory_bytes <= device_reserved_bytes) {
      return make_error(errc::invalid_argument,
                        fmt::format("node {}: device memory {} is not above the per-device reserve {}", n.id,
                                    format_bytes(n.device_memory_bytes), format_bytes(device_reserved_bytes)));
    }
    s.index_.emplace(n.id, i);
    s.first_ledger_.push_back(s.ledgers_.size());
    for (std::uint32_t d = 0; d < n.devices; ++d) s.ledgers_.emplace_back(n.device_memory_bytes, device_reserved_bytes);
  }
  s.nodes_ = std::move(nodes);
  s.device_reserved_bytes_ = device_reserved_bytes;
  return s;
}

cluster_state cluster_state::empty(std::uint64_t device_reserved_bytes) {
  cluster_state s;
  s.device_reserved_bytes_ = device_reserved_bytes;
  return s;
}

expected<void> cluster_state::set_region(node_id node, std::string region) {
  const auto i = node_index(node);
  if (!i) return make_error(errc::not_found, "no node " + std::to_string(node));
  regions_[node] = std::move(region);
  return {};
}

const std::string& cluster_state::region_of(node_id node) const {
  static const std::string none;
  const auto it = regions_.find(node);
  return it == regions_.end() ? none : it->second;
}

expected<void> cluster_state::add_node(const node_info& node) {
  if (index_.count(node.id)) return make_error(errc::invalid_argument, fmt::format("node {} is already known", node.id));
  auto nodes = nodes_;
  nodes.push_back(node);
  auto next = create(std::move(nodes), device_reserved_bytes_);
  if (!next) return std::unexpected(next.error());
  // Ledgers are rebuilt in the new order; every replica is admitted again
  // where it was, which cannot fail: the same devices hold the same bytes.
  for (const auto& [id, slot] : replicas_) {
    auto ok = next->commit(slot);
    EXA_ASSERT_MSG(ok.has_value(), "re-admitting a placed replica after a node joined failed");
  }
  next->next_replica_id_ = next_replica_id_;
  *this = std::move(*next);
  return {};
}

std::optional<std::size_t> cluster_state::node_index(node_id node) const {
  const auto it = index_.find(node);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

const device_ledger* cluster_state::ledger(device_ref device) const {
  const auto i = node_index(device.node);
  if (!i || device.device >= nodes_[*i].devices) return nullptr;
  return &ledgers_[first_ledger_[*i] + device.device];
}

device_ledger* cluster_state::mutable_ledger(device_ref device) {
  return const_cast<device_ledger*>(std::as_const(*this).ledger(device));
}

expected<void> cluster_state::commit(const placed_slot& slot) {
  if (slot.replica == 0 || replicas_.count(slot.replica) != 0) {
    return make_error(errc::invalid_argument, fmt::format("replica id {} is 0 or already placed", slot.replica));
  }
  if (slot.devices.empty() || slot.devices.size() > max_tensor_parallel) {
    return make_error(errc::invalid_argument, fmt::format("replica {} lists {} devices; must be 1..{}",
                                                          slot.replica, slot.devices.size(), max_tensor_parallel));
  }
  std::set<std::uint32_t> seen;
  for (std::uint32_t d : slot.devices) {
    const device_ledger* l = ledger({slot.node, d});
    if (l == nullptr || !seen.insert(d).second) {
      return make_error(errc::invalid_argument,
                        fmt::format("replica {}: device {} of node {} is unknown or listed twice", slot.replica, d,
                                    slot.node));
    }
    if (!l->can_admit(slot.per_device)) {
      return make_error(errc::out_of_memory,
                        fmt::format("replica {} ('{}' #{}): node {} device {} needs {}, {} free of {}", slot.replica,
                                    slot.slot.deployment, slot.slot.index, slot.node, d,
                                    format_bytes(slot.per_device.total_bytes()), format_bytes(l->free_bytes()),
                                    format_bytes(l->capacity_bytes())));
    }
  }
  // Every device was checked above, so no admit below can fail half-way.
  for (std::uint32_t d : slot.devices) {
    auto ok = mutable_ledger({slot.node, d})->admit(slot.replica, slot.per_device);
    EXA_ASSERT(ok.has_value());
  }
  replicas_.emplace(slot.replica, slot);
  next_replica_id_ = std::max(next_replica_id_, slot.replica + 1);
  return {};
}

expected<void> cluster_state::release(replica_id replica) {
  const auto it = replicas_.find(replica);
  if (it == replicas_.end()) {
    return make_error(errc::not_found, fmt::format("replica {} is not placed", replica));
  }
  for (std::uint32_t d : it->second.devices) {
    auto ok = mutable_ledger({it->second.node, d})->release(replica);
    EXA_ASSERT_MSG(ok.has_value(), "a placed replica is missing from its device ledger");
  }
  replicas_.erase(it);
  return {};
}

// ---------------------------------------------------------------------------
// placement

namespace {

constexpr std::uint32_t no_limit = std::numeric_limits<std::uint32_t>::max();

/// One deployment ready to place: its per-device need, its anti-affinity
/// limits and how many of its replicas each node and rack already holds.
struct prepared {
  const deployment_spec* spec = nullptr;
  memory_breakdown per_device;
  std::uint32_t node_limit = no_limit;
  std::uint32_t rack_limit = no_limit;
  std::vector<std::uint32_t> per_node;  // by node index
  std::vector<std::uint32_t> per_rack;  // by dense rack index
  std::vector<std::uint32_t> per_region;  // by dense region index
};

struct candidate {
  std::size_t node = 0;
  std::vector<std::uint32_t> devices;
};

expected<memory_breakdown> check_spec(const deployment_spec& d) {
  auto bad = [&](std::string what) {
    return make_error(errc::invalid_argument, fmt::format("deployment '{}': {}", d.name, what));
  };
  if (d.name.empty() || d.name.size() > max_deployment_name_bytes) {
    return bad(fmt::format("name must be 1..{} bytes", max_deployment_name_bytes));
  }
  if (d.replicas == 0 || d.replicas > max_replicas_per_deployment) {
    return bad(fmt::format("replicas = {} must be in 1..{}", d.replicas, max_replicas_per_deployment));
  }
  if (d.max_replicas_per_node == 0u) return bad("max_replicas_per_node must be at least 1");
  if (d.max_replicas_per_rack == 0u) return bad("max_replicas_per_rack must be at least 1");
  auto m = estimate(d.model, d.replica);
  if (!m) return bad(m.error().message);
  return *m;
}

/// The placement algorithm over one cluster_state; see placement.hpp.
class placer {
 public:
  placer(cluster_state& state, const std::vector<node_id>& excluded) : state_(state) {
    const auto& nodes = state.nodes();
    std::map<rack_id, std::uint32_t> racks;  // ordered: dense indices follow rack ids
    for (const node_info& n : nodes) racks.emplace(n.rack, 0);
    std::uint32_t next = 0;
    for (auto& [id, index] : racks) index = next++;
    rack_count_ = next;
    std::map<std::string, std::uint32_t> regions;
    for (const node_info& n : nodes) regions.emplace(state.region_of(n.id), 0);
    next = 0;
    for (auto& [name, index] : regions) index = next++;
    region_count_ = next;
    for (const node_info& n : nodes) region_of_.push_back(regions.at(state.region_of(n.id)));
    excluded_.assign(nodes.size(), false);
    for (node_id id : excluded) {
      if (auto i = state.node_index(id)) excluded_[*i] = true;
    }
    for (const node_info& n : nodes) {
      rack_of_.push_back(racks.at(n.rack));
      std::uint64_t used = 0;
      for (std::uint32_t d = 0; d < n.devices; ++d) used += state.ledger({n.id, d})->used_bytes();
      node_used_.push_back(used);
      node_capacity_.push_back(std::uint64_t{n.devices} * n.device_memory_bytes);
    }
  }

  /// Fills in limits and counts; replicas filling `skip` (a slot being
  /// replaced) are not counted.
  prepared prepare(const deployment_spec& spec, const memory_breakdown& m, const slot_ref* skip) const;
  std::optional<candidate> best_node(const prepared& p) const;
  std::string explain(const prepared& p, std::uint32_t index) const;
  placed_slot commit(prepared& p, std::uint32_t index, const candidate& c);

 private:
  std::optional<std::vector<std::uint32_t>> pick_devices(std::size_t node, const prepared& p) const;
  bool better(const prepared& p, std::size_t a, std::size_t b) const;
  bool packs_better(const prepared& p, std::size_t a, std::size_t b) const;
  bool has_empty_device(std::size_t node) const;
  std::uint32_t tp(const prepared& p) const { return p.spec->replica.tensor_parallel; }

  cluster_state& state_;
  std::vector<bool> excluded_;
  std::vector<std::uint32_t> rack_of_;
  std::vector<std::uint32_t> region_of_;
  std::uint32_t region_count_ = 0;
  std::vector<std::uint64_t> node_used_;
  std::vector<std::uint64_t> node_capacity_;
  std::uint32_t rack_count_ = 0;
};

prepared placer::prepare(const deployment_spec& spec, const memory_breakdown& m, const slot_ref* skip) const {
  const auto& nodes = state_.nodes();
  prepared p;
  p.spec = &spec;
  p.per_device = m;
  p.per_node.assign(nodes.size(), 0);
  p.per_rack.assign(rack_count_, 0);
  p.per_region.assign(region_count_, 0);
  for (const auto& [id, r] : state_.replicas()) {
    if (r.slot.deployment != spec.name || (skip != nullptr && r.slot == *skip)) continue;
    const std::size_t i = *state_.node_index(r.node);
    ++p.per_node[i];
    ++p.per_rack[rack_of_[i]];
    ++p.per_region[region_of_[i]];
  }
  // Spread evenly by default: over the nodes that could hold one replica
  // when empty, so tiny or excluded nodes do not lower everyone's share.
  std::uint32_t eligible = 0;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (excluded_[i]) continue;
    const device_ledger* l = state_.ledger({nodes[i].id, 0});
    const bool fits_empty = l->capacity_bytes() - l->reserved_bytes() >= m.total_bytes();
    if (fits_empty && nodes[i].devices >= spec.replica.tensor_parallel) ++eligible;
  }
  const std::uint32_t even = eligible == 0 ? 1 : (spec.replicas + eligible - 1) / eligible;
  // Packing has no even share per node: memory and devices are its limits.
  p.node_limit = spec.max_replicas_per_node.value_or(spec.pack_nodes ? no_limit : even);
  p.rack_limit = spec.max_replicas_per_rack.value_or(no_limit);
  return p;
}

// True when node `a` is a better home than node `b` for the next replica of
// `p`: fewer of its replicas in the region, then in the rack, then on the node, then one whose
// cache holds the file, then a smaller used fraction of memory, then the
// lower id (nodes are sorted by id).
bool placer::better(const prepared& p, std::size_t a, std::size_t b) const {
  const std::uint32_t ga = p.per_region[region_of_[a]], gb = p.per_region[region_of_[b]];
  if (ga != gb) return ga < gb;
  const std::uint32_t ra = p.per_rack[rack_of_[a]], rb = p.per_rack[rack_of_[b]];
  if (ra != rb) return ra < rb;
  if (p.spec->pack_nodes) return packs_better(p, a, b);
  if (p.per_node[a] != p.per_node[b]) return p.per_node[a] < p.per_node[b];
  if (!p.spec->cached_on.empty()) {
    const bool ca = p.spec->cached_on.count(state_.nodes()[a].id) != 0;
    const bool cb = p.spec->cached_on.count(state_.nodes()[b].id) != 0;
    if (ca != cb) return ca;
  }
  using wide = unsigned __int128;  // used × capacity overflows 64 bits
  const wide la = wide{node_used_[a]} * node_capacity_[b];
  const wide lb = wide{node_used_[b]} * node_capacity_[a];
  if (la != lb) return la < lb;
  return a < b;
}

// Consolidation's order (pack_nodes): a node with an empty device (no
// replica of any deployment) first, so each replica has a device of its own
// while any is left; then the fuller node, so the nodes in use fill before
// another is taken; then a node whose cache holds the file; then the lower id.
bool placer::packs_better(const prepared& p, std::size_t a, std::size_t b) const {
  const bool ea = has_empty_device(a), eb = has_empty_device(b);
  if (ea != eb) return ea;
  using wide = unsigned __int128;  // used × capacity overflows 64 bits
  const wide la = wide{node_used_[a]} * node_capacity_[b];
  const wide lb = wide{node_used_[b]} * node_capacity_[a];
  if (la != lb) return la > lb;
  if (!p.spec->cached_on.empty()) {
    const bool ca = p.spec->cached_on.count(state_.nodes()[a].id) != 0;
    const bool cb = p.spec->cached_on.count(state_.nodes()[b].id) != 0;
    if (ca != cb) return ca;
  }
  return a < b;
}

bool placer::has_empty_device(std::size_t node) const {
  const node_info& n = state_.nodes()[node];
  for (std::uint32_t d = 0; d < n.devices; ++d)
    if (state_.ledger({n.id, d})->replica_count() == 0) return true;
  return false;
}

std::optional<std::vector<std::uint32_t>> placer::pick_devices(std::size_t node, const prepared& p) const {
  const node_info& n = state_.nodes()[node];
  const std::uint64_t need = p.per_device.total_bytes();
  std::vector<std::pair<std::uint64_t, std::uint32_t>> fits;  // (free, device)
  for (std::uint32_t d = 0; d < n.devices; ++d) {
    const std::uint64_t free = state_.ledger({n.id, d})->free_bytes();
    if (free >= need) fits.emplace_back(free, d);
  }
  if (fits.size() < tp(p)) return std::nullopt;
  // Most free first, lowest index on ties: spreads shards over the devices.
  std::partial_sort(fits.begin(), fits.begin() + tp(p), fits.end(), [](const auto& x, const auto& y) {
    return x.first != y.first ? x.first > y.first : x.second < y.second;
  });
  std::vector<std::uint32_t> devices;
  for (std::uint32_t k = 0; k < tp(p); ++k) devices.push_back(fits[k].second);
  std::sort(devices.begin(), devices.end());
  return devices;
}

std::optional<candidate> placer::best_node(const prepared& p) const {
  std::optional<candidate> best;
  const auto& nodes = state_.nodes();
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (excluded_[i] || nodes[i].devices < tp(p)) continue;
    if (p.per_node[i] >= p.node_limit || p.per_rack[rack_of_[i]] >= p.rack_limit) continue;
    // The device scan is the costly part: only for nodes that would win.
    if (best && !better(p, i, best->node)) continue;
    if (auto devices = pick_devices(i, p)) best = candidate{i, std::move(*devices)};
  }
  return best;
}

placed_slot placer::commit(prepared& p, std::uint32_t index, const candidate& c) {
  placed_slot s;
  s.slot = slot_ref{p.spec->name, index};
  s.version = p.spec->version;
  s.replica = state_.next_replica_id();
  s.node = state_.nodes()[c.node].id;
  s.devices = c.devices;
  s.per_device = p.per_device;
  auto ok = state_.commit(s);
  EXA_ASSERT_MSG(ok.has_value(), "placement chose devices its ledgers refuse");
  ++p.per_node[c.node];
  ++p.per_rack[rack_of_[c.node]];
  ++p.per_region[region_of_[c.node]];
  node_used_[c.node] += p.per_device.total_bytes() * c.devices.size();
  return s;
}

std::string placer::explain(const prepared& p, std::uint32_t index) const {
  const auto& nodes = state_.nodes();
  const std::uint64_t need = p.per_device.total_bytes();
  std::uint32_t excluded = 0, too_small = 0, at_node_limit = 0, at_rack_limit = 0, short_of_memory = 0;
  std::uint32_t max_devices = 0, best_fitting = 0;
  std::uint64_t largest_free = 0;
  std::set<std::uint32_t> full_racks;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (excluded_[i]) { ++excluded; continue; }
    max_devices = std::max(max_devices, nodes[i].devices);
    if (nodes[i].devices < tp(p)) { ++too_small; continue; }
    if (p.per_node[i] >= p.node_limit) { ++at_node_limit; continue; }
    if (p.per_rack[rack_of_[i]] >= p.rack_limit) {
      ++at_rack_limit;
      full_racks.insert(rack_of_[i]);
      continue;
    }
    ++short_of_memory;
    std::uint32_t fitting = 0;
    for (std::uint32_t d = 0; d < nodes[i].devices; ++d) {
      const std::uint64_t free = state_.ledger({nodes[i].id, d})->free_bytes();
      largest_free = std::max(largest_free, free);
      if (free >= need) ++fitting;
    }
    best_fitting = std::max(best_fitting, fitting);
  }
  std::string why = fmt::format("deployment '{}' replica {}: ", p.spec->name, index);
  if (excluded == nodes.size()) return why + fmt::format("all {} nodes are excluded", nodes.size());
  if (too_small + excluded == nodes.size()) {
    return why + fmt::format("needs a TP group of {} devices on one node; the largest node has {}", tp(p),
                             max_devices);
  }
  if (short_of_memory > 0) {
    why += tp(p) == 1 ? fmt::format("needs {} on one device", format_bytes(need))
                      : fmt::format("needs {} on each of {} devices of one node", format_bytes(need), tp(p));
    why += fmt::format("; largest free device has {}", format_bytes(largest_free));
    if (largest_free >= need) why += fmt::format(", but no node has {} such devices (best: {})", tp(p), best_fitting);
    if (at_node_limit + at_rack_limit > 0) {
      why += fmt::format(" ({} more nodes are at their anti-affinity limits)", at_node_limit + at_rack_limit);
    }
    return why;
  }
  // Every candidate node is blocked by anti-affinity.
  if (at_rack_limit == 0) {
    return why + fmt::format("anti-affinity: {}{} nodes already hold {} replicas (max_replicas_per_node {})",
                             too_small == 0 ? "all " : "", at_node_limit, p.node_limit, p.node_limit);
  }
  if (at_node_limit == 0) {
    return why + fmt::format("anti-affinity: all {} racks already hold {} replicas (max_replicas_per_rack {})",
                             full_racks.size(), p.rack_limit, p.rack_limit);
  }
  return why + fmt::format("anti-affinity: {} nodes hold max_replicas_per_node {}; the other {} sit in {} racks "
                           "holding max_replicas_per_rack {}",
                           at_node_limit, p.node_limit, at_rack_limit, full_racks.size(), p.rack_limit);
}

struct work_item {
  std::size_t deployment = 0;
  std::uint32_t index = 0;
  std::uint64_t bytes = 0;  // per-device share × TP degree
};

}  // namespace

expected<placement_plan> place(cluster_state& state, const std::vector<deployment_spec>& deployments,
                               const std::vector<node_id>& excluded) {
  std::vector<memory_breakdown> needs;
  std::set<std::string> names;
  for (const deployment_spec& d : deployments) {
    auto m = check_spec(d);
    if (!m) return std::unexpected(m.error());
    if (!names.insert(d.name).second) {
      return make_error(errc::invalid_argument, fmt::format("deployment '{}' is listed twice", d.name));
    }
    needs.push_back(*m);
  }
  std::set<std::pair<std::string, std::uint32_t>> filled;
  for (const auto& [id, r] : state.replicas()) filled.emplace(r.slot.deployment, r.slot.index);

  placer pl(state, excluded);
  std::vector<prepared> prep;
  std::vector<work_item> items;
  for (std::size_t k = 0; k < deployments.size(); ++k) {
    prep.push_back(pl.prepare(deployments[k], needs[k], nullptr));
    const std::uint64_t bytes = needs[k].total_bytes() * deployments[k].replica.tensor_parallel;
    for (std::uint32_t i = 0; i < deployments[k].replicas; ++i) {
      if (filled.count({deployments[k].name, i}) == 0) items.push_back({k, i, bytes});
    }
  }
  // Largest first; stable, so equal sizes keep deployment then slot order.
  std::stable_sort(items.begin(), items.end(),
                   [](const work_item& a, const work_item& b) { return a.bytes > b.bytes; });
  placement_plan plan;
  for (const work_item& w : items) {
    prepared& p = prep[w.deployment];
    if (auto c = pl.best_node(p)) {
      plan.placed.push_back(pl.commit(p, w.index, *c));
    } else {
      plan.unplaced.push_back({slot_ref{p.spec->name, w.index}, pl.explain(p, w.index)});
    }
  }
  return plan;
}

expected<placed_slot> place_one(cluster_state& state, const deployment_spec& deployment, std::uint32_t index,
                                const std::vector<node_id>& excluded) {
  auto m = check_spec(deployment);
  if (!m) return std::unexpected(m.error());
  if (index >= deployment.replicas) {
    return make_error(errc::invalid_argument, fmt::format("deployment '{}': slot {} is out of range (replicas {})",
                                                          deployment.name, index, deployment.replicas));
  }
  placer pl(state, excluded);
  const slot_ref slot{deployment.name, index};
  prepared p = pl.prepare(deployment, *m, &slot);
  auto c = pl.best_node(p);
  if (!c) return make_error(errc::unavailable, pl.explain(p, index));
  return pl.commit(p, index, *c);
}

}  // namespace exa::cluster
