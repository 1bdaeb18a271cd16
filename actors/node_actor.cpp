#include "actors/node_actor.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/system_messages.hpp>
#include <caf/stateful_actor.hpp>
#include <spdlog/spdlog.h>

#include "actors/cluster_metrics.hpp"
#include "actors/model_cache_actor.hpp"
#include "actors/replica_actor.hpp"
#include "cluster/lifecycle.hpp"

namespace exa::actors {
namespace {

using self_ptr = caf::stateful_actor<node_state>*;

std::string device_name(std::uint32_t i) { return "device-" + std::to_string(i); }

caf::actor spawn_replica_actor(self_ptr self, const replica_spec& spec) {
  auto& st = self->state;
  replica_context rc;
  rc.spec = spec;
  rc.node = st.ctx.config.id;
  rc.device = st.sup->child(device_name(spec.device));
  rc.model_cache = st.sup->child("model-cache");
  rc.controller = st.ctx.controller;
  rc.router = st.ctx.router;
  rc.step_timeout_ms = st.ctx.config.replica_step_timeout_ms;
  auto handle = self->spawn(replica_actor, std::move(rc));
  self->link_to(handle);
  return handle;
}

// The node speaks for a replica that died, since a killed actor reports
// nothing: `failed` when it gives the slot up, `creating` for a restart.
void report(self_ptr self, const replica_spec& spec, cluster::replica_state state, const std::string& reason,
            const caf::actor& handle = {}) {
  const replica_event ev{spec.id, spec.deployment, spec.slot, spec.epoch, self->state.ctx.config.id, spec.device,
                         static_cast<std::uint8_t>(state), reason, handle};
  self->send(self->state.ctx.controller, ev);
  self->send(self->state.ctx.router, ev);
}

void report_failed(self_ptr self, const replica_spec& spec, const std::string& reason) {
  report(self, spec, cluster::replica_state::failed, reason);
}

void on_replica_exit(self_ptr self, std::map<cluster::replica_id, node_state::replica_entry>::iterator it,
                     const caf::error& reason) {
  auto& st = self->state;
  auto& entry = it->second;
  const bool normal = !reason || reason == caf::exit_reason::normal;
  if (normal) {  // stopped or drained on purpose
    st.replicas.erase(it);
    return;
  }
  const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(self->clock().now().time_since_epoch());
  if (!entry.intensity.allow(now)) {
    spdlog::error("event=replica_quarantined node={} replica={} deployment={} slot={} restarts={} reason=\"{}\"",
                  st.ctx.config.id, entry.spec.id, entry.spec.deployment, entry.spec.slot,
                  entry.intensity.max_restarts(), caf::to_string(reason));
    report_failed(self, entry.spec, "crash loop: quarantined on node " + std::to_string(st.ctx.config.id) +
                                        " after " + std::to_string(entry.intensity.max_restarts()) + " restarts");
    st.replicas.erase(it);
    return;
  }
  ++st.replica_restarts;
  if (st.ctx.config.metrics)
    cluster_metrics::series(st.ctx.config.metrics->replica_restarts, std::to_string(st.ctx.config.id))->inc();
  spdlog::warn("event=child_restart supervisor=node-{} child=replica-{} reason=\"{}\"", st.ctx.config.id,
               entry.spec.id, caf::to_string(reason));
  entry.handle = spawn_replica_actor(self, entry.spec);
  report(self, entry.spec, cluster::replica_state::creating, "restarted after crash: " + caf::to_string(reason),
         entry.handle);
}

void start_children(self_ptr self) {
  auto& st = self->state;
  const auto& cfg = st.ctx.config;
  st.sup.emplace(self, "node-" + std::to_string(cfg.id), supervision_strategy::one_for_one, 5,
                 std::chrono::seconds(60));
  for (std::uint32_t i = 0; i < cfg.devices; ++i) {
    device_config dc = cfg.device;
    dc.node = cfg.id;
    dc.index = i;
    const bool detached = cfg.detached_devices;
    st.sup->add_child({device_name(i),
                       [dc, detached](caf::scheduled_actor* parent) {
                         return detached ? parent->spawn<caf::detached>(device_actor, dc)
                                         : parent->spawn(device_actor, dc);
                       },
                       restart_policy::permanent});
  }
  const auto node = cfg.id;
  const auto capacity = cfg.model_cache_capacity;
  st.sup->add_child({"model-cache",
                     [node, capacity](caf::scheduled_actor* parent) {
                       return parent->spawn(model_cache_actor, node, capacity);
                     },
                     restart_policy::permanent});
}

}  // namespace

caf::behavior node_actor(caf::stateful_actor<node_state>* self, node_context ctx) {
  self->state.ctx = std::move(ctx);
  start_children(self);
  self->set_exit_handler([=](const caf::exit_msg& msg) {
    auto& st = self->state;
    if (st.sup->on_exit(msg)) return;
    for (auto it = st.replicas.begin(); it != st.replicas.end(); ++it)
      if (it->second.handle && it->second.handle.address() == msg.source) return on_replica_exit(self, it, msg.reason);
    // Not a child: our supervisor (or the system) is shutting us down.
    st.sup->shutdown();
    for (auto& [id, r] : st.replicas)
      if (r.handle) self->send_exit(r.handle, msg.reason);
    self->quit(msg.reason);
  });
  if (self->state.ctx.health_monitor) self->send(self, tick_atom::value);
  spdlog::info("event=node_started node={} rack={} devices={}", self->state.ctx.config.id,
               self->state.ctx.config.rack, self->state.ctx.config.devices);
  return {
      [=](tick_atom) {
        auto& st = self->state;
        self->send(st.ctx.health_monitor, heartbeat{st.ctx.config.id, ++st.heartbeat_sequence});
        self->delayed_send(self, std::chrono::milliseconds(st.ctx.config.heartbeat_interval_ms), tick_atom::value);
      },
      [=](const spawn_replica& m) {
        auto& st = self->state;
        if (m.spec.device >= st.ctx.config.devices || st.replicas.count(m.spec.id)) {
          report_failed(self, m.spec, "node " + std::to_string(st.ctx.config.id) + " cannot host it on device " +
                                          std::to_string(m.spec.device));
          return;
        }
        node_state::replica_entry e{m.spec, caf::actor{},
                                    cluster::restart_intensity(st.ctx.config.replica_max_restarts,
                                                               std::chrono::milliseconds(
                                                                   st.ctx.config.replica_restart_window_ms))};
        e.handle = spawn_replica_actor(self, m.spec);
        st.replicas.emplace(m.spec.id, std::move(e));
      },
      [=](const kill_replica& m) {
        auto it = self->state.replicas.find(m.id);
        if (it == self->state.replicas.end() || !it->second.handle) return;
        spdlog::warn("event=chaos_kill_replica node={} replica={}", self->state.ctx.config.id, m.id);
        // Not exit_reason::kill: that one cannot be trapped, so it would travel
        // up the links and take this node (and its supervisor) down too. And
        // anonymously: an exit from a link partner unlinks it, so the node
        // would never hear of the death it caused.
        caf::anon_send<caf::message_priority::high>(
            it->second.handle,
            caf::exit_msg{caf::actor_addr{}, caf::make_error(caf::sec::runtime_error, "killed by fault injection")});
      },
      [=](const stop_replica& m) {
        auto it = self->state.replicas.find(m.id);
        if (it != self->state.replicas.end() && it->second.handle) self->send(it->second.handle, m);
      },
  };
}

}  // namespace exa::actors
