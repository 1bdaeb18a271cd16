#include "actors/controller_actor.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>

#include "actors/cluster_metrics.hpp"
#include "cluster/model_ref.hpp"
#include "cluster/model_shape.hpp"
#include "cluster/routing.hpp"
#include "model/llama_model.hpp"

namespace exa::actors {
namespace {

using self_ptr = caf::stateful_actor<controller_state>*;
using cluster::replica_state;

constexpr std::uint32_t max_replicas_per_deployment = 4096;

expected<void> check_name(const std::string& name) {
  if (name.empty() || name.size() > 64)
    return make_error(errc::invalid_argument, "deployment name must be 1..64 characters");
  for (const char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.')
      return make_error(errc::invalid_argument,
                        "deployment name '" + name + "' may use only letters, digits, '-', '_' and '.'");
  return {};
}

// Starts the replica of a placed slot on its node.
void start_slot(self_ptr self, const cluster::placed_slot& p, cluster::epoch_t epoch) {
  auto& st = self->state;
  const auto& dep = st.deployments.at(p.slot.deployment);
  replica_spec spec;
  spec.id = p.replica;
  spec.deployment = p.slot.deployment;
  spec.slot = p.slot.index;
  spec.epoch = epoch;
  spec.model_file = dep.model_file;
  spec.device = p.devices.front();
  spec.kv_tokens = static_cast<std::uint32_t>(dep.spec.replica.kv_tokens);
  spec.engine = st.config.engine;
  st.slot_epochs[p.slot] = epoch;
  auto& rec = st.replicas[p.replica];
  rec = {p.replica, p.slot.deployment, p.slot.index, epoch, p.node, spec.device, replica_state::creating, "", false, spec};
  spdlog::info("event=replica_placed replica={} deployment={} slot={} epoch={} node={} device={} bytes={}", p.replica,
               spec.deployment, spec.slot, epoch, p.node, spec.device, p.per_device.total_bytes());
  const auto node = st.nodes.find(p.node);
  if (node != st.nodes.end() && node->second) {  // else: sent when the node comes up
    self->send(node->second, spawn_replica{spec});
    rec.spawned = true;
  }
}

deployment_announce announce(const std::string& name, const controller_state::deployment& dep) {
  return {name, dep.model_file, dep.spec.model.vocab_size, dep.spec.model.context_length, dep.routing};
}

void remember(self_ptr self, const api::deploy_request& req) {
  std::lock_guard lock(self->state.config.desired->mutex);
  self->state.config.desired->deployments[req.name] = req;
}

void forget(self_ptr self, const std::string& name) {
  std::lock_guard lock(self->state.config.desired->mutex);
  self->state.config.desired->deployments.erase(name);
}

// Places every missing slot of a deployment; returns how many are still missing.
std::size_t place_missing(self_ptr self, const std::string& name, std::string* why) {
  auto& st = self->state;
  auto& dep = st.deployments.at(name);
  auto plan = cluster::place(*st.placement, {dep.spec});
  if (!plan) {
    if (why) *why = plan.error().message;
    return dep.spec.replicas;
  }
  for (const auto& p : plan->placed) start_slot(self, p, st.slot_epochs[p.slot] + 1);
  for (const auto& u : plan->unplaced) spdlog::warn("event=replica_unplaced deployment={} slot={} reason=\"{}\"", name, u.slot.index, u.reason);
  if (why && !plan->unplaced.empty()) *why = plan->unplaced.front().reason;
  return plan->unplaced.size();
}

// Places queued slots, at most `migration_parallelism` warming at a time.
void pump_migrations(self_ptr self) {
  auto& st = self->state;
  while (st.migrating.size() < std::max(1u, st.config.migration_parallelism) && !st.pending_migrations.empty()) {
    auto m = std::move(st.pending_migrations.front());
    st.pending_migrations.pop_front();
    auto it = st.deployments.find(m.deployment);
    if (it == st.deployments.end() || m.slot >= it->second.spec.replicas) continue;  // scaled away meanwhile
    if (st.slot_epochs[{m.deployment, m.slot}] != m.epoch) continue;                // superseded
    auto excluded = m.excluded;
    excluded.insert(excluded.end(), st.cordoned.begin(), st.cordoned.end());
    auto placed = cluster::place_one(*st.placement, it->second.spec, m.slot, excluded);
    if (!placed) {
      // No room now (nodes down or cordoned): keep it queued; a node coming
      // back or memory being released pumps again.
      spdlog::warn("event=replica_waiting_for_capacity deployment={} slot={} reason=\"{}\"", m.deployment, m.slot,
                   placed.error().message);
      st.pending_migrations.push_front(std::move(m));
      break;
    }
    start_slot(self, *placed, m.epoch);
    st.migrating.insert(placed->replica);
  }
}

// A slot lost its replica: fence it (a new epoch, so the router and any
// straggler of the old replica know it is stale) and queue its placement
// elsewhere than `excluded`, if the deployment still wants it.
void replace_slot(self_ptr self, const std::string& deployment, std::uint32_t slot,
                  const std::vector<cluster::node_id>& excluded) {
  auto& st = self->state;
  auto it = st.deployments.find(deployment);
  if (it == st.deployments.end() || slot >= it->second.spec.replicas) return;
  const cluster::slot_ref ref{deployment, slot};
  auto& budget = st.slot_failures
                     .try_emplace(ref, st.config.slot_max_replacements,
                                  std::chrono::milliseconds(st.config.slot_replacement_window_ms))
                     .first->second;
  const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(self->clock().now().time_since_epoch());
  if (!budget.allow(now)) {
    // Quarantined for a while, not forever: capacity the slot needs may come
    // back (a node rejoins), and a transient cause may pass.
    spdlog::error("event=slot_given_up deployment={} slot={} replacements={} retry_in_ms={} "
                  "reason=\"keeps failing wherever it is placed\"",
                  deployment, slot, budget.max_restarts(), st.config.slot_retry_after_ms);
    self->delayed_send(self, std::chrono::milliseconds(st.config.slot_retry_after_ms), retry_slot{deployment, slot});
    return;
  }
  const cluster::epoch_t epoch = ++st.slot_epochs[ref];
  self->send(st.router, fence_slot{deployment, slot, epoch});
  spdlog::info("event=slot_fenced deployment={} slot={} epoch={}", deployment, slot, epoch);
  st.pending_migrations.push_back({deployment, slot, epoch, excluded});
  pump_migrations(self);
}

void forget_replica(self_ptr self, cluster::replica_id id) {
  auto& st = self->state;
  if (st.placement->replicas().count(id)) (void)st.placement->release(id);
  st.replicas.erase(id);
}

// Replicas by lifecycle state, for the exaserve_replicas gauge.
void update_replica_gauge(self_ptr self) {
  auto& st = self->state;
  if (!st.config.metrics) return;
  std::map<cluster::replica_state, std::size_t> counts;
  for (const auto& [id, r] : st.replicas) ++counts[r.state];
  for (const auto s : cluster::all_replica_states)
    cluster_metrics::series(st.config.metrics->replicas, cluster::to_string(s))->set(static_cast<double>(counts[s]));
}

void on_replica_event(self_ptr self, const replica_event& ev) {
  auto& st = self->state;
  auto it = st.replicas.find(ev.id);
  if (it == st.replicas.end()) return;  // already forgotten
  const auto state = static_cast<replica_state>(ev.state);
  it->second.state = state;
  it->second.reason = ev.reason;
  if (ev.handle) it->second.handle = ev.handle;
  if (cluster::accepts_requests(state) && st.migrating.erase(ev.id)) pump_migrations(self);
  if (state == replica_state::stopped) {
    st.migrating.erase(ev.id);
    forget_replica(self, ev.id);
    pump_migrations(self);
  } else if (state == replica_state::failed) {
    const auto rec = it->second;
    st.migrating.erase(ev.id);
    forget_replica(self, ev.id);
    // A crash loop on one node: try the others first.
    replace_slot(self, rec.deployment, rec.slot, {rec.node});
  }
  update_replica_gauge(self);
}

// Every replica on `node` is lost (the node actor died, or its silence was
// confirmed): tell the router, release their memory, place them elsewhere.
void migrate_node(self_ptr self, cluster::node_id node, const std::string& why) {
  auto& st = self->state;
  std::vector<controller_state::replica_record> lost;
  for (const auto& [id, r] : st.replicas)
    if (r.node == node) lost.push_back(r);
  spdlog::error("event=node_lost node={} replicas={} reason=\"{}\"", node, lost.size(), why);
  for (const auto& r : lost) {
    const replica_event ev{r.id, r.deployment, r.slot, r.epoch, node, r.device,
                           static_cast<std::uint8_t>(replica_state::failed), why, caf::actor{}};
    self->send(st.router, ev);
    chaos::event e;  // the replica cannot say so itself: its node is gone
    e.kind = chaos::event_kind::replica_state;
    e.replica = r.id;
    e.deployment = r.deployment;
    e.slot = r.slot;
    e.epoch = r.epoch;
    e.node = node;
    e.detail = "failed";
    log_event(self, st.config.hooks, e);
    st.migrating.erase(r.id);
    forget_replica(self, r.id);
    replace_slot(self, r.deployment, r.slot, {node});
  }
}

void on_node_down(self_ptr self, cluster::node_id node) {
  self->state.nodes[node] = caf::actor{};
  chaos::event e;
  e.kind = chaos::event_kind::fault_detected;
  e.node = node;
  e.detail = "monitor";
  log_event(self, self->state.config.hooks, e);
  migrate_node(self, node, "node actor down");
}

// The health monitor's verdicts: confirmed nodes lose their replicas (they
// are placed elsewhere) and take no new ones; a node that speaks again after
// that learns the current epochs, so what it still runs stops itself.
void on_node_health(self_ptr self, const node_health_msg& m) {
  auto& st = self->state;
  const auto health = static_cast<cluster::node_health>(m.health);
  const auto before = st.node_health[m.node];
  st.node_health[m.node] = health;
  if (health == cluster::node_health::confirmed) {
    st.cordoned.insert(m.node);
    migrate_node(self, m.node, "heartbeats confirmed lost");
  } else if (health == cluster::node_health::healthy && before == cluster::node_health::confirmed) {
    st.cordoned.erase(m.node);
    fence_notice notice;
    for (const auto& [slot, epoch] : st.slot_epochs) notice.slots.push_back({slot.deployment, slot.index, epoch});
    const auto node = st.nodes.find(m.node);
    if (node != st.nodes.end())
      control_send(self, st.config.hooks, m.node, cluster::message_class::control, node->second, notice);
    spdlog::info("event=node_rejoined node={} slots_fenced={}", m.node, notice.slots.size());
    pump_migrations(self);
  }
}

caf::result<ok_atom> on_deploy(self_ptr self, const api::deploy_request& req) {
  auto& st = self->state;
  if (auto ok = check_name(req.name); !ok) return to_caf(ok.error());
  if (st.deployments.count(req.name))
    return to_caf({errc::invalid_argument, "deployment '" + req.name + "' exists; use scale or undeploy"});
  if (req.replicas == 0 || req.replicas > max_replicas_per_deployment)
    return to_caf({errc::invalid_argument, "replicas must be in [1, " + std::to_string(max_replicas_per_deployment) + "]"});
  const std::string routing = req.routing.empty() ? st.config.default_routing : req.routing;
  if (auto policy = cluster::make_routing_policy(routing); !policy) return to_caf(policy.error());
  const std::string file = req.model_file.empty() ? st.config.default_model_file : req.model_file;
  auto ref = cluster::parse_model_ref(file);
  if (!ref) return to_caf(ref.error());
  controller_state::deployment dep;
  dep.model_file = file;
  if (ref->is_preset()) {  // simulation: a published shape, no weights
    dep.spec.model = *ref->preset;
  } else {
    // Read for its shape only: nodes and gateways open the file themselves.
    auto model = model::llama_model::load(file);
    if (!model) return to_caf(model.error());
    dep.spec.model = cluster::model_shape_from(**model);
  }
  dep.routing = routing;
  dep.spec.name = req.name;
  dep.spec.replicas = req.replicas;
  if (req.max_replicas_per_node) dep.spec.max_replicas_per_node = req.max_replicas_per_node;
  dep.spec.replica.kv_tokens = req.kv_tokens ? req.kv_tokens : st.config.default_kv_tokens;
  dep.spec.replica.max_batch_tokens = st.config.max_batch_tokens;
  dep.spec.replica.replica_overhead_bytes = st.config.replica_overhead_bytes;
  st.deployments[req.name] = dep;
  self->send(st.router, announce(req.name, dep));
  std::string why;
  const std::size_t missing = place_missing(self, req.name, &why);
  spdlog::info("event=deployed deployment={} model={} replicas={} placed={} routing={}", req.name, file, req.replicas,
               req.replicas - missing, dep.routing);
  if (missing == req.replicas) {  // nothing fits: refuse rather than keep an empty deployment
    st.deployments.erase(req.name);
    self->send(st.router, deployment_removed{req.name});
    return to_caf({errc::unavailable, "cannot place any replica of '" + req.name + "': " + why});
  }
  remember(self, req);
  return ok_atom::value;
}

void stop_slots(self_ptr self, const std::string& name, std::uint32_t from_slot) {
  auto& st = self->state;
  for (auto& [id, r] : st.replicas) {
    if (r.deployment != name || r.slot < from_slot) continue;
    const auto node = st.nodes.find(r.node);
    if (node != st.nodes.end() && node->second) self->send(node->second, stop_replica{id, true});
  }
}


std::vector<api::model_info> list_models(self_ptr self) {
  std::vector<api::model_info> out;
  for (const auto& [name, dep] : self->state.deployments) {
    api::model_info mi{name, dep.model_file, 0, dep.spec.replicas, dep.spec.model.context_length};
    for (const auto& [id, r] : self->state.replicas)
      if (r.deployment == name && cluster::accepts_requests(r.state)) ++mi.replicas_ready;
    out.push_back(std::move(mi));
  }
  return out;
}

// A node (re)started. First sight of its id adds it to placement (nodes of
// the distributed cluster are not known in advance); every join refreshes
// its handle, starts what was placed there meanwhile and tells gateways.
void on_node_join(self_ptr self, const node_join& m) {
  auto& s = self->state;
  if (!s.placement->node_index(m.node)) {
    cluster::node_info info{m.node, m.rack, m.devices, m.device_memory_bytes};
    if (auto ok = s.placement->add_node(info); !ok) {
      spdlog::error("event=node_join_refused node={} address={} error=\"{}\"", m.node, m.address,
                    to_string(ok.error()));
      if (m.handle) self->send_exit(m.handle, to_caf(ok.error()));
      return;
    }
    spdlog::info("event=node_added node={} rack={} devices={} device_memory_bytes={} address={}", m.node, m.rack,
                 m.devices, m.device_memory_bytes, m.address.empty() ? "-" : m.address);
  }
  s.nodes[m.node] = m.handle;
  s.contacts[m.node] = {m.address, m.hub};
  self->monitor(m.handle);
  for (auto& [id, r] : s.replicas)
    if (r.node == m.node && !r.spawned) {
      self->send(m.handle, spawn_replica{r.spec});
      r.spawned = true;
    }
  for (const auto& agent : s.gateway_agents) self->send(agent, node_announce{m.node, m.address, m.hub});
  // A restarted node can take slots again (unless it is cordoned).
  for (auto& p : s.pending_migrations) std::erase(p.excluded, m.node);
  // Deployments of the config that waited for nodes may go now.
  std::size_t joined = 0;
  for (const auto& [id, h] : s.nodes) joined += h != nullptr;
  if (joined < s.config.deploy_after_nodes) return pump_migrations(self);
  auto waiting = std::move(s.awaiting_nodes);
  s.awaiting_nodes.clear();
  for (const auto& req : waiting)
    if (auto r = on_deploy(self, req); r.flag == caf::rt_error) s.awaiting_nodes.push_back(req);
  pump_migrations(self);
}

// A gateway joined: it gets the whole picture now and every change after.
void on_gateway_join(self_ptr self, const gateway_join& m) {
  auto& s = self->state;
  spdlog::info("event=gateway_joined gateways={}", s.gateway_agents.size() + 1);
  for (const auto& [name, dep] : s.deployments) self->send(m.router, announce(name, dep));
  for (const auto& [slot, epoch] : s.slot_epochs) self->send(m.router, fence_slot{slot.deployment, slot.index, epoch});
  for (const auto& [id, r] : s.replicas)
    if (r.handle)
      self->send(m.router, replica_event{r.id, r.deployment, r.slot, r.epoch, r.node, r.device,
                                         static_cast<std::uint8_t>(r.state), r.reason, r.handle});
  for (const auto& [node, health] : s.node_health)
    self->send(m.router, node_health_msg{node, static_cast<std::uint8_t>(health)});
  for (const auto& [node, c] : s.contacts)
    if (s.nodes[node]) self->send(m.agent, node_announce{node, c.address, c.hub});
  self->send(s.router, subscribe_msg{m.router});
  if (m.agent) {
    s.gateway_agents.push_back(m.agent);
    self->monitor(m.agent);
  }
}

}  // namespace

caf::behavior controller_actor(caf::stateful_actor<controller_state>* self, controller_config config,
                               caf::actor router, caf::actor health_monitor) {
  auto& st = self->state;
  st.config = std::move(config);
  st.router = std::move(router);
  st.health_monitor = std::move(health_monitor);
  auto placement = st.config.nodes.empty()
                       ? expected<cluster::cluster_state>(cluster::cluster_state::empty(st.config.device_reserved_bytes))
                       : cluster::cluster_state::create(st.config.nodes, st.config.device_reserved_bytes);
  if (!placement) {
    spdlog::error("event=controller_start_failed error=\"{}\"", to_string(placement.error()));
    self->quit(to_caf(placement.error()));
    return {};
  }
  st.placement.emplace(std::move(*placement));
  // A restarted controller rebuilds the deployments its predecessor held.
  std::map<std::string, api::deploy_request> desired;
  {
    std::lock_guard lock(st.config.desired->mutex);
    desired = st.config.desired->deployments;
  }
  for (const auto& [name, req] : desired)
    if (st.placement->nodes().empty()) {
      // The distributed controller starts before any node joined: deploy
      // when there is somewhere to place.
      st.awaiting_nodes.push_back(req);
    } else if (auto r = on_deploy(self, req); r.flag == caf::rt_error) {
      // Not startable (bad file, nothing fits): drop it, so requests waiting
      // for it fail now instead of at their deadline.
      spdlog::error("event=deploy_failed deployment={} error=\"{}\"", name, to_string(from_caf(r.err)));
      forget(self, name);
      self->send(st.router, deployment_removed{name});
    }
  self->set_down_handler([=](const caf::down_msg& dm) {
    auto& agents = self->state.gateway_agents;
    if (std::erase_if(agents, [&](const caf::actor& a) { return a.address() == dm.source; }) > 0) {
      spdlog::warn("event=gateway_lost gateways={} reason=\"{}\"", agents.size(), caf::to_string(dm.reason));
      return;
    }
    for (auto& [id, handle] : self->state.nodes)
      if (handle && handle.address() == dm.source) return on_node_down(self, id);
  });
  return {
      [=](const node_join& m) { on_node_join(self, m); },
      [=](const gateway_join& m) { on_gateway_join(self, m); },
      [=](const replica_event& ev) { on_replica_event(self, ev); },
      [=](const node_health_msg& m) { on_node_health(self, m); },
      [=](const retry_slot& m) {
        auto& s = self->state;
        // Only if nothing fills the slot by now.
        for (const auto& [id, r] : s.replicas)
          if (r.deployment == m.deployment && r.slot == m.slot) return;
        for (const auto& p : s.pending_migrations)
          if (p.deployment == m.deployment && p.slot == m.slot) return;
        s.slot_failures.erase({m.deployment, m.slot});
        replace_slot(self, m.deployment, m.slot, {});
      },
      [=](const device_fault& f) {
        // The node restarts the device, and its replicas with it; a device
        // that keeps failing ends in a crash loop and the slots move away.
        spdlog::warn("event=device_fault_reported node={} device={} reason=\"{}\"", f.node, f.device, f.reason);
      },
      [=](const get_node& m) -> caf::actor {
        auto it = self->state.nodes.find(m.node);
        return it == self->state.nodes.end() ? caf::actor{} : it->second;
      },
      [=](const deploy_msg& m) { return on_deploy(self, m.request); },
      [=](const undeploy_msg& m) -> caf::result<ok_atom> {
        auto& s = self->state;
        if (!s.deployments.count(m.name)) return to_caf({errc::not_found, "no deployment named '" + m.name + "'"});
        stop_slots(self, m.name, 0);
        s.deployments.erase(m.name);
        forget(self, m.name);
        self->send(s.router, deployment_removed{m.name});
        spdlog::info("event=undeployed deployment={}", m.name);
        return ok_atom::value;
      },
      [=](const scale_msg& m) -> caf::result<ok_atom> {
        auto& s = self->state;
        auto it = s.deployments.find(m.name);
        if (it == s.deployments.end()) return to_caf({errc::not_found, "no deployment named '" + m.name + "'"});
        if (m.replicas == 0 || m.replicas > max_replicas_per_deployment)
          return to_caf({errc::invalid_argument, "replicas must be in [1, " +
                                                     std::to_string(max_replicas_per_deployment) + "]; use undeploy to remove"});
        const std::uint32_t old = it->second.spec.replicas;
        it->second.spec.replicas = m.replicas;
        {
          std::lock_guard lock(s.config.desired->mutex);
          auto d = s.config.desired->deployments.find(m.name);
          if (d != s.config.desired->deployments.end()) d->second.replicas = m.replicas;
        }
        if (m.replicas < old) stop_slots(self, m.name, m.replicas);
        std::string why;
        if (m.replicas > old && place_missing(self, m.name, &why) > 0)
          spdlog::warn("event=scale_partial deployment={} wanted={} reason=\"{}\"", m.name, m.replicas, why);
        spdlog::info("event=scaled deployment={} from={} to={}", m.name, old, m.replicas);
        return ok_atom::value;
      },
      [=](models_atom) { return models_reply{list_models(self)}; },
      [=](ready_atom) {
        for (const auto& [name, dep] : self->state.deployments) {
          bool any = false;
          for (const auto& [id, r] : self->state.replicas) any |= r.deployment == name && cluster::accepts_requests(r.state);
          if (!any) return false;
        }
        return true;
      },
      [=](status_atom) {
        auto& s = self->state;
        api::cluster_status status;
        for (const auto& n : s.placement->nodes()) {
          const bool up = s.nodes.count(n.id) && s.nodes[n.id];
          const auto h = s.node_health.count(n.id) ? s.node_health[n.id] : cluster::node_health::healthy;
          const auto contact = s.contacts.find(n.id);
          status.nodes.push_back({n.id, n.rack, !up ? "down" : std::string(cluster::to_string(h)),
                                  contact == s.contacts.end() ? "" : contact->second.address});
          for (std::uint32_t d = 0; d < n.devices; ++d) {
            const auto* l = s.placement->ledger({n.id, d});
            status.devices.push_back({n.id, d, "cpu", l ? l->capacity_bytes() : 0, l ? l->used_bytes() : 0});
          }
        }
        for (const auto& [id, r] : s.replicas) {
          api::replica_status rs;
          rs.id = std::to_string(id);
          rs.deployment = r.deployment;
          rs.slot = r.slot;
          rs.epoch = r.epoch;
          rs.state = std::string(cluster::to_string(r.state));
          rs.node = r.node;
          rs.device = r.device;
          status.replicas.push_back(std::move(rs));
        }
        status.models = list_models(self);
        return status_reply{std::move(status)};
      },
  };
}

}  // namespace exa::actors
