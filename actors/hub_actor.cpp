#include "actors/hub_actor.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/message_view.hpp>
#include <caf/stateful_actor.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "actors/messages.hpp"
#include "cluster/lifecycle.hpp"

namespace exa::actors {

caf::behavior hub_actor(caf::stateful_actor<hub_state>* self) {
  self->set_down_handler([=](const caf::down_msg& dm) {
    auto& subs = self->state.subscribers;
    std::erase_if(subs, [&](const caf::actor& a) { return a.address() == dm.source; });
    spdlog::info("event=hub_unsubscribed subscribers={} reason=\"{}\"", subs.size(), caf::to_string(dm.reason));
  });
  self->set_default_handler([=](caf::scheduled_actor*, caf::message_view& x) -> caf::result<caf::message> {
    const caf::message msg = x.copy_content_to_message();
    auto& st = self->state;
    if (msg.match_elements<replica_load>()) {
      const auto& l = msg.get_as<replica_load>(0);
      st.last_loads[l.id] = l;
      if (st.last_loads.size() > st.last_max) st.last_loads.erase(st.last_loads.begin());
    } else if (msg.match_elements<replica_event>()) {
      const auto& ev = msg.get_as<replica_event>(0);
      if (cluster::is_terminal(static_cast<cluster::replica_state>(ev.state))) {
        st.last_loads.erase(ev.id);
        st.last_events.erase(ev.id);
      } else {
        auto& kept = st.last_events[ev.id];
        const caf::actor handle = ev.handle ? ev.handle : kept.handle;  // later events may omit it
        kept = ev;
        kept.handle = handle;
        if (st.last_events.size() > st.last_max) st.last_events.erase(st.last_events.begin());
      }
    }
    for (const auto& s : st.subscribers) self->send(s, msg);
    return caf::message{};
  });
  return {
      [=](const subscribe_msg& m) {
        auto& st = self->state;
        if (!m.subscriber) return;
        if (std::find(st.subscribers.begin(), st.subscribers.end(), m.subscriber) != st.subscribers.end()) return;
        if (st.subscribers.size() >= st.subscribers_max) {
          spdlog::error("event=hub_subscribe_refused subscribers={} reason=\"at the bound\"", st.subscribers.size());
          return;
        }
        st.subscribers.push_back(m.subscriber);
        self->monitor(m.subscriber);
        for (const auto& [id, ev] : st.last_events) self->send(m.subscriber, ev);
        for (const auto& [id, load] : st.last_loads) self->send(m.subscriber, load);
        spdlog::info("event=hub_subscribed subscribers={}", st.subscribers.size());
      },
      [=](loads_atom) { return std::vector<replica_load>{}; },
  };
}

}  // namespace exa::actors
