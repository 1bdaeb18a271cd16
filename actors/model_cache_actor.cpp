#include "actors/model_cache_actor.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <spdlog/spdlog.h>

#include "actors/chaos_hooks.hpp"
#include "model/llama_model.hpp"
#include "model/model_store.hpp"

#include <algorithm>
#include <filesystem>

namespace exa::actors {
namespace {

void evict_unpinned(model_cache_state& st, cluster::node_id node, std::uint64_t incoming = 0) {
  for (const auto& key : st.lru.evict_for(incoming)) {
    if (auto d = st.on_disk.find(key); d != st.on_disk.end()) {  // from an earlier run, never loaded
      spdlog::info("event=model_evicted node={} key={} file={} cache_used_bytes={} capacity_bytes={}", node, key,
                   d->second, st.lru.used_bytes(), st.lru.capacity_bytes());
      std::error_code ec;
      std::filesystem::remove(d->second, ec);
      st.on_disk.erase(d);
      continue;
    }
    auto it = st.entries.find(key);
    if (it == st.entries.end()) continue;
    spdlog::info("event=model_evicted node={} key={} file={} cache_used_bytes={} capacity_bytes={}", node, key,
                 it->second.file, st.lru.used_bytes(), st.lru.capacity_bytes());
    const std::string file = it->second.file;
    const bool fetched = it->second.fetched;
    st.entries.erase(it);
    // Our copy from the store: the disk space goes too, unless another entry
    // (another key for the same file) still uses it.
    const bool shared = std::any_of(st.entries.begin(), st.entries.end(),
                                    [&](const auto& e) { return e.second.file == file; });
    if (fetched && !shared) {
      std::error_code ec;
      std::filesystem::remove(file, ec);
    }
  }
  if (st.lru.used_bytes() > st.lru.capacity_bytes())
    spdlog::warn("event=model_cache_over_capacity node={} used_bytes={} capacity_bytes={} detail=\"every model left "
                 "is in use by a replica\"",
                 node, st.lru.used_bytes(), st.lru.capacity_bytes());
}

std::string cache_key(const std::string& path, const std::string& sha256) {
  return sha256.empty() ? "path:" + path : "sha256:" + sha256;
}

struct loaded {
  std::shared_ptr<const model::llama_model> model;
  std::string file;
  bool fetched = false;
};

// Finds, checks and loads a model (fetching it from the store when the node
// has it nowhere); the error names the file and the node.
expected<loaded> load(model_cache_state& st, cluster::node_id node, const std::string& path,
                      const std::string& sha256) {
  const auto& model_dir = st.config.model_dir;
  std::vector<std::string> rejected;  // found, but with other bytes
  const auto usable = [&](const std::string& p) {
    std::error_code ec;
    return std::find(rejected.begin(), rejected.end(), p) == rejected.end() && std::filesystem::is_regular_file(p, ec);
  };
  std::string mismatch;
  expected<std::string> file = model::locate_model(path, sha256, model_dir, usable);
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
    file = model::locate_model(path, sha256, model_dir, usable);
  }
  bool fetched = false;
  if (!file && !st.config.store_dir.empty() && !st.config.cache_dir.empty()) {
    // Nowhere on the node: from the store into our cache, checked on the
    // way, after room is made for it (the cache's disk may be sized to it).
    // A copy found at start is already counted: no room to make for it.
    std::error_code size_ec;
    const auto incoming =
        std::filesystem::file_size(st.config.store_dir + "/" + model::store_name(path, sha256), size_ec);
    const bool counted = st.on_disk.count("file:" + st.config.cache_dir + "/" + model::store_name(path, sha256)) != 0;
    if (!size_ec && !counted) evict_unpinned(st, node, incoming);
    auto f = model::fetch_from_store(st.config.store_dir, st.config.cache_dir, path, sha256);
    if (!f) return make_error(f.error().code, "node " + std::to_string(node) + ": " + f.error().message);
    ++st.fetches;
    spdlog::info("event=model_fetched node={} store={} file={} bytes={} copied={} attempts={} refused_cached={}", node,
                 st.config.store_dir, f->path, f->bytes, f->copied, f->attempts, f->refused_cached);
    file = f->path;
    fetched = true;
    st.fetched_untold.push_back(cluster::cache_entry_for(path, sha256, f->bytes));
  }
  if (!file && !mismatch.empty()) return make_error(errc::corrupt_data, mismatch);
  if (!file) return make_error(file.error().code, "node " + std::to_string(node) + ": " + file.error().message);
  auto m = model::llama_model::load(*file);
  if (!m) return std::unexpected(m.error());
  spdlog::info("event=model_loaded node={} path={} sha256={} layers={} dim={} vocab={}", node, *file,
               sha256.empty() ? "-" : sha256, (*m)->config().n_layers, (*m)->config().dim, (*m)->config().vocab_size);
  return loaded{std::shared_ptr<const model::llama_model>(*m), *file, fetched};
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
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(m->file, ec);
    // A copy found at start: its bytes move to this entry (and it stays ours
    // to delete when evicted).
    bool fetched = m->fetched;
    if (st.on_disk.erase("file:" + m->file)) {
      st.lru.erase("file:" + m->file);
      fetched = true;
    }
    it = st.entries.emplace(key, model_cache_state::entry{m->model, m->file, fetched}).first;
    st.lru.insert(key, ec ? 0 : bytes);
  }
  st.lru.pin(key);
  auto handle = model_handle{it->second.model, {}};
  evict_unpinned(st, node);
  return handle;
}

