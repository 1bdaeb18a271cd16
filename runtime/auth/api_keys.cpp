#include "auth/api_keys.hpp"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace exa::auth {
namespace {

std::string hex(const unsigned char* p, std::size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out(n * 2, '0');
  for (std::size_t i = 0; i < n; ++i) {
    out[2 * i] = digits[p[i] >> 4];
    out[2 * i + 1] = digits[p[i] & 15];
  }
  return out;
}

std::string base64url(const unsigned char* p, std::size_t n) {
  static constexpr char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  std::uint32_t acc = 0;
  int bits = 0;
  for (std::size_t i = 0; i < n; ++i) {
    acc = (acc << 8) | p[i];
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out += alphabet[(acc >> bits) & 63];
    }
  }
  if (bits > 0) out += alphabet[(acc << (6 - bits)) & 63];
  return out;
}

bool is_hex(std::string_view s) {
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// "name=value" -> value, when the field is `name`.
bool field(std::string_view word, std::string_view name, std::string& value) {
  if (word.size() <= name.size() || word.substr(0, name.size()) != name || word[name.size()] != '=') return false;
  value = std::string(word.substr(name.size() + 1));
  return true;
}

}  // namespace

std::string hash_key(std::string_view key) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(key.data(), key.size(), md, &len, EVP_sha256(), nullptr);
  return hex(md, len);
}

expected<void> check_tenant(std::string_view t) {
  if (t.empty() || t.size() > 64)
    return make_error(errc::invalid_argument, "a tenant name has 1 to 64 characters, not " + std::to_string(t.size()));
  for (char c : t)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
          c == '.'))
      return make_error(errc::invalid_argument, "tenant '" + std::string(t) + "' may use only letters, digits, '_', '-' and '.'");
  return {};
}

expected<key_set> key_set::parse(std::string_view text) {
  key_set out;
  std::istringstream in{std::string(text)};
  std::string line;
  for (unsigned n = 1; std::getline(in, line); ++n) {
    const auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string x; words >> x;) w.push_back(x);
    if (w.empty()) continue;
    const auto bad = [&](const std::string& why) {
      return make_error(errc::invalid_argument, "line " + std::to_string(n) + ": " + why);
    };
    if (w[0] == "tenant") {
      if (w.size() < 2) return bad("expected 'tenant <name> [requests_per_s=X] [tokens_per_min=X] [max_concurrent=N] [max_tokens=N]'");
      if (auto ok = check_tenant(w[1]); !ok) return bad(ok.error().message);
      if (out.limits_.count(w[1])) return bad("tenant " + w[1] + "'s limits appear twice");
      tenant_limits l;
      for (std::size_t i = 2; i < w.size(); ++i) {
        const auto eq = w[i].find('=');
        const std::string name = w[i].substr(0, eq), value = eq == std::string::npos ? "" : w[i].substr(eq + 1);
        char* end = nullptr;
        const double v = std::strtod(value.c_str(), &end);
        if (value.empty() || *end != '\0' || !(v >= 0) || v > 1e12)
          return bad(name + "= must be a number >= 0, not '" + value + "'");
        if (name == "requests_per_s") l.requests_per_s = v;
        else if (name == "tokens_per_min") l.tokens_per_min = v;
        else if (name == "max_concurrent" && v == std::floor(v) && v <= 1e9) l.max_concurrent = static_cast<std::uint32_t>(v);
        else if (name == "max_tokens" && v == std::floor(v) && v <= 1e9) l.max_tokens = static_cast<std::uint32_t>(v);
        else if (name == "weight" && v > 0 && v <= 1e6) l.weight = v;
        else return bad("unknown or non-integer limit '" + w[i] + "' (requests_per_s, tokens_per_min, max_concurrent, "
                        "max_tokens, weight > 0)");
      }
      out.limits_[w[1]] = l;
      continue;
    }
    if (w[0] != "key" || w.size() != 6)
      return bad("expected 'key <id> sha256=<hex> tenant=<name> admin=<0|1> created=<unix s>' or 'tenant <name> <limits>'");
    key_entry e;
    e.id = w[1];
    std::string admin, created;
    if (!field(w[2], "sha256", e.sha256_hex) || e.sha256_hex.size() != 64 || !is_hex(e.sha256_hex))
      return bad("sha256= must be 64 lower-case hex digits");
    if (e.id != e.sha256_hex.substr(0, e.id.size()) || e.id.size() != 12)
      return bad("the id must be the first 12 digits of its sha256");
    if (!field(w[3], "tenant", e.tenant)) return bad("expected tenant=<name>");
    if (auto ok = check_tenant(e.tenant); !ok) return bad(ok.error().message);
    if (!field(w[4], "admin", admin) || (admin != "0" && admin != "1")) return bad("admin= must be 0 or 1");
    e.admin = admin == "1";
    if (!field(w[5], "created", created) || created.empty() ||
        created.find_first_not_of("0123456789") != std::string::npos || created.size() > 18)
      return bad("created= must be a unix time in seconds");
    e.created_unix_s = std::stoll(created);
    if (out.by_hash_.count(e.sha256_hex)) return bad("key " + e.id + " appears twice");
    out.by_hash_.emplace(e.sha256_hex, out.entries_.size());
    out.entries_.push_back(std::move(e));
  }
  return out;
}

