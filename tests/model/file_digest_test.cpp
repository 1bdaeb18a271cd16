// Model files by content: SHA-256 of a file, remembered until the file
// changes, and where a node finds a deployment's file.

#include <catch2/catch.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "model/file_digest.hpp"

using namespace exa;
using namespace exa::model;

namespace {

std::string temp_file(const std::string& name, const std::string& bytes) {
  const auto dir = std::filesystem::path(EXA_TEST_TMPDIR) / "digest";
  std::filesystem::create_directories(dir);
  const auto p = (dir / (name + "-" + std::to_string(::getpid()))).string();
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}

}  // namespace

TEST_CASE("sha256_file gives the standard digests", "[model][digest]") {
  // FIPS 180-2 test vectors.
  CHECK(*sha256_file(temp_file("abc", "abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(*sha256_file(temp_file("empty", "")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  // Larger than one read buffer (1 MiB): a million 'a's.
  CHECK(*sha256_file(temp_file("million", std::string(1000000, 'a'))) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  auto missing = sha256_file("/nonexistent/model.gguf");
  REQUIRE_FALSE(missing);
  CHECK(missing.error().code == errc::io_error);
  CHECK(missing.error().message.find("/nonexistent/model.gguf") != std::string::npos);
}

TEST_CASE("digests are checked for shape and compared in lower case", "[model][digest]") {
  const std::string d = "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD";
  CHECK(is_sha256_hex(d));
  CHECK(normalize_sha256(d) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK_FALSE(is_sha256_hex(d.substr(1)));
  CHECK_FALSE(is_sha256_hex(std::string(63, 'a') + "g"));
  CHECK_FALSE(is_sha256_hex(""));
}

TEST_CASE("a file is hashed once until it changes", "[model][digest]") {
  const auto p = temp_file("cached", "abc");
  file_digest_cache cache;
  const auto first = cache.sha256(p);
  REQUIRE(first);
  CHECK(*cache.sha256(p) == *first);
  CHECK(cache.hashed() == 1);  // the second answer came from memory
  std::ofstream(p, std::ios::binary) << "abcd";  // new size (and time): hashed again
  const auto second = cache.sha256(p);
  REQUIRE(second);
  CHECK(*second == "88d4266fd4e6338d13b845fcf289579d209c897823b9217da3e161936f031589");
  CHECK(cache.hashed() == 2);
  CHECK_FALSE(cache.sha256("/nonexistent/x"));
}

TEST_CASE("a node finds a model at its path or in its model directory", "[model][digest]") {
  const std::string sha(64, 'a');
  std::set<std::string> files;
  const auto exists = [&](const std::string& p) { return files.count(p) != 0; };
  files = {"/models/llama.gguf"};
  CHECK(*locate_model("/models/llama.gguf", sha, "/cache", exists) == "/models/llama.gguf");
  // Missing at its path: by digest first, then by file name.
  files = {"/cache/" + sha + ".gguf", "/cache/llama.gguf"};
  CHECK(*locate_model("/models/llama.gguf", sha, "/cache", exists) == "/cache/" + sha + ".gguf");
  CHECK(*locate_model("/models/llama.gguf", "", "/cache", exists) == "/cache/llama.gguf");
  files = {"/cache/" + sha + ".gguf"};
  CHECK(*locate_model("/models/llama.gguf", std::string(64, 'A'), "/cache", exists) == "/cache/" + sha + ".gguf");
  // Nowhere: every place tried is named.
  files.clear();
  auto none = locate_model("/models/llama.gguf", sha, "/cache", exists);
  REQUIRE_FALSE(none);
  CHECK(none.error().code == errc::not_found);
  CHECK(none.error().message ==
        "model file not found (tried /models/llama.gguf, /cache/" + sha + ".gguf, /cache/llama.gguf)");
  auto no_dir = locate_model("/models/llama.gguf", sha, "", exists);
  REQUIRE_FALSE(no_dir);
  CHECK(no_dir.error().message.find("no --model-dir") != std::string::npos);
}
