#pragma once
// The node-local model cache: loads (maps) GGUF models on first use, shares
// one instance among the node's replicas, keeps a model pinned while any
// replica uses it, and evicts unpinned models least-recently-used first once
// more than `capacity` are loaded.
//
// Entries are keyed by content where the deployment names a SHA-256 (one
// load for every deployment of the same bytes, whatever the path; a file
// replaced at the same path is never mistaken for the old one), else by
// path. A named digest is checked before the model is used, and a file
// missing at its path is looked for in the node's model directory, as
// DIR/<sha256>.gguf or DIR/<file name>.

#include <caf/fwd.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "actors/messages.hpp"
#include "model/file_digest.hpp"

namespace exa::actors {

struct model_cache_state {
  struct entry {
    std::shared_ptr<const model::llama_model> model;
    std::uint32_t pins = 0;
    std::uint64_t last_used = 0;
  };
  std::map<std::string, entry> entries;  // "sha256:<hex>" or "path:<path>"
  std::string model_dir;                  // --model-dir: "" = only the deployed paths
  std::shared_ptr<model::file_digest_cache> digests = std::make_shared<model::file_digest_cache>();
  std::uint32_t capacity = 4;
  std::uint64_t clock = 0;  // use order, for LRU
  std::uint64_t loads = 0;
  // Fault injection: model loads take `slow_delay_ms` longer until then.
  std::int64_t slow_until_ns = 0;
  std::uint32_t slow_delay_ms = 0;
  static inline const char* name = "model_cache";
};

caf::behavior model_cache_actor(caf::stateful_actor<model_cache_state>* self, cluster::node_id node,
                                std::uint32_t capacity, std::string model_dir = {});

}  // namespace exa::actors