std::string key_set::serialize() const {
  std::string out =
      "# exaserve API keys: the SHA-256 of each key, never the key itself.\n"
      "# Managed with `exaserve keys add|revoke|list --file FILE`; a gateway re-reads it on SIGHUP.\n";
  for (const auto& e : entries_)
    out += "key " + e.id + " sha256=" + e.sha256_hex + " tenant=" + e.tenant + " admin=" + (e.admin ? "1" : "0") +
           " created=" + std::to_string(e.created_unix_s) + "\n";
  for (const auto& [t, l] : limits_)
    out += fmt::format("tenant {} requests_per_s={} tokens_per_min={} max_concurrent={} max_tokens={} weight={}\n", t,
                       l.requests_per_s, l.tokens_per_min, l.max_concurrent, l.max_tokens, l.weight);
  return out;
}

void key_set::reindex() {
  by_hash_.clear();
  for (std::size_t i = 0; i < entries_.size(); ++i) by_hash_.emplace(entries_[i].sha256_hex, i);
}

tenant_limits key_set::limits_for(const std::string& tenant) const {
  auto it = limits_.find(tenant);
  return it == limits_.end() ? tenant_limits{} : it->second;
}

expected<void> key_set::set_limits(const std::string& tenant, const tenant_limits& limits) {
  if (auto ok = check_tenant(tenant); !ok) return ok;
  if (limits == tenant_limits{})
    limits_.erase(tenant);
  else
    limits_[tenant] = limits;
  return {};
}

const key_entry* key_set::find(std::string_view presented_key) const {
  if (presented_key.empty()) return nullptr;
  const auto it = by_hash_.find(hash_key(presented_key));
  return it == by_hash_.end() ? nullptr : &entries_[it->second];
}

expected<std::string> key_set::add(std::string_view tenant, bool admin, std::int64_t now_unix_s) {
  if (auto ok = check_tenant(tenant); !ok) return std::unexpected(ok.error());
  unsigned char raw[32];
  if (RAND_bytes(raw, sizeof raw) != 1) return make_error(errc::internal, "OpenSSL could not make random bytes");
  std::string key = "exa-" + base64url(raw, sizeof raw);
  key_entry e;
  e.sha256_hex = hash_key(key);
  e.id = e.sha256_hex.substr(0, 12);
  e.tenant = std::string(tenant);
  e.admin = admin;
  e.created_unix_s = now_unix_s;
  by_hash_.emplace(e.sha256_hex, entries_.size());
  entries_.push_back(std::move(e));
  return key;
}

expected<key_entry> key_set::revoke(std::string_view id) {
  if (id.size() < 6 || !is_hex(id))
    return make_error(errc::invalid_argument, "a key id is 6 to 12 hex digits (see `exaserve keys list`)");
  auto match = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->id.compare(0, id.size(), id) != 0) continue;
    if (match != entries_.end())
      return make_error(errc::invalid_argument, "key id '" + std::string(id) + "' names more than one key: give more digits");
    match = it;
  }
  if (match == entries_.end()) return make_error(errc::not_found, "no key with id '" + std::string(id) + "'");
  key_entry gone = *match;
  entries_.erase(match);
  reindex();
  return gone;
}

expected<key_set> load_keys(const std::string& path) {
  std::ifstream in(path);
  if (!in) return make_error(errc::io_error, "cannot read the keys file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  auto keys = key_set::parse(ss.str());
  if (!keys) return make_error(keys.error().code, path + ": " + keys.error().message);
  return keys;
}

expected<void> save_keys(const std::string& path, const key_set& keys) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return make_error(errc::io_error, "cannot write '" + tmp + "'");
  const std::string text = keys.serialize();
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ok = ::fsync(fd) == 0 && ok;
  ok = ::close(fd) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return make_error(errc::io_error, "cannot write the keys file '" + path + "'");
  }
  return {};
}

expected<std::shared_ptr<key_store>> key_store::open(std::string path) {
  std::shared_ptr<key_store> s(new key_store(std::move(path)));
  auto keys = load_keys(s->path_);
  if (!keys) return std::unexpected(keys.error());
  s->keys_ = std::make_shared<const key_set>(std::move(*keys));
  return s;
}

std::shared_ptr<const key_set> key_store::current() const { return std::atomic_load(&keys_); }

expected<std::size_t> key_store::reload() {
  auto keys = load_keys(path_);
  if (!keys) return std::unexpected(keys.error());
  const std::size_t n = keys->entries().size();
  std::atomic_store(&keys_, std::make_shared<const key_set>(std::move(*keys)));
  return n;
}

}  // namespace exa::auth
