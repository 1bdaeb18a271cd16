// Which nodes hold a deployment's file, from the files each node announced
// when it joined (its cache directory at start), and how that steers
// placement: the decision the controller feeds into cached_on.

#include <catch2/catch.hpp>

#include <cctype>

#include "cluster/hardware.hpp"
#include "cluster/node_cache.hpp"
#include "cluster/placement.hpp"

using namespace exa;
using namespace exa::cluster;

namespace {

const std::string digest_a = "a3f1c9e2b7d4058e6a1f2c3b4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f70";
const std::string digest_b = "00000000000000000000000000000000000000000000000000000000000000bb";

}  // namespace

TEST_CASE("a cached file matches a deployment by the cache's own naming", "[node_cache]") {
  // Unpinned: by the path's file name.
  CHECK(holds_model({"llama.gguf", 10, ""}, "/models/llama.gguf", ""));
  CHECK(holds_model({"llama.gguf", 10, ""}, "llama.gguf", ""));
  CHECK_FALSE(holds_model({"llama.gguf", 10, ""}, "/models/other.gguf", ""));
  CHECK_FALSE(holds_model({"", 10, ""}, "", ""));
  // Pinned: by "<sha256>.gguf" (any case in the deployment) ...
  CHECK(holds_model({digest_a + ".gguf", 10, ""}, "/models/llama.gguf", digest_a));
  std::string upper = digest_a;
  for (auto& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  CHECK(holds_model({digest_a + ".gguf", 10, ""}, "/models/llama.gguf", upper));
  // ... not by the path's name, which another version of the file may carry ...
  CHECK_FALSE(holds_model({"llama.gguf", 10, ""}, "/models/llama.gguf", digest_a));
  // ... or by a digest the node verified, whatever the file is called.
  CHECK(holds_model({"llama.gguf", 10, digest_a}, "/models/llama.gguf", digest_a));
  // A verified digest that differs never matches, even under the right name.
  CHECK_FALSE(holds_model({digest_a + ".gguf", 10, digest_b}, "/x.gguf", digest_a));
}

TEST_CASE("nodes holding a file are those that announced it", "[node_cache]") {
  std::map<node_id, std::vector<cached_file>> files;
  files[0] = {{"other.gguf", 1, ""}};
  files[2] = {{"other.gguf", 1, ""}, {"llama.gguf", 7, ""}};
  files[5] = {{digest_a + ".gguf", 7, ""}};
  files[6] = {};
  CHECK(nodes_holding(files, "/m/llama.gguf", "") == std::set<node_id>{2});
  CHECK(nodes_holding(files, "/m/other.gguf", "") == std::set<node_id>{0, 2});
  CHECK(nodes_holding(files, "/m/llama.gguf", digest_a) == std::set<node_id>{5});
  CHECK(nodes_holding(files, "/m/none.gguf", "").empty());
  CHECK(nodes_holding({}, "/m/llama.gguf", "").empty());
}

TEST_CASE("an announcement keeps plain names and sane digests, within its bound", "[node_cache]") {
  std::size_t dropped = 0;
  std::string why;
  std::string upper = digest_a;
  for (auto& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  auto kept = sanitize_cached_files({{"ok.gguf", 5, ""},
                                     {"../etc/passwd", 1, ""},
                                     {"", 1, ""},
                                     {"..", 1, ""},
                                     {"x.gguf", 1, "not-a-digest"},
                                     {"y.gguf", 3, upper}},
                                    &dropped, &why);
  REQUIRE(kept.size() == 2);
  CHECK(kept[0] == cached_file{"ok.gguf", 5, ""});
  CHECK(kept[1].sha256 == digest_a);  // kept lowercase
  CHECK(dropped == 4);
  CHECK_THAT(why, Catch::Contains("../etc/passwd"));
  std::vector<cached_file> many(cached_files_max + 3, cached_file{"m.gguf", 1, ""});
  CHECK(sanitize_cached_files(many, &dropped).size() == cached_files_max);
  CHECK(dropped == 3);
}

TEST_CASE("a node announcing the file wins placement after spreading, as a loaded one does", "[node_cache][placement]") {
  std::vector<node_info> nodes;
  for (node_id n = 0; n < 4; ++n) nodes.push_back({n, n, 1, 81559 * mib_bytes});
  auto state = cluster_state::create(nodes, gpu_device_reserved_bytes);
  REQUIRE(state);
  std::map<node_id, std::vector<cached_file>> files;
  files[2] = {{"llama-2-7b.gguf", 13 * gib_bytes, ""}};
  deployment_spec d;
  d.name = "m";
  d.model = *model_shape_preset("llama-2-7b", precision::fp16);
  d.replicas = 1;
  d.replica.kv_tokens = 4096;
  d.cached_on = nodes_holding(files, "/models/llama-2-7b.gguf", "");
  auto plan = place(*state, {d});
  REQUIRE(plan);
  REQUIRE(plan->placed.size() == 1);
  CHECK(plan->placed[0].node == 2);  // all alike otherwise: node 0 would win
  // Without the announcement, the lowest id.
  auto fresh = cluster_state::create(nodes, gpu_device_reserved_bytes);
  d.cached_on.clear();
  auto plain = place(*fresh, {d});
  REQUIRE(plain);
  CHECK(plain->placed[0].node == 0);
}
