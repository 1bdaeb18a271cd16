#include "actors/health_monitor_actor.hpp"

#include <caf/actor_registry.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdlib>

#include "actors/cluster_metrics.hpp"
#include "actors/cluster_supervisor.hpp"
#include "cluster/clock_offset.hpp"

namespace exa::actors {
namespace {

using self_ptr = caf::stateful_actor<health_monitor_state>*;
using cluster::node_health;

// Watched nodes by health, for the exaserve_nodes gauge.
void update_node_gauge(self_ptr self) {
  auto& st = self->state;
  if (!st.config.metrics) return;
  for (const auto& [health, n] : st.detector->counts())
    cluster_metrics::series(st.config.metrics->nodes, cluster::to_string(health))->set(static_cast<double>(n));
}

// Every silent interval once, long before a node turns suspect: a flaky
// link shows as a rising misses rate while the node stays healthy.
void count_misses(self_ptr self) {
  auto& st = self->state;
  const auto misses = st.detector->take_misses(clock_ns(self));
  if (!st.config.metrics) return;
  for (const auto& [node, n] : misses)
    cluster_metrics::series(st.config.metrics->heartbeat_misses, std::to_string(node))->inc(n);
}

void announce(self_ptr self, const cluster::health_change& c) {
  auto& st = self->state;
  if (st.config.metrics) cluster_metrics::series(st.config.metrics->node_health_changes, cluster::to_string(c.to))->inc();
  const auto level = c.to == node_health::healthy ? spdlog::level::info : spdlog::level::warn;
  spdlog::log(level, "event=node_health node={} from={} to={} last_heard_ms_ago={}", c.node, cluster::to_string(c.from),
              cluster::to_string(c.to), (c.at_ns - st.detector->last_heard_ns(c.node)) / 1000000);
  cluster::event e;
  e.kind = cluster::event_kind::node_state;
  e.node = c.node;
  e.detail = std::string(cluster::to_string(c.to));
  log_event(self, st.config.hooks, e);
  if (c.to != node_health::healthy) {
    e.kind = cluster::event_kind::fault_detected;
    e.detail = c.to == node_health::suspect ? "heartbeat_suspect" : "heartbeat_confirmed";
    log_event(self, st.config.hooks, e);
  }
  // The router and controller may have restarted: look them up each time.
  const node_health_msg msg{c.node, static_cast<std::uint8_t>(c.to)};
  auto& reg = self->home_system().registry();
  if (auto r = caf::actor_cast<caf::actor>(reg.get(router_atom::value))) self->send(r, msg);
  if (auto r = caf::actor_cast<caf::actor>(reg.get(controller_atom::value))) self->send(r, msg);
}

// A node reported its clock offset: warn once when it is skewed past the
// threshold (merged logs would read out of order), and keep the controller's
// status current when it moved by a millisecond or more.
void on_clock(self_ptr self, const heartbeat& hb) {
  auto& st = self->state;
  auto& view = st.clocks[hb.node];
  const bool skewed = cluster::clock_skewed(hb.clock_offset_ns, st.config.clock_skew_warn_ms);
  if (skewed != view.skewed) {
    view.skewed = skewed;
    spdlog::log(skewed ? spdlog::level::warn : spdlog::level::info,
                "event=node_clock_{} node={} offset_ms={:.1f} rtt_ms={:.2f} threshold_ms={}",
                skewed ? "skewed" : "in_step", hb.node, hb.clock_offset_ns / 1e6, hb.clock_rtt_ns / 1e6,
                st.config.clock_skew_warn_ms);
  }
  if (std::llabs(hb.clock_offset_ns - view.reported_ns) < 1000000) return;
  view.reported_ns = hb.clock_offset_ns;
  if (auto c = caf::actor_cast<caf::actor>(self->home_system().registry().get(controller_atom::value)))
    self->send(c, node_clock_msg{hb.node, hb.clock_offset_ns, hb.clock_rtt_ns});
}

}  // namespace

caf::behavior health_monitor_actor(caf::stateful_actor<health_monitor_state>* self, health_config config) {
  auto& st = self->state;
  st.config = std::move(config);
  st.detector.emplace(cluster::detector_config{std::chrono::milliseconds(st.config.heartbeat_interval_ms),
                                               st.config.suspect_after_missed,
                                               std::chrono::milliseconds(st.config.observation_window_ms)});
  for (const auto n : st.config.nodes) st.detector->watch(n, clock_ns(self));
  // Evaluate silence twice per interval: detection within half an interval
  // of k × interval.
  const auto period = std::chrono::milliseconds(std::max(1u, st.config.heartbeat_interval_ms / 2));
  self->delayed_send(self, period, tick_atom::value);
  return {
      [=](const heartbeat& hb) {
        if (auto change = self->state.detector->heartbeat(hb.node, clock_ns(self))) announce(self, *change);
        // The ack travels the node's channel too: a partition silences both.
        control_send(self, self->state.config.hooks, hb.node, cluster::message_class::heartbeat,
                     caf::actor_cast<caf::actor>(self->current_sender()),
                     heartbeat_ack{hb.node, hb.sequence, hb.wall_ns,
                                   wall_clock_ns(self, self->state.config.wall_clock_from_actor_clock)});
        if (hb.has_offset) on_clock(self, hb);
      },
      [=](tick_atom) {
        for (const auto& change : self->state.detector->tick(clock_ns(self))) announce(self, change);
        count_misses(self);
        update_node_gauge(self);
        self->delayed_send(self, period, tick_atom::value);
      },
      [=](nodes_atom) {
        std::vector<std::pair<cluster::node_id, std::uint8_t>> out;
        for (const auto n : self->state.config.nodes)
          out.emplace_back(n, static_cast<std::uint8_t>(self->state.detector->health(n)));
        return out;
      },
  };
}

}  // namespace exa::actors
