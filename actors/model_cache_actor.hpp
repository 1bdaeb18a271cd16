#pragma once
// The node-local model cache: loads (maps) GGUF models on first use, shares
// one instance among the node's replicas, keeps a model pinned while any
// replica uses it, and evicts unpinned models least-recently-used first once
// their files' bytes exceed the capacity (runtime/cluster/byte_lru): a file
// an active replica maps is never evicted. A model found nowhere on the node
// is fetched from the operator's model store into the node's cache directory
// (checked, renamed into place; runtime/model/model_store), and an evicted
// fetched file is deleted from there.
//
// Entries are keyed by content where the deployment names a SHA-256 (one
// load for every deployment of the same bytes, whatever the path; a file
// replaced at the same path is never mistaken for the old one), else by
// path. A named digest is checked before the model is used, and a file
// missing at its path is looked for in the node's model directory, as
// DIR/<sha256>.gguf or DIR/<file name>.
//
// At start the cache directory is scanned (model::scan_cache_dir: sizes
// only): files an earlier run fetched count against the capacity at once,
// as "file:<path>" entries that are deleted when evicted, and become a
// model's entry when a deployment uses them (checked then, not refetched).

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "actors/messages.hpp"
#include "cluster/byte_lru.hpp"
#include "model/file_digest.hpp"

namespace exa::actors {

struct model_cache_config {
  std::uint64_t capacity_bytes = 64ull << 30;  // model files' bytes kept loaded
  std::string model_dir;  // --model-dir: "" = only the deployed paths
  std::string store_dir;  // --model-store: "" = no store to fetch from
  std::string cache_dir;  // --model-cache-dir: where fetched files go
  caf::actor controller;  // told of each file fetched from the store (node_cached_file); may be null
};

struct model_cache_state {
  struct entry {
    std::shared_ptr<const model::llama_model> model;
    std::string file;     // where it was loaded from
    bool fetched = false;  // the file is our copy from the store (deleted on eviction)
  };
  model_cache_config config;
  std::map<std::string, entry> entries;  // "sha256:<hex>" or "path:<path>"
  std::map<std::string, std::string> on_disk;  // "file:<path>" -> path: found at start, not loaded yet
  cluster::byte_lru lru{0};              // same keys: bytes, pins, use order
  std::shared_ptr<model::file_digest_cache> digests = std::make_shared<model::file_digest_cache>();
  std::uint64_t loads = 0;
  std::uint64_t fetches = 0;
  std::vector<cluster::cached_file> fetched_untold;  // fetched, the controller not told yet
  std::map<std::string, std::uint32_t> pending;         // acquires delayed (slow-load fault), by key
  std::map<std::string, std::uint32_t> early_releases;  // releases that came before those acquires
  // Fault injection: model loads take `slow_delay_ms` longer until then.
  std::int64_t slow_until_ns = 0;
  std::uint32_t slow_delay_ms = 0;
  static inline const char* name = "model_cache";
};

caf::behavior model_cache_actor(caf::stateful_actor<model_cache_state>* self, cluster::node_id node,
                                model_cache_config config);

}  // namespace exa::actors