// Copies an earlier run left in the cache directory: counted now, oldest
// first in use order, so the capacity holds from the start.
void scan_at_start(model_cache_state& st, cluster::node_id node) {
  if (st.config.cache_dir.empty()) return;
  auto scan = model::scan_cache_dir(st.config.cache_dir, st.lru.capacity_bytes());
  if (!scan) {
    spdlog::warn("event=model_cache_scan_failed node={} error=\"{}\"", node, to_string(scan.error()));
    return;
  }
  for (const auto& f : scan->evicted)
    spdlog::info("event=model_evicted node={} file={} bytes={} detail=\"over capacity at start\"", node, f.path,
                 f.bytes);
  for (const auto& f : scan->kept) {
    st.lru.insert("file:" + f.path, f.bytes);
    st.on_disk["file:" + f.path] = f.path;
  }
  spdlog::info("event=model_cache_scanned node={} dir={} files={} bytes={} evicted={} skipped={}", node,
               st.config.cache_dir, scan->kept.size(), st.lru.used_bytes(), scan->evicted.size(), scan->skipped);
}

// The controller hears of each fetch at once: the node's other loads of the
// file need the store no more (load_gate::fetched).
void tell_fetched(caf::event_based_actor* self, model_cache_state& st, cluster::node_id node) {
  for (auto& f : st.fetched_untold)
    if (st.config.controller) self->send(st.config.controller, node_cached_file{node, std::move(f)});
  st.fetched_untold.clear();
}

// What the cache holds, for the node's join: loaded models (a digest only
// for those keyed by one, checked when loaded) and copies found at start
// (never hashed here: hashing a 70 GB file would hold the join up).
cached_files_msg contents(const model_cache_state& st) {
  cached_files_msg out;
  const auto add = [&](const std::string& file, std::string sha256) {
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(file, ec);
    out.files.push_back({std::filesystem::path(file).filename().string(), ec ? 0 : bytes, std::move(sha256)});
  };
  for (const auto& [key, e] : st.entries)
    add(e.file, key.rfind("sha256:", 0) == 0 ? key.substr(7) : std::string());
  for (const auto& [key, path] : st.on_disk) add(path, "");
  return out;
}

}  // namespace

caf::behavior model_cache_actor(caf::stateful_actor<model_cache_state>* self, cluster::node_id node,
                                model_cache_config config) {
  self->state.lru = cluster::byte_lru(config.capacity_bytes);
  self->state.config = std::move(config);
  scan_at_start(self->state, node);
  return {
      [=](const inject_fault& f) {
        if (f.kind != "slow_load") return;
        auto& st = self->state;
        st.slow_until_ns = clock_ns(self) + std::int64_t{f.duration_ms} * 1000000;
        st.slow_delay_ms = f.delay_ms;
        spdlog::warn("event=chaos_slow_model_load node={} delay_ms={} duration_ms={}", node, f.delay_ms, f.duration_ms);
      },
      [=](const deferred_call& c) { c.fn(); },
      [=](cache_contents_atom) { return contents(self->state); },
      [=](const acquire_model& req) -> caf::result<model_handle> {
        auto& st = self->state;
        if (clock_ns(self) < st.slow_until_ns) {  // a slow disk or network: answer later
          auto promise = self->make_response_promise<model_handle>();
          const std::string path = req.path, sha256 = req.sha256;
          ++st.pending[cache_key(path, sha256)];
          self->delayed_send(self, std::chrono::milliseconds(st.slow_delay_ms), deferred_call{[=]() mutable {
            auto& s = self->state;
            const auto key = cache_key(path, sha256);
            auto h = acquire(s, node, path, sha256);
            tell_fetched(self, s, node);
            if (--s.pending[key] == 0) s.pending.erase(key);
            // Its replica stopped (and released) while this load waited.
            if (h.model && s.early_releases[key] > 0) {
              if (--s.early_releases[key] == 0) s.early_releases.erase(key);
              s.lru.unpin(key);
              evict_unpinned(s, node);
            }
            promise.deliver(std::move(h));
          }});
          return promise;
        }
        auto h = acquire(st, node, req.path, req.sha256);
        tell_fetched(self, st, node);
        return h;
      },
      [=](const release_model& req) {
        auto& st = self->state;
        const auto key = cache_key(req.path, req.sha256);
        if (!st.lru.unpin(key)) {
          if (st.pending.count(key)) ++st.early_releases[key];  // for an acquire still waiting
          return;
        }
        evict_unpinned(st, node);
      },
  };
}

}  // namespace exa::actors
