#include "model/file_digest.hpp"

#include <openssl/evp.h>
#include <sys/stat.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

namespace exa::model {

expected<std::string> sha256_file(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) return make_error(errc::io_error, "cannot open " + path + ": " + std::strerror(errno));
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    return make_error(errc::internal, "cannot start a SHA-256 digest");
  std::vector<unsigned char> buf(1 << 20);
  for (;;) {
    const std::size_t n = std::fread(buf.data(), 1, buf.size(), f.get());
    if (n > 0 && EVP_DigestUpdate(ctx.get(), buf.data(), n) != 1)
      return make_error(errc::internal, "SHA-256 digest update failed");
    if (n < buf.size()) break;
  }
  if (std::ferror(f.get())) return make_error(errc::io_error, "cannot read " + path + ": " + std::strerror(errno));
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx.get(), md, &len) != 1) return make_error(errc::internal, "SHA-256 digest failed");
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) {
    out.push_back(hex[md[i] >> 4]);
    out.push_back(hex[md[i] & 15]);
  }
  return out;
}

bool is_sha256_hex(std::string_view s) noexcept {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

std::string normalize_sha256(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

expected<std::string> file_digest_cache::sha256(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return make_error(errc::io_error, "cannot stat " + path + ": " + std::strerror(errno));
  const auto size = static_cast<std::uint64_t>(st.st_size);
  const std::int64_t mtime = std::int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  {
    std::lock_guard lock(mutex_);
    if (auto it = known_.find(path); it != known_.end() && it->second.size == size && it->second.mtime_ns == mtime)
      return it->second.sha256;
  }
  auto digest = sha256_file(path);  // outside the lock: large files take a while
  if (!digest) return digest;
  std::lock_guard lock(mutex_);
  ++hashed_;
  known_[path] = {size, mtime, *digest};
  return digest;
}

std::uint64_t file_digest_cache::hashed() const {
  std::lock_guard lock(mutex_);
  return hashed_;
}

expected<std::string> locate_model(const std::string& path, const std::string& sha256, const std::string& model_dir,
                                   const std::function<bool(const std::string&)>& exists) {
  std::vector<std::string> tried{path};
  if (exists(path)) return path;
  if (!model_dir.empty()) {
    if (!sha256.empty()) {
      tried.push_back(model_dir + "/" + normalize_sha256(sha256) + ".gguf");
      if (exists(tried.back())) return tried.back();
    }
    const auto slash = path.find_last_of('/');
    const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
    if (!name.empty()) {
      tried.push_back(model_dir + "/" + name);
      if (exists(tried.back())) return tried.back();
    }
  }
  std::string list;
  for (const auto& t : tried) list += (list.empty() ? "" : ", ") + t;
  return make_error(errc::not_found, "model file not found (tried " + list + ")" +
                                         (model_dir.empty() ? std::string("; no --model-dir to look in") : ""));
}

}  // namespace exa::model
