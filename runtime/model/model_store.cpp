#include "model/model_store.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <vector>

#include "model/file_digest.hpp"

namespace exa::model {
namespace {

namespace fs = std::filesystem;

error io(const std::string& what, const std::string& path) {
  return {errc::io_error, what + " " + path + ": " + std::strerror(errno)};
}

// Copies src to dst (created or truncated) and fsyncs it.
expected<std::uint64_t> copy_synced(const std::string& src, const std::string& dst) {
  const int in = ::open(src.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return std::unexpected(io("cannot open", src));
  const int out = ::open(dst.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    const auto e = io("cannot create", dst);
    ::close(in);
    return std::unexpected(e);
  }
  std::vector<char> buf(1 << 20);
  std::uint64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(in, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const auto e = io("cannot read", src);
      ::close(in);
      ::close(out);
      return std::unexpected(e);
    }
    if (n == 0) break;
    for (ssize_t done = 0; done < n;) {
      const ssize_t w = ::write(out, buf.data() + done, static_cast<std::size_t>(n - done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const auto e = io("cannot write", dst);
        ::close(in);
        ::close(out);
        return std::unexpected(e);
      }
      done += w;
    }
    total += static_cast<std::uint64_t>(n);
  }
  ::close(in);
  const bool synced = ::fsync(out) == 0;
  const auto sync_error = synced ? error{} : io("cannot fsync", dst);
  ::close(out);
  if (!synced) return std::unexpected(sync_error);
  return total;
}

void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

}  // namespace

std::string store_name(const std::string& path, const std::string& sha256) {
  if (!sha256.empty()) return normalize_sha256(sha256) + ".gguf";
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

expected<store_fetch> fetch_from_store(const std::string& store_dir, const std::string& cache_dir,
                                       const std::string& path, const std::string& sha256,
                                       const store_options& options) {
  const std::string name = store_name(path, sha256);
  if (name.empty() || name == "." || name == "..")
    return make_error(errc::invalid_argument, "model path '" + path + "' names no file");
  const std::string source = store_dir + "/" + name;
  const std::string target = cache_dir + "/" + name;
  std::error_code ec;
  if (!fs::is_regular_file(source, ec)) {
    if (ec && ec != std::errc::no_such_file_or_directory)
      return make_error(errc::io_error, "cannot read the model store at " + source + ": " + ec.message());
    return make_error(errc::not_found, "model " + name + " is not in the model store (" + source + ")");
  }
  // What a good copy hashes to: the pinned digest, else the store file's.
  std::string want = sha256.empty() ? std::string() : normalize_sha256(sha256);
  if (want.empty()) {
    auto d = sha256_file(source);
    if (!d) return std::unexpected(d.error());
    want = *d;
  }
  store_fetch out;
  out.path = target;
  if (fs::is_regular_file(target, ec)) {
    auto have = sha256_file(target);
    if (have && *have == want) {
      out.bytes = fs::file_size(target, ec);
      return out;
    }
    fs::remove(target, ec);  // a torn or damaged copy: refused, fetched again below
    out.refused_cached = true;
  }
  fs::create_directories(cache_dir, ec);
  if (ec) return make_error(errc::io_error, "cannot create the model cache " + cache_dir + ": " + ec.message());
  // Temporary copies of this name left by a process killed mid-copy: the
  // cache directory is this node's own, so no one else is writing them.
  const std::string tmp_prefix = "." + name + ".tmp.";
  for (const auto& e : fs::directory_iterator(cache_dir, ec))
    if (e.path().filename().string().rfind(tmp_prefix, 0) == 0) fs::remove(e.path(), ec);
  std::string tmp_template = cache_dir + "/" + tmp_prefix + "XXXXXX";
  const int tmp_fd = ::mkstemp(tmp_template.data());
  if (tmp_fd < 0) return std::unexpected(io("cannot create a temporary file in", cache_dir));
  ::close(tmp_fd);
  const std::string tmp = tmp_template;  // unique: two fetches never write one file
  std::string last_digest;
  const std::uint32_t attempts = options.attempts ? options.attempts : 1;
  for (std::uint32_t attempt = 1; attempt <= attempts; ++attempt) {
    ++out.attempts;
    auto bytes = copy_synced(source, tmp);  // (re)creates tmp
    if (!bytes) {
      fs::remove(tmp, ec);
      return std::unexpected(bytes.error());
    }
    if (options.after_copy) options.after_copy(tmp, attempt);
    auto got = sha256_file(tmp);
    if (!got) {
      fs::remove(tmp, ec);
      return std::unexpected(got.error());
    }
    if (*got != want) {
      last_digest = *got;
      fs::remove(tmp, ec);
      continue;
    }
    if (::rename(tmp.c_str(), target.c_str()) != 0) {
      const auto e = io("cannot rename into", target);
      fs::remove(tmp, ec);
      return std::unexpected(e);
    }
    sync_dir(cache_dir);
    out.copied = true;
    out.bytes = *bytes;
    return out;
  }
  return make_error(errc::corrupt_data, "model " + name + " from the store " + source + " hashes to " + last_digest +
                                            " after " + std::to_string(out.attempts) + " copies, not " + want +
                                            (sha256.empty() ? " (the store file's own digest)" : " (the pinned sha256)"));
}

expected<cache_scan> scan_cache_dir(const std::string& cache_dir, std::uint64_t capacity_bytes,
                                    std::size_t max_files) {
  cache_scan out;
  std::error_code ec;
  if (!fs::exists(cache_dir, ec)) return out;  // a first start: nothing cached yet
  fs::directory_iterator it(cache_dir, ec);
  if (ec) return make_error(errc::io_error, "cannot read the model cache " + cache_dir + ": " + ec.message());
  std::size_t seen = 0;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) return make_error(errc::io_error, "cannot read the model cache " + cache_dir + ": " + ec.message());
    const std::string name = it->path().filename().string();
    const bool named_like_ours = !name.empty() && name[0] != '.' && name.size() > 5 &&
                                 name.compare(name.size() - 5, 5, ".gguf") == 0;
    std::error_code fec;
    if (!named_like_ours || !it->is_regular_file(fec) || ++seen > max_files) {
      ++out.skipped;
      continue;
    }
    const auto bytes = it->file_size(fec);
    const auto mtime = it->last_write_time(fec);
    if (fec) {
      ++out.skipped;  // gone or unreadable since listed: fetched again when wanted
      continue;
    }
    // Named as fetch_from_store names its copies, so a deployment's copy is recognized.
    out.kept.push_back({cache_dir + "/" + name, bytes,
                        std::chrono::duration_cast<std::chrono::nanoseconds>(mtime.time_since_epoch()).count()});
  }
  std::sort(out.kept.begin(), out.kept.end(), [](const cached_file& a, const cached_file& b) {
    return a.mtime_ns != b.mtime_ns ? a.mtime_ns < b.mtime_ns : a.path < b.path;
  });
  std::uint64_t total = 0;
  for (const auto& f : out.kept) total += f.bytes;
  // Over capacity (it shrank, or files were put there by hand): the least
  // recently written go, as the running cache would have evicted them.
  std::size_t first_kept = 0;
  while (total > capacity_bytes && first_kept < out.kept.size()) {
    const auto& f = out.kept[first_kept];
    std::error_code rec;
    if (!fs::remove(f.path, rec) && rec)
      return make_error(errc::io_error, "cannot evict " + f.path + " from the model cache: " + rec.message());
    total -= f.bytes;
    out.evicted.push_back(f);
    ++first_kept;
  }
  out.kept.erase(out.kept.begin(), out.kept.begin() + static_cast<std::ptrdiff_t>(first_kept));
  return out;
}

}  // namespace exa::model
