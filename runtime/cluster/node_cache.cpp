#include "cluster/node_cache.hpp"

#include <algorithm>

#include "model/file_digest.hpp"
#include "model/model_store.hpp"

namespace exa::cluster {
cached_file cache_entry_for(const std::string& model_path, const std::string& model_sha256, std::uint64_t bytes) {
  const std::string sha = model_sha256.empty() ? std::string() : model::normalize_sha256(model_sha256);
  return {model::store_name(model_path, sha), bytes, sha};
}

bool holds_model(const cached_file& file, const std::string& model_path, const std::string& model_sha256) {
  if (model_sha256.empty()) return !file.name.empty() && file.name == model::store_name(model_path, "");
  const std::string want = model::normalize_sha256(model_sha256);
  if (!file.sha256.empty()) return model::normalize_sha256(file.sha256) == want;
  return file.name == model::store_name(model_path, want);
}

std::set<node_id> nodes_holding(const std::map<node_id, std::vector<cached_file>>& files,
                                const std::string& model_path, const std::string& model_sha256) {
  std::set<node_id> out;
  for (const auto& [node, list] : files)
    if (std::any_of(list.begin(), list.end(),
                    [&](const cached_file& f) { return holds_model(f, model_path, model_sha256); }))
      out.insert(node);
  return out;
}

std::vector<cached_file> sanitize_cached_files(std::vector<cached_file> files, std::size_t* dropped,
                                               std::string* why) {
  std::vector<cached_file> out;
  std::size_t bad = 0;
  const auto drop = [&](const std::string& problem) {
    if (bad++ == 0 && why) *why = problem;
  };
  for (auto& f : files) {
    if (out.size() >= cached_files_max) {
      drop("more than " + std::to_string(cached_files_max) + " files");
      continue;
    }
    if (f.name.empty() || f.name == "." || f.name == ".." || f.name.find('/') != std::string::npos ||
        f.name.size() > cached_file_name_bytes_max) {
      drop("file name '" + f.name.substr(0, 64) + "' is not a plain file name");
      continue;
    }
    if (!f.sha256.empty() && !model::is_sha256_hex(f.sha256)) {
      drop("file " + f.name + " has a sha256 that is not 64 hex digits");
      continue;
    }
    f.sha256 = model::normalize_sha256(f.sha256);
    out.push_back(std::move(f));
  }
  if (dropped) *dropped = bad;
  return out;
}

}  // namespace exa::cluster
