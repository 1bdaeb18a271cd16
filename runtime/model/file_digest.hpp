#pragma once
// Model files by content: their SHA-256, remembered per (path, size, mtime)
// so a large file is hashed once, and where a node finds a deployment's file
// (the path it was deployed with, or its model directory by digest or name).

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"

namespace exa::model {

/// Lower-case hex SHA-256 of a file's bytes. Errors: io_error naming the path.
expected<std::string> sha256_file(const std::string& path);

/// Whether `s` is a SHA-256 in hex (64 characters 0-9a-f, either case).
bool is_sha256_hex(std::string_view s) noexcept;

/// Lower-cases a hex digest (deployments may name it in either case).
std::string normalize_sha256(std::string_view s);

/// Digests of files already hashed, keyed by path and invalidated when the
/// file's size or modification time changes. Thread-safe.
class file_digest_cache {
 public:
  expected<std::string> sha256(const std::string& path);
  std::uint64_t hashed() const;  // files actually read (not answered from memory)

 private:
  struct key {
    std::uint64_t size = 0;
    std::int64_t mtime_ns = 0;
    std::string sha256;
  };
  mutable std::mutex mutex_;
  std::map<std::string, key> known_;
  std::uint64_t hashed_ = 0;
};

/// Where to open a deployment's model: `path` when it exists; else, with a
/// model directory, DIR/<sha256>.gguf (when the deployment names a digest),
/// then DIR/<the path's file name>. Errors: not_found naming every place
/// tried. `exists` is the filesystem check (a parameter for tests).
expected<std::string> locate_model(const std::string& path, const std::string& sha256, const std::string& model_dir,
                                   const std::function<bool(const std::string&)>& exists);

}  // namespace exa::model
