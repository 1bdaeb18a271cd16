#pragma once
// What a node's model cache holds, as the node announces it when it joins,
// and which nodes that makes hold a deployment's file. The controller adds
// these nodes to the ones where a replica of the file got loaded
// (placement's cached_on), so a node that restarts with a warm cache
// directory is preferred for its files from its first join on, not only
// after a replica has loaded there.
//
// A file matches by the cache's own naming (model::store_name): a
// deployment pinned to a digest by "<sha256>.gguf", or by that digest when
// the node has verified it; an unpinned one by its path's file name. A
// verified digest that differs never matches, whatever the name. Names are
// a hint, not a check: the node checks a file's digest when a replica uses
// it, so a wrong guess costs a fetch, never wrong bytes.

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cluster/types.hpp"
#include "common/error.hpp"

namespace exa::cluster {

/// One model file in a node's cache.
struct cached_file {
  std::string name;          // file name in the cache directory (no directory part)
  std::uint64_t bytes = 0;
  std::string sha256;        // lowercase hex when the node verified it; "" when not known
  friend bool operator==(const cached_file&, const cached_file&) = default;
};

/// Bounds on one node's announcement (a scan reads at most 4096 entries).
constexpr std::size_t cached_files_max = 4096;
constexpr std::size_t cached_file_name_bytes_max = 255;

/// The entry a node's cache holds for a deployment's file: the cache's name
/// for it (model::store_name) and, when pinned, its digest (lowercase).
cached_file cache_entry_for(const std::string& model_path, const std::string& model_sha256, std::uint64_t bytes);

/// Whether `file` is the file of a deployment of `model_path`, pinned to
/// `model_sha256` when that is not empty (any case).
bool holds_model(const cached_file& file, const std::string& model_path, const std::string& model_sha256);

/// The nodes whose announced files hold the deployment's file.
std::set<node_id> nodes_holding(const std::map<node_id, std::vector<cached_file>>& files,
                                const std::string& model_path, const std::string& model_sha256);

/// An announcement as the controller keeps it: at most cached_files_max
/// entries, each with a plain file name (no '/', not empty, not "." or "..",
/// at most cached_file_name_bytes_max bytes) and a digest that is empty or
/// 64 hex digits (kept lowercase). Entries that break a rule are dropped;
/// `dropped` (if given) counts them, and the first one's problem is in
/// `why` for the log.
std::vector<cached_file> sanitize_cached_files(std::vector<cached_file> files, std::size_t* dropped = nullptr,
                                               std::string* why = nullptr);

}  // namespace exa::cluster
