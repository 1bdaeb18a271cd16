#include "actors/node_actor.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/system_messages.hpp>
#include <caf/stateful_actor.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "actors/cluster_metrics.hpp"
#include "actors/model_cache_actor.hpp"
#include "actors/replica_actor.hpp"
#include "cluster/lifecycle.hpp"
#include "gpu/device_select.hpp"

namespace exa::actors {
namespace {

using self_ptr = caf::stateful_actor<node_state>*;

std::string device_name(std::uint32_t i) { return "device-" + std::to_string(i); }

caf::actor spawn_replica_actor(self_ptr self, const replica_spec& spec) {
  auto& st = self->state;
  replica_context rc;
  rc.spec = spec;
  if (!st.ctx.config.engine.empty()) rc.spec.engine = st.ctx.config.engine;
  rc.node = st.ctx.config.id;
  for (const auto d : devices_of(spec)) rc.devices.push_back(st.sup->child(device_name(d)));
  rc.device = rc.devices.front();
  rc.model_cache = st.sup->child("model-cache");
  rc.controller = st.ctx.controller;
  rc.router = st.ctx.router;
  rc.step_timeout_ms = st.ctx.config.replica_step_timeout_ms;
  rc.step_stop = st.ctx.config.replica_step_stop;
  rc.hooks = st.ctx.config.hooks;
  rc.lease_until = st.lease_until;
  rc.metrics = st.ctx.config.metrics;
  rc.degradation = st.ctx.config.degradation;
  auto handle = self->spawn(replica_actor, std::move(rc));
  self->link_to(handle);
  return handle;
}

// The node speaks for a replica that died, since a killed actor reports
// nothing: `failed` when it gives the slot up, `creating` for a restart.
void report(self_ptr self, const replica_spec& spec, cluster::replica_state state, const std::string& reason,
            const caf::actor& handle = {}) {
  auto& st = self->state;
  const replica_event ev{spec.id, spec.deployment, spec.slot, spec.epoch, st.ctx.config.id, spec.device,
                         static_cast<std::uint8_t>(state), reason, handle};
  control_send(self, st.ctx.config.hooks, st.ctx.config.id, cluster::message_class::control, st.ctx.controller, ev);
  control_send(self, st.ctx.config.hooks, st.ctx.config.id, cluster::message_class::control, st.ctx.router, ev);
  cluster::event e;
  e.kind = cluster::event_kind::replica_state;
  e.replica = spec.id;
  e.deployment = spec.deployment;
  e.slot = spec.slot;
  e.epoch = spec.epoch;
  e.node = st.ctx.config.id;
  e.detail = std::string(cluster::to_string(state));
  log_event(self, st.ctx.config.hooks, e);
}

// Asks every device whether it is well; an unanswered check means a hung
// device: report it and restart the device (its replicas follow).
void check_devices(self_ptr self) {
  auto& st = self->state;
  for (std::uint32_t i = 0; i < st.ctx.config.devices; ++i) {
    auto dev = st.sup->child(device_name(i));
    if (!dev) continue;
    self->request(dev, std::chrono::milliseconds(st.ctx.config.device_check_timeout_ms), check_atom::value)
        .then([](ok_atom) {},
              [=](const caf::error& err) {
                auto& s = self->state;
                // A check of a device restarted since (an earlier check found
                // it): that fault is reported already, and the new device is
                // checked on its own.
                if (s.sup->child(device_name(i)) != dev) return;
                const std::string why = "device check failed: " + caf::to_string(err);
                spdlog::error("event=device_fault node={} device={} reason=\"{}\"", s.ctx.config.id, i, why);
                cluster::event e;
                e.kind = cluster::event_kind::fault_detected;
                e.node = s.ctx.config.id;
                e.device = i;
                e.detail = "device_check";
                log_event(self, s.ctx.config.hooks, e);
                self->send(s.ctx.controller, device_fault{s.ctx.config.id, i, why});
                caf::anon_send<caf::message_priority::high>(
                    dev, caf::exit_msg{caf::actor_addr{}, caf::make_error(caf::sec::runtime_error, why)});
              });
  }
}

void report_failed(self_ptr self, const replica_spec& spec, const std::string& reason) {
  report(self, spec, cluster::replica_state::failed, reason);
}

void on_replica_exit(self_ptr self, std::map<cluster::replica_id, node_state::replica_entry>::iterator it,
                     const caf::error& reason) {
  auto& st = self->state;
  auto& entry = it->second;
  const bool normal = !reason || reason == caf::exit_reason::normal;
  if (normal || st.powered_off) {  // stopped, drained or fenced on purpose; or nobody is left to restart it
    st.replicas.erase(it);
    return;
  }
  cluster::event detected;
  detected.kind = cluster::event_kind::fault_detected;
  detected.node = st.ctx.config.id;
  detected.replica = entry.spec.id;
  detected.detail = "monitor";
  log_event(self, st.ctx.config.hooks, detected);
  if (entry.stopping) {  // it was on its way out (drained, scaled away): not restarted
    report_failed(self, entry.spec, "crashed while stopping: " + caf::to_string(reason));
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

// Heard nothing back for the lease: this node is (about to be) declared
// failed and its slots placed elsewhere. Its replicas stop serving first.
void check_lease(self_ptr self) {
  auto& st = self->state;
  const auto lease_ns = std::int64_t{st.ctx.config.lease_ms} * 1000000;
  if (lease_ns == 0 || st.self_fenced || st.lease_held || clock_ns(self) - st.last_ack_ns < lease_ns) return;
  st.self_fenced = true;
  spdlog::error("event=node_self_fenced node={} replicas={} silent_ms={}", st.ctx.config.id, st.replicas.size(),
                (clock_ns(self) - st.last_ack_ns) / 1000000);
  cluster::event e;
  e.kind = cluster::event_kind::node_state;
  e.node = st.ctx.config.id;
  e.detail = "self_fenced";
  log_event(self, st.ctx.config.hooks, e);
  for (auto& [id, r] : st.replicas)
    if (r.handle) self->send(r.handle, self_fence_atom::value);
}

// Tells the replicas until when they may serve (see node_state::lease_until).
void publish_lease(self_ptr self) {
  auto& st = self->state;
  const auto lease_ns = std::int64_t{st.ctx.config.lease_ms} * 1000000;
  const bool unbounded = lease_ns == 0 || st.lease_held;
  st.lease_until->store(unbounded ? std::numeric_limits<std::int64_t>::max() : st.last_ack_ns + lease_ns);
}

// Joins the controller (again): what runs here, and what the model cache
// holds, asked first (bounded: a cache busy with a long fetch must not hold
// the join up; then what it said last time is announced).
void send_join(self_ptr self, bool rejoin) {
  const auto join = [=](const std::vector<cluster::cached_file>& files) {
    auto& st = self->state;
    const auto& cfg = st.ctx.config;
    node_join m{cfg.id, cfg.rack, cfg.devices, cfg.device.memory_bytes, cfg.address,
                caf::actor_cast<caf::actor>(self), st.ctx.router, {}, cfg.region, files};
    m.cached.insert(m.cached.end(), cfg.simulated_cache.begin(), cfg.simulated_cache.end());
    m.device_kind = std::string(gpu::to_string(cfg.device_kind));
    if (rejoin)
      for (const auto& [id, r] : st.replicas)
        if (r.handle) m.replicas.push_back({r.spec, r.handle});
    self->send(st.ctx.controller, m);
    spdlog::info("event=node_{} node={} replicas={} cached_files={}", rejoin ? "rejoining" : "joining", cfg.id,
                 m.replicas.size(), m.cached.size());
  };
  auto cache = self->state.sup->child("model-cache");
  if (!cache) return join(self->state.cache_files);
  self->request(cache, std::chrono::milliseconds(1000), cache_contents_atom::value)
      .then(
          [=](const cached_files_msg& c) {
            self->state.cache_files = c.files;
            join(c.files);
          },
          [=](const caf::error& err) {
            spdlog::warn("event=node_cache_list_failed node={} error=\"{}\"", self->state.ctx.config.id,
                         caf::to_string(err));
            join(self->state.cache_files);
          });
}

// The controller's process is gone or back (our uplink says which).
void on_control_plane_change(self_ptr self, const control_plane_state& m);
void on_control_plane(self_ptr self, const control_plane_state& m) {
  on_control_plane_change(self, m);
  publish_lease(self);
}

void on_control_plane_change(self_ptr self, const control_plane_state& m) {
  auto& st = self->state;
  const auto lease_ns = std::int64_t{st.ctx.config.lease_ms} * 1000000;
  if (!m.reachable && !m.hold_allowed) {
    if (st.lease_held) {
      st.lease_held = false;
      st.last_ack_ns = clock_ns(self);  // a fresh lease from now, then fence
      spdlog::warn("event=node_lease_released node={} detail=\"a controller may be up but unreachable\"",
                   st.ctx.config.id);
    }
    check_lease(self);
    return;
  }
  if (!m.reachable) {
    // Hold the lease only if it was still good: a node that was frozen or cut
    // off past it has had its slots given away, and fences itself as usual.
    st.lease_held = lease_ns > 0 && clock_ns(self) - st.last_ack_ns < lease_ns;
    spdlog::warn("event=node_lease_{} node={} replicas={}", st.lease_held ? "held" : "not_held", st.ctx.config.id,
                 st.replicas.size());
    check_lease(self);
    return;
  }
  st.lease_held = false;
  st.last_ack_ns = clock_ns(self);
  // Join again, saying what runs here: the controller adopts what it still
  // wants and stops the rest.
  send_join(self, true);
}

// Device i: the one opened for it before the node started, or a fresh one.
gpu::device_opener device_opener(const node_config& cfg, std::uint32_t i) {
  if (i < cfg.opened_devices.size()) return gpu::reuse(cfg.opened_devices[i]);
  const auto kind = cfg.device_kind;
  const auto options = device_options_of(cfg.device);
  return [kind, i, options] { return gpu::open_device(kind, i, options); };
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
    dc.hooks = cfg.hooks;
    dc.metrics = cfg.metrics;
    if (!dc.sim) dc.open = device_opener(cfg, i);
    // Not detached: steps run on the device's executor, never on this
    // actor's thread, so a device actor is as cheap as any other.
    st.sup->add_child({device_name(i),
                       [dc](caf::scheduled_actor* parent) { return parent->spawn(device_actor, dc); },
                       restart_policy::permanent});
  }
  const auto node = cfg.id;
  const model_cache_config cache{cfg.model_cache_bytes, cfg.model_dir, cfg.model_store, cfg.model_cache_dir,
                                 st.ctx.controller};
  st.sup->add_child({"model-cache",
                     [node, cache](caf::scheduled_actor* parent) {
                       return parent->spawn(model_cache_actor, node, cache);
                     },
                     restart_policy::permanent});
}

// Writes the clock offset to the event log when it moved by a millisecond or
// more: merged logs of several hosts are ordered by corrected times.
void log_clock_offset(self_ptr self) {
  auto& st = self->state;
  const auto offset = st.clock.node_minus_monitor_ns();
  if (!offset || (st.logged_offset_ns && std::llabs(*offset - *st.logged_offset_ns) < 1000000)) return;
  st.logged_offset_ns = offset;
  cluster::event e;
  e.kind = cluster::event_kind::clock_offset;
  e.node = st.ctx.config.id;
  e.value_ms = static_cast<double>(*offset) / 1e6;
  e.value2_ms = static_cast<double>(st.clock.rtt_ns().value_or(0)) / 1e6;
  log_event(self, st.ctx.config.hooks, e);
}

}  // namespace

caf::behavior node_actor(caf::stateful_actor<node_state>* self, node_context ctx) {
  self->state.ctx = std::move(ctx);
  self->state.last_ack_ns = clock_ns(self);
  publish_lease(self);
  start_children(self);
  send_join(self, false);
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
  if (self->state.ctx.config.device_check_interval_ms > 0)
    self->delayed_send(self, std::chrono::milliseconds(self->state.ctx.config.device_check_interval_ms),
                       check_atom::value);
  spdlog::info("event=node_started node={} rack={} devices={}", self->state.ctx.config.id,
               self->state.ctx.config.rack, self->state.ctx.config.devices);
  return {
      [=](check_atom) {
        check_devices(self);
        self->delayed_send(self, std::chrono::milliseconds(self->state.ctx.config.device_check_interval_ms),
                           check_atom::value);
      },
      [=](const inject_fault& f) {
        auto& st = self->state;
        if (f.kind == "fail") {
          auto d = st.sup->child(device_name(f.device));
          spdlog::warn("event=chaos_fail_device node={} device={}", st.ctx.config.id, f.device);
          if (d)
            caf::anon_send<caf::message_priority::high>(
                d, caf::exit_msg{caf::actor_addr{}, caf::make_error(caf::sec::runtime_error, "device failed (injected)")});
        } else if (f.kind == "hang" || f.kind == "slow") {
          if (auto d = st.sup->child(device_name(f.device))) self->send(d, f);
        } else if (f.kind == "power_off") {
          // The host is gone: its replicas end with their streams, nothing
          // restarts them, and no heartbeat leaves. Only the control plane's
          // own detection (missed heartbeats) can find out.
          spdlog::warn("event=chaos_power_off node={} replicas={}", st.ctx.config.id, st.replicas.size());
          st.powered_off = true;
          for (auto& [id, r] : st.replicas)
            if (r.handle) self->send(r.handle, self_fence_atom::value);
        } else if (f.kind == "slow_load") {
          if (auto c = st.sup->child("model-cache")) self->send(c, f);
        }
      },
      [=](const fence_notice& n) {
        // Replicas of slots that moved on while we were cut off stop now.
        for (auto& [id, r] : self->state.replicas)
          for (const auto& f : n.slots)
            if (r.handle && f.deployment == r.spec.deployment && f.slot == r.spec.slot && f.epoch > r.spec.epoch)
              self->send(r.handle, n);
      },
      [=](const control_plane_state& m) { on_control_plane(self, m); },
      [=](const heartbeat_ack& ack) {
        auto& st = self->state;
        st.last_ack_ns = clock_ns(self);
        if (ack.heartbeat_wall_ns != 0)
          st.clock.add(ack.heartbeat_wall_ns, ack.monitor_wall_ns,
                       wall_clock_ns(self, st.ctx.config.wall_clock_from_actor_clock));
        log_clock_offset(self);
        publish_lease(self);
        if (st.self_fenced) {
          st.self_fenced = false;
          spdlog::info("event=node_unfenced node={}", st.ctx.config.id);
        }
      },
      [=](tick_atom) {
        auto& st = self->state;
        if (st.powered_off) return;  // silent from now on
        check_lease(self);
        heartbeat hb{st.ctx.config.id, ++st.heartbeat_sequence,
                     wall_clock_ns(self, st.ctx.config.wall_clock_from_actor_clock)};
        if (auto offset = st.clock.node_minus_monitor_ns()) {
          hb.has_offset = true;
          hb.clock_offset_ns = *offset;
          hb.clock_rtt_ns = st.clock.rtt_ns().value_or(0);
        }
        control_send(self, st.ctx.config.hooks, st.ctx.config.id, cluster::message_class::heartbeat,
                     st.ctx.health_monitor, hb);
        self->delayed_send(self, std::chrono::milliseconds(st.ctx.config.heartbeat_interval_ms), tick_atom::value);
      },
      [=](const spawn_replica& m) {
        auto& st = self->state;
        if (st.powered_off) return;  // nobody home
        const auto devices = devices_of(m.spec);
        const bool fits = std::all_of(devices.begin(), devices.end(),
                                      [&](std::uint32_t d) { return d < st.ctx.config.devices; }) &&
                          !devices.empty() && devices.front() == m.spec.device;
        if (!fits || st.replicas.count(m.spec.id)) {
          std::string names;
          for (const auto d : devices) names += (names.empty() ? "" : ",") + std::to_string(d);
          report_failed(self, m.spec, "node " + std::to_string(st.ctx.config.id) + " cannot host it on device(s) " +
                                          names + " (it has " + std::to_string(st.ctx.config.devices) + ")");
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
      [=](const node_leaving& m) {
        // No controller to tell (see the uplink): drain every replica here.
        auto& st = self->state;
        spdlog::warn("event=node_draining_alone node={} replicas={} deadline_ms={} detail=\"no controller reachable: "
                     "in-flight requests finish, nothing is placed elsewhere\"",
                     st.ctx.config.id, st.replicas.size(), m.deadline_ms);
        for (auto& [id, r] : st.replicas)
          if (r.handle) {
            r.stopping = true;
            self->send(r.handle, stop_replica{id, true, m.deadline_ms});
          }
      },
      [=](const stop_replica& m) {
        auto it = self->state.replicas.find(m.id);
        const bool here = it != self->state.replicas.end() && it->second.handle;
        spdlog::info("event=replica_stop_requested node={} replica={} drain={} running={}", self->state.ctx.config.id,
                     m.id, m.drain, here);
        if (here) {
          it->second.stopping = true;
          self->send(it->second.handle, m);
        }
      },
  };
}

}  // namespace exa::actors
