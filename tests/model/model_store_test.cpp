// Model files from the store into a node's cache: copied under a temporary
// name, checked and renamed; a damaged copy (in the cache already, or made
// now) is refused and fetched again; a store file with other bytes than the
// pinned digest is refused, leaving nothing in the cache.

#include <catch2/catch.hpp>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "model/file_digest.hpp"
#include "model/model_store.hpp"

using namespace exa;
using namespace exa::model;
namespace fs = std::filesystem;

namespace {

std::string fresh(const std::string& name) {
  const std::string dir = std::string(EXA_TEST_TMPDIR) + "/store-" + name + "-" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir + "/store");
  return dir;
}

void write(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void flip_first_byte(const std::string& path) {
  auto s = read(path);
  s[0] = static_cast<char>(s[0] ^ 0x5a);
  write(path, s);
}

std::size_t files_in(const std::string& dir) {
  std::size_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) n += e.is_regular_file() ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("a model comes from the store by name, once", "[store]") {
  const auto dir = fresh("name");
  const std::string body(300000, 'w');
  write(dir + "/store/m.gguf", body);
  auto f = fetch_from_store(dir + "/store", dir + "/cache", "/deployed/at/m.gguf", "");
  REQUIRE(f);
  CHECK(f->copied);
  CHECK(f->path == dir + "/cache/m.gguf");
  CHECK(f->bytes == body.size());
  CHECK(read(f->path) == body);
  CHECK(files_in(dir + "/cache") == 1);  // no temporary left
  auto again = fetch_from_store(dir + "/store", dir + "/cache", "m.gguf", "");
  REQUIRE(again);
  CHECK_FALSE(again->copied);
}

TEST_CASE("a pinned digest names the file, and a damaged cached copy is refetched", "[store]") {
  const auto dir = fresh("pinned");
  write(dir + "/store/x", "bytes of the model");
  const auto sha = sha256_file(dir + "/store/x");
  REQUIRE(sha);
  fs::rename(dir + "/store/x", dir + "/store/" + *sha + ".gguf");
  auto f = fetch_from_store(dir + "/store", dir + "/cache", "/m/whatever.gguf", *sha);
  REQUIRE(f);
  CHECK(f->path == dir + "/cache/" + *sha + ".gguf");
  flip_first_byte(f->path);  // bit rot, or a copy a crash cut short
  auto g = fetch_from_store(dir + "/store", dir + "/cache", "/m/whatever.gguf", *sha);
  REQUIRE(g);
  CHECK(g->refused_cached);
  CHECK(g->copied);
  CHECK(*sha256_file(g->path) == *sha);
}

TEST_CASE("a copy damaged on the way is removed and made again", "[store]") {
  const auto dir = fresh("torn");
  write(dir + "/store/m.gguf", std::string(5000, 'q'));
  store_options o;
  o.after_copy = [](const std::string& tmp, std::uint32_t attempt) {
    if (attempt == 1) flip_first_byte(tmp);
  };
  auto f = fetch_from_store(dir + "/store", dir + "/cache", "m.gguf", "", o);
  REQUIRE(f);
  CHECK(f->attempts == 2);
  CHECK(read(f->path) == std::string(5000, 'q'));
}

TEST_CASE("a store file with other bytes than pinned is refused, and nothing is left", "[store]") {
  const auto dir = fresh("wrong");
  const std::string pinned(64, 'a');
  write(dir + "/store/" + pinned + ".gguf", "not the pinned bytes");
  auto f = fetch_from_store(dir + "/store", dir + "/cache", "m.gguf", pinned);
  REQUIRE_FALSE(f);
  CHECK(f.error().code == errc::corrupt_data);
  CHECK_THAT(f.error().message, Catch::Contains(pinned) && Catch::Contains("2 copies"));
  CHECK(files_in(dir + "/cache") == 0);
  auto missing = fetch_from_store(dir + "/store", dir + "/cache", "absent.gguf", "");
  REQUIRE_FALSE(missing);
  CHECK(missing.error().code == errc::not_found);
  CHECK_THAT(missing.error().message, Catch::Contains("absent.gguf"));
}

namespace {

void write_aged(const std::string& path, std::size_t bytes, int age_s) {
  write(path, std::string(bytes, 'm'));
  fs::last_write_time(path, fs::file_time_type::clock::now() - std::chrono::seconds(age_s));
}

}  // namespace

TEST_CASE("a cache directory's model files are found at start, oldest first, by size only", "[model][store]") {
  const auto dir = fresh("scan") + "/cache";
  fs::create_directories(dir + "/sub.gguf");  // a directory, not a file
  write_aged(dir + "/old.gguf", 100, 300);
  write_aged(dir + "/" + std::string(64, 'a') + ".gguf", 200, 100);
  write_aged(dir + "/.new.gguf.tmp.Xy12ab", 50, 10);  // a torn temporary
  write_aged(dir + "/notes.txt", 10, 10);
  auto s = scan_cache_dir(dir, 1000);
  REQUIRE(s);
  REQUIRE(s->kept.size() == 2);
  CHECK(s->kept[0].path == dir + "/old.gguf");
  CHECK(s->kept[0].bytes == 100);
  CHECK(s->kept[1].path == dir + "/" + std::string(64, 'a') + ".gguf");
  CHECK(s->kept[1].bytes == 200);
  CHECK(s->evicted.empty());
  CHECK(s->skipped == 3);
  // Bytes that match no digest are still kept: they are checked on use.
  CHECK(fs::exists(dir + "/old.gguf"));
}

TEST_CASE("a cache directory over capacity at start loses its least recently written files", "[model][store]") {
  const auto dir = fresh("scan-over") + "/cache";
  fs::create_directories(dir);
  write_aged(dir + "/a.gguf", 400, 300);
  write_aged(dir + "/b.gguf", 400, 200);
  write_aged(dir + "/c.gguf", 400, 100);
  auto s = scan_cache_dir(dir, 900);
  REQUIRE(s);
  REQUIRE(s->evicted.size() == 1);
  CHECK(s->evicted[0].path == dir + "/a.gguf");
  CHECK_FALSE(fs::exists(dir + "/a.gguf"));
  REQUIRE(s->kept.size() == 2);
  CHECK(s->kept[0].path == dir + "/b.gguf");
  CHECK(fs::exists(dir + "/c.gguf"));
  // The bound on files looked at: the rest are skipped, not counted.
  auto bounded = scan_cache_dir(dir, 900, 1);
  REQUIRE(bounded);
  CHECK(bounded->kept.size() == 1);
  CHECK(bounded->skipped == 1);
}

TEST_CASE("a missing cache directory is an empty cache", "[model][store]") {
  auto s = scan_cache_dir(fresh("scan-none") + "/no-such-dir", 1000);
  REQUIRE(s);
  CHECK(s->kept.empty());
  CHECK(s->evicted.empty());
}
