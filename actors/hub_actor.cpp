#include "actors/hub_actor.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/message_view.hpp>
#include <caf/stateful_actor.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "actors/messages.hpp"

namespace exa::actors {

caf::behavior hub_actor(caf::stateful_actor<hub_state>* self) {
  self->set_down_handler([=](const caf::down_msg& dm) {
    auto& subs = self->state.subscribers;
    std::erase_if(subs, [&](const caf::actor& a) { return a.address() == dm.source; });
    spdlog::info("event=hub_unsubscribed subscribers={} reason=\"{}\"", subs.size(), caf::to_string(dm.reason));
  });
  self->set_default_handler([=](caf::scheduled_actor*, caf::message_view& x) -> caf::result<caf::message> {
    const caf::message msg = x.copy_content_to_message();
    for (const auto& s : self->state.subscribers) self->send(s, msg);
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
        spdlog::info("event=hub_subscribed subscribers={}", st.subscribers.size());
      },
      [=](loads_atom) { return std::vector<replica_load>{}; },
  };
}

}  // namespace exa::actors
