#include "actors/model_cache_actor.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <spdlog/spdlog.h>

#include "actors/chaos_hooks.hpp"
#include "model/llama_model.hpp"

namespace exa::actors {
namespace {

void evict_unpinned(model_cache_state& st, cluster::node_id node) {
  while (st.entries.size() > st.capacity) {
    auto victim = st.entries.end();
    for (auto it = st.entries.begin(); it != st.entries.end(); ++it)
      if (it->second.pins == 0 && (victim == st.entries.end() || it->second.last_used < victim->second.last_used))
        victim = it;
    if (victim == st.entries.end()) return;  // everything pinned: over capacity until released
    spdlog::info("event=model_evicted node={} path={}", node, victim->first);
    st.entries.erase(victim);
  }
}

// Loads (once) and pins a model; a null model with the error when it fails.
model_handle acquire(model_cache_state& st, cluster::node_id node, const std::string& path) {
  auto it = st.entries.find(path);
  if (it == st.entries.end()) {
    auto m = model::llama_model::load(path);
    if (!m) {
      spdlog::error("event=model_load_failed node={} path={} error=\"{}\"", node, path, to_string(m.error()));
      return model_handle{nullptr, wire_error::from(m.error())};
    }
    ++st.loads;
    spdlog::info("event=model_loaded node={} path={} layers={} dim={} vocab={}", node, path, (*m)->config().n_layers,
                 (*m)->config().dim, (*m)->config().vocab_size);
    it = st.entries.emplace(path, model_cache_state::entry{*m, 0, 0}).first;
  }
  ++it->second.pins;
  it->second.last_used = ++st.clock;
  auto handle = model_handle{it->second.model, {}};
  evict_unpinned(st, node);
  return handle;
}

}  // namespace

caf::behavior model_cache_actor(caf::stateful_actor<model_cache_state>* self, cluster::node_id node,
                                std::uint32_t capacity) {
  self->state.capacity = capacity;
  return {
      [=](const inject_fault& f) {
        if (f.kind != "slow_load") return;
        auto& st = self->state;
        st.slow_until_ns = clock_ns(self) + std::int64_t{f.duration_ms} * 1000000;
        st.slow_delay_ms = f.delay_ms;
        spdlog::warn("event=chaos_slow_model_load node={} delay_ms={} duration_ms={}", node, f.delay_ms, f.duration_ms);
      },
      [=](const deferred_call& c) { c.fn(); },
      [=](const acquire_model& req) -> caf::result<model_handle> {
        auto& st = self->state;
        if (clock_ns(self) < st.slow_until_ns) {  // a slow disk or network: answer later
          auto promise = self->make_response_promise<model_handle>();
          const std::string path = req.path;
          self->delayed_send(self, std::chrono::milliseconds(st.slow_delay_ms), deferred_call{[=]() mutable {
            promise.deliver(acquire(self->state, node, path));
          }});
          return promise;
        }
        return acquire(st, node, req.path);
      },
      [=](const release_model& req) {
        auto& st = self->state;
        auto it = st.entries.find(req.path);
        if (it == st.entries.end() || it->second.pins == 0) return;
        --it->second.pins;
        evict_unpinned(st, node);
      },
  };
}

}  // namespace exa::actors
