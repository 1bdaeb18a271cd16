#pragma once
// API keys: who may call the front doors, for which tenant, and whether
// they may administer the cluster.
//
// A key is shown once, when it is made ("exa-" and 43 base64url characters
// of 32 random bytes); the keys file keeps only its SHA-256, so a leaked file
// lets no one in. One line per key:
//   key <id> sha256=<64 hex> tenant=<name> admin=<0|1> created=<unix s>
// where <id> (the hash's first 12 hex digits) names the key in `keys list`
// and `keys revoke` without revealing it. A tenant's limits (any subset,
// 0 = unlimited) are a line of their own:
//   tenant <name> requests_per_s=<x> tokens_per_min=<x> max_concurrent=<n> max_tokens=<n>
// '#' starts a comment.

#include <cstdint>
#include <map>
#include <unordered_map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "auth/tenant_limits.hpp"
#include "common/error.hpp"

namespace exa::auth {

struct key_entry {
  std::string id;          // first 12 hex digits of sha256
  std::string sha256_hex;  // of the whole key
  std::string tenant;
  bool admin = false;
  std::int64_t created_unix_s = 0;
};

/// The SHA-256 of `key`, lower-case hex.
std::string hash_key(std::string_view key);

/// A tenant name: 1 to 64 of [A-Za-z0-9_.-].
expected<void> check_tenant(std::string_view tenant);

/// Whether a deployment owned by `owner` ("": shared by every tenant) exists
/// for a caller scoped to `tenant` ("": every tenant -- no keys, or an
/// admin key).
inline bool visible_to(std::string_view tenant, std::string_view owner) noexcept {
  return tenant.empty() || owner.empty() || owner == tenant;
}

class key_set {
 public:
  /// Parses a keys file's text; an error names the line and what is wrong
  /// with it (a duplicate id or hash is an error too).
  static expected<key_set> parse(std::string_view text);
  /// The file's text: a header comment, then one line per key.
  std::string serialize() const;

  /// The entry for a presented key, or null (compared by hash).
  const key_entry* find(std::string_view presented_key) const;
  /// Makes a new key for `tenant`; returns it (the only time it is seen).
  expected<std::string> add(std::string_view tenant, bool admin, std::int64_t now_unix_s);
  /// Removes the key with this id (or id prefix of at least 6 digits, when
  /// it names exactly one key). Errors: not_found, invalid_argument.
  expected<key_entry> revoke(std::string_view id);

  const std::vector<key_entry>& entries() const noexcept { return entries_; }
  bool empty() const noexcept { return entries_.empty(); }

  /// A tenant's limits (all 0, unlimited, when none are set).
  tenant_limits limits_for(const std::string& tenant) const;
  expected<void> set_limits(const std::string& tenant, const tenant_limits& limits);
  const std::map<std::string, tenant_limits>& limits() const noexcept { return limits_; }

 private:
  void reindex();
  std::vector<key_entry> entries_;
  // sha256 -> index in entries_: find() runs on every request.
  std::unordered_map<std::string, std::size_t> by_hash_;
  std::map<std::string, tenant_limits> limits_;
};

/// Reads and parses a keys file (errors name the file). A missing file is an
/// error: a gateway told to check keys must not start open by mistake.
expected<key_set> load_keys(const std::string& path);
/// Writes the file whole (a temporary file, then rename), mode 0600.
expected<void> save_keys(const std::string& path, const key_set& keys);

/// The keys a front door checks, replaceable while it serves (SIGHUP):
/// readers get a snapshot, a failed reload keeps the previous keys.
class key_store {
 public:
  static expected<std::shared_ptr<key_store>> open(std::string path);
  std::shared_ptr<const key_set> current() const;
  /// Re-reads the file; on error the old keys stay and the error says why.
  expected<std::size_t> reload();
  const std::string& path() const noexcept { return path_; }

 private:
  explicit key_store(std::string path) : path_(std::move(path)) {}
  std::string path_;
  std::shared_ptr<const key_set> keys_;  // accessed with std::atomic_load/store
};

}  // namespace exa::auth
