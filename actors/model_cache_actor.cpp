#include "actors/model_cache_actor.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <spdlog/spdlog.h>

#include "actors/chaos_hooks.hpp"
#include "model/llama_model.hpp"

#include <algorithm>
#include <filesystem>

namespace exa::actors {
namespace {

void evict_unpinned(model_cache_state& st, cluster::node_id node) {
  while (st.entries.size() > st.capacity) {
    auto victim = st.entries.end();
    for (auto it = st.entries.begin(); it != st.entries.end(); ++it)
      if (it->second.pins == 0 && (victim == st.entries.end() || it->second.last_used < victim->second.last_used))
        victim = it;
    if (victim == st.entries.end()) return;  // everything pinned: over capacity until released
    spdlog::info("event=model_evicted node={} key={}", node, victim->first);
    st.entries.erase(victim);
  }
}

std::string cache_key(const std::string& path, const std::string& sha256) {
  return sha256.empty() ? "path:" + path : "sha256:" + sha256;
}

// Finds, checks and loads a model; the error names the file and the node.
expected<std::shared_ptr<const model::llama_model>> load(model_cache_state& st, cluster::node_id node,
                                                          const std::string& path, const std::string& sha256) {
  std::vector<std::string> rejected;  // found, but with other bytes
  const auto usable = [&](const std::string& p) {
    std::error_code ec;
    return std::find(rejected.begin(), rejected.end(), p) == rejected.end() && std::filesystem::is_regular_file(p, ec);
  };
  std::string mismatch;
  expected<std::string> file = model::locate_model(path, sha256, st.model_dir, usable);
  // A file with other bytes at one place: the model directory may still
  // hold the right one, so look on (at most once per candidate).
  while (file && !sha256.empty()) {
    auto digest = st.digests->sha256(*file);
    if (!digest) return std::unexpected(digest.error());
    if (*digest == sha256) break;
    if (mismatch.empty())
      mismatch = "model file " + *file + " on node " + std::to_string(node) + " has sha256 " + *digest +
                 ", the deployment wants " + sha256;
    rejected.push_back(*file);
    file = model::locate_model(path, sha256, st.model_dir, usable);
  }
  if (!file && !mismatch.empty()) return make_error(errc::corrupt_data, mismatch);
  if (!file) return make_error(file.error().code, "node " + std::to_string(node) + ": " + file.error().message);
  auto m = model::llama_model::load(*file);
  if (!m) return std::unexpected(m.error());
  spdlog::info("event=model_loaded node={} path={} sha256={} layers={} dim={} vocab={}", node, *file,
               sha256.empty() ? "-" : sha256, (*m)->config().n_layers, (*m)->config().dim, (*m)->config().vocab_size);
  return std::shared_ptr<const model::llama_model>(*m);
}

// Loads (once) and pins a model; a null model with the error when it fails.
model_handle acquire(model_cache_state& st, cluster::node_id node, const std::string& path, const std::string& sha256) {
  const std::string key = cache_key(path, sha256);
  auto it = st.entries.find(key);
  if (it == st.entries.end()) {
    auto m = load(st, node, path, sha256);
    if (!m) {
      spdlog::error("event=model_load_failed node={} path={} error=\"{}\"", node, path, to_string(m.error()));
      return model_handle{nullptr, wire_error::from(m.error())};
    }
    ++st.loads;
    it = st.entries.emplace(key, model_cache_state::entry{*m, 0, 0}).first;
  }
  ++it->second.pins;
  it->second.last_used = ++st.clock;
  auto handle = model_handle{it->second.model, {}};
  evict_unpinned(st, node);
  return handle;
}

}  // namespace

caf::behavior model_cache_actor(caf::stateful_actor<model_cache_state>* self, cluster::node_id node,
                                std::uint32_t capacity, std::string model_dir) {
  self->state.capacity = capacity;
  self->state.model_dir = std::move(model_dir);
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
          const std::string path = req.path, sha256 = req.sha256;
          self->delayed_send(self, std::chrono::milliseconds(st.slow_delay_ms), deferred_call{[=]() mutable {
            promise.deliver(acquire(self->state, node, path, sha256));
          }});
          return promise;
        }
        return acquire(st, node, req.path, req.sha256);
      },
      [=](const release_model& req) {
        auto& st = self->state;
        auto it = st.entries.find(cache_key(req.path, req.sha256));
        if (it == st.entries.end() || it->second.pins == 0) return;
        --it->second.pins;
        evict_unpinned(st, node);
      },
  };
}

}  // namespace exa::actors
