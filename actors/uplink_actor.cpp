#include "actors/uplink_actor.hpp"

#include <caf/actor_registry.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/middleman_actor.hpp>
#include <caf/message_view.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <spdlog/spdlog.h>

#include <set>

#include "actors/cluster_supervisor.hpp"
#include "actors/transport.hpp"
#include "actors/node_actor.hpp"

namespace exa::actors {
namespace {

using self_ptr = caf::stateful_actor<uplink_state>*;
using reconnect_atom = caf::atom_constant<caf::atom("reconnect")>;

caf::actor sender_or_self(self_ptr self) {
  auto s = caf::actor_cast<caf::actor>(self->current_sender());
  return s ? s : caf::actor_cast<caf::actor>(self);
}

void adopt(self_ptr self, const welcome_msg& w) {
  auto& st = self->state;
  st.controller = w.controller;
  st.health_monitor = w.health_monitor;
  st.backoff_ms = 0;
  self->monitor(st.controller);
  self->monitor(st.health_monitor);
  if (st.config.gateway.router) {
    // The bridge asks whatever controller the registry names.
    register_as(self->home_system(), controller_atom::value, st.controller);
  }
}

void schedule_reconnect(self_ptr self) {
  auto& st = self->state;
  st.backoff_ms = st.backoff_ms == 0 ? st.config.retry_min_ms : std::min(st.backoff_ms * 2, st.config.retry_max_ms);
  self->delayed_send(self, std::chrono::milliseconds(st.backoff_ms), reconnect_atom::value);
}

void on_lost(self_ptr self, const caf::error& reason) {
  auto& st = self->state;
  if (!st.controller && !st.health_monitor) return;  // already handled (both go at once)
  spdlog::warn("event=control_plane_lost role={} node={} reason=\"{}\" detail=\"serving on; reconnecting\"",
               st.config.hello.who.role, st.config.hello.node, caf::to_string(reason));
  st.controller = nullptr;
  st.health_monitor = nullptr;
  if (st.config.gateway.router) self->home_system().registry().erase(controller_atom::value);
  if (st.node) self->send(st.node, control_plane_state{false});
  schedule_reconnect(self);
}

void reconnect(self_ptr self) {
  auto& st = self->state;
  if (st.controller || st.connecting) return;
  st.connecting = true;
  const auto timeout = std::chrono::milliseconds(st.config.request_timeout_ms);
  self->request(connector(self->home_system()), timeout, caf::connect_atom::value, st.config.host, st.config.port)
      .then(
          [=](const caf::node_id&, const caf::strong_actor_ptr& dir, const std::set<std::string>&) {
            self->request(caf::actor_cast<caf::actor>(dir), timeout, self->state.config.hello)
                .then(
                    [=](const welcome_msg& w) {
                      auto& s = self->state;
                      s.connecting = false;
                      adopt(self, w);
                      spdlog::info("event=control_plane_rejoined role={} node={}", s.config.hello.who.role,
                                   s.config.hello.node);
                      if (s.config.gateway.router) self->send(s.controller, s.config.gateway);
                      if (s.node) self->send(s.node, control_plane_state{true});
                    },
                    [=](const caf::error& e) {
                      self->state.connecting = false;
                      if (self->state.node) self->send(self->state.node, control_plane_state{false, false});
                      spdlog::warn("event=rejoin_refused role={} error=\"{}\"", self->state.config.hello.who.role,
                                   to_string(from_caf(e)));
                      schedule_reconnect(self);
                    });
          },
          [=](const caf::error& e) {
            auto& s = self->state;
            s.connecting = false;
            // Refused: no controller is listening. Timed out: one may be up
            // behind a partition, and the node must not hold its lease.
            if (s.node && e == caf::sec::request_timeout) self->send(s.node, control_plane_state{false, false});
            schedule_reconnect(self);
          });
}

}  // namespace

caf::behavior uplink_actor(caf::stateful_actor<uplink_state>* self, uplink_config config, welcome_msg first) {
  self->state.config = std::move(config);
  adopt(self, first);
  self->set_down_handler([=](const caf::down_msg& dm) {
    auto& st = self->state;
    if (dm.source == st.controller.address() || dm.source == st.health_monitor.address()) on_lost(self, dm.reason);
  });
  // Everything else is for the controller (replica events, device faults).
  self->set_default_handler([=](caf::scheduled_actor*, caf::message_view& x) -> caf::result<caf::message> {
    auto& st = self->state;
    if (st.controller) caf::send_as(sender_or_self(self), st.controller, x.copy_content_to_message());
    else ++st.dropped;
    return caf::message{};
  });
  return {
      [=](const heartbeat& hb) {
        auto& st = self->state;
        if (st.health_monitor) caf::send_as(sender_or_self(self), st.health_monitor, hb);
      },
      [=](const node_join& m) {
        auto& st = self->state;
        st.node = m.handle;
        if (st.controller) caf::send_as(sender_or_self(self), st.controller, m);
      },
      [=](reconnect_atom) { reconnect(self); },
      [=](const node_leaving& m) {
        // The node's process is stopping. With a controller, it moves the
        // slots and drains the replicas; without one, nobody can move them,
        // so the node drains its replicas itself (what is in flight finishes).
        auto& st = self->state;
        if (st.controller) caf::send_as(sender_or_self(self), st.controller, m);
        else if (st.node) self->send(st.node, m);
      },
  };
}

}  // namespace exa::actors
