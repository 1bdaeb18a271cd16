#pragma once
// Model files from an operator's model store (the "central storage": a
// directory, typically a network mount) into a node's own cache directory.
// A copy is made under a temporary name, fsynced, checked, and renamed into
// place, so a reader never sees half a file and a crash leaves no file that
// looks complete. A copy that fails its check -- the digest the deployment
// pins, or else the store file's own digest -- is removed and fetched
// again; a copy already in the cache that fails it is refused the same way.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace exa::model {

struct store_fetch {
  std::string path;           // the file in the cache directory
  bool copied = false;        // false: the cache already held a good copy
  std::uint64_t bytes = 0;
  std::uint32_t attempts = 0;   // copies made (a refused one counts)
  bool refused_cached = false;  // a copy in the cache failed its check and was removed
};

struct store_options {
  /// Copies tried before giving up on a store file whose bytes keep failing the check.
  std::uint32_t attempts = 2;
  /// Tests: called on each temporary copy before it is checked (to damage it).
  std::function<void(const std::string& tmp_path, std::uint32_t attempt)> after_copy;
};

/// Where a deployment's model lives in a store or cache directory:
/// DIR/<sha256>.gguf when a digest is pinned, else DIR/<the path's file name>.
std::string store_name(const std::string& path, const std::string& sha256);

/// Brings the model named by `path` (its file name) or `sha256` (when
/// pinned) from `store_dir` into `cache_dir` (created if missing). Errors:
/// not_found naming the store path; corrupt_data naming both digests when
/// every copy failed its check (nothing is left in the cache); io_error
/// naming the file for a failed read, write or rename.
expected<store_fetch> fetch_from_store(const std::string& store_dir, const std::string& cache_dir,
                                       const std::string& path, const std::string& sha256,
                                       const store_options& options = {});

/// A model file a node's cache directory held when the node started.
struct cached_file {
  std::string path;
  std::uint64_t bytes = 0;
  std::int64_t mtime_ns = 0;  // last written: the use order a new process knows
};

struct cache_scan {
  std::vector<cached_file> kept;     // oldest first (least recently used first)
  std::vector<cached_file> evicted;  // deleted: the kept ones alone exceeded the capacity
  std::size_t skipped = 0;           // entries not named like a cached model (or past the bound)
};

/// Files of an earlier run in a node's cache directory, so that a restarted
/// node counts them against its capacity and reuses them without a fetch.
/// Only regular files named like the cache's own (ending in .gguf, not a
/// hidden ".NAME.tmp.*" temporary) count. Only their sizes are read: their
/// bytes are checked against the digest when a deployment uses them, as for
/// any copy in the cache. When they exceed `capacity_bytes`, the oldest by
/// mtime are deleted until the rest fit. At most `max_files` are looked at.
/// A missing directory is an empty cache; an unreadable one is an io_error.
expected<cache_scan> scan_cache_dir(const std::string& cache_dir, std::uint64_t capacity_bytes,
                                    std::size_t max_files = 4096);

}  // namespace exa::model
