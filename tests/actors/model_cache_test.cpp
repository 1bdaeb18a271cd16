// The node's model cache by content: a pinned sha256 is checked before a
// model is used, a file missing at its path is found in the model directory,
// deployments of the same bytes share one load, and a deployment whose file
// has other bytes never gets a ready replica.

#include <catch2/catch.hpp>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/scoped_actor.hpp>

#include <filesystem>
#include <fstream>

#include "actors/messages.hpp"
#include "actors/model_cache_actor.hpp"
#include "cluster_fixture.hpp"
#include "model/file_digest.hpp"
#include "model/llama_model.hpp"

using namespace exa;
using namespace std::chrono_literals;

namespace {

struct cache_system {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  explicit cache_system() {
    actors::register_message_types(cfg);
    sys = std::make_unique<caf::actor_system>(cfg);
  }
};

// Asks the cache for a model (bounded wait: the reply comes from a real thread).
actors::model_handle acquire(caf::actor_system& sys, const caf::actor& cache, const std::string& path,
                             const std::string& sha) {
  caf::scoped_actor self{sys};
  actors::model_handle out;
  self->request(cache, std::chrono::seconds(20), actors::acquire_model{path, sha})
      .receive([&](const actors::model_handle& h) { out = h; },
               [&](const caf::error& e) { FAIL("no answer from the model cache: " << sys.render(e)); });
  return out;
}

}  // namespace

TEST_CASE("the model cache checks a pinned sha256 and finds files in its model directory", "[actors][models]") {
  const std::string& model = test::tiny_model_path();
  const auto sha = model::sha256_file(model);
  REQUIRE(sha);
  const std::string dir = std::string(EXA_TEST_TMPDIR) + "/model-dir";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(model, dir + "/" + *sha + ".gguf", std::filesystem::copy_options::overwrite_existing);
  cache_system cs;
  auto cache = cs.sys->spawn(actors::model_cache_actor, cluster::node_id{7}, actors::model_cache_config{1ull << 30, dir, {}, {}});

  const auto at_path = acquire(*cs.sys, cache, model, *sha);
  REQUIRE(at_path.model);
  // Missing where the deployment says: found by its digest in the model dir.
  // The same bytes are one entry, so it is the very same loaded model.
  const auto by_digest = acquire(*cs.sys, cache, "/elsewhere/tiny.gguf", *sha);
  REQUIRE(by_digest.model);
  CHECK(by_digest.model == at_path.model);

  const std::string other(64, '0');
  const auto wrong = acquire(*cs.sys, cache, model, other);
  CHECK_FALSE(wrong.model);
  CHECK(wrong.error.to_error().code == errc::corrupt_data);
  CHECK(wrong.error.to_error().message ==
        "model file " + model + " on node 7 has sha256 " + *sha + ", the deployment wants " + other);

  // Other bytes at the deployed path, the right ones in the model dir: the
  // node uses the model dir's.
  const std::string stale = dir + "/stale-copy.gguf";
  { std::ofstream(stale, std::ios::binary) << "not the model"; }
  auto fresh = cs.sys->spawn(actors::model_cache_actor, cluster::node_id{8}, actors::model_cache_config{1ull << 30, dir, {}, {}});  // nothing loaded yet
  const auto from_dir = acquire(*cs.sys, fresh, stale, *sha);
  REQUIRE(from_dir.model);
  CHECK(from_dir.model->config().vocab_size == at_path.model->config().vocab_size);
  caf::anon_send_exit(fresh, caf::exit_reason::user_shutdown);

  const auto nowhere = acquire(*cs.sys, cache, "/elsewhere/absent.gguf", other);
  CHECK_FALSE(nowhere.model);
  CHECK(nowhere.error.to_error().code == errc::not_found);
  CHECK(nowhere.error.to_error().message.find("node 7: model file not found (tried /elsewhere/absent.gguf, " + dir) ==
        0);
  caf::anon_send_exit(cache, caf::exit_reason::user_shutdown);
}

TEST_CASE("a deployment pinned to other bytes gets no ready replica, the right digest serves", "[actors][models]") {
  auto o = test::cluster_fixture::defaults(1);
  const auto sha = model::sha256_file(test::tiny_model_path());
  REQUIRE(sha);
  o.deployments[0].model_sha256 = *sha;
  api::deploy_request bad;
  bad.name = "pinned-wrong";
  bad.replicas = 1;
  bad.model_sha256 = std::string(64, 'f');
  o.deployments.push_back(bad);
  test::cluster_fixture f(o);
  f.advance(2000ms);
  const auto s = f.status();
  CHECK(test::replicas_up(s, "tiny") == 1);
  CHECK(test::replicas_up(s, "pinned-wrong") == 0);
  auto sink = f.generate_short("tiny");
  REQUIRE(sink->result);
  CHECK_FALSE(sink->result->err);
}

namespace {
void release(const caf::actor& cache, const std::string& path, const std::string& sha) {
  caf::anon_send(cache, actors::release_model{path, sha});
}
}  // namespace

TEST_CASE("the model cache evicts by bytes, never a model in use, and fetches from the store", "[actors][models]") {
  const std::string& model = test::tiny_model_path();
  const auto bytes = std::filesystem::file_size(model);
  const std::string dir = std::string(EXA_TEST_TMPDIR) + "/model-cache-bytes";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/store");
  std::filesystem::copy_file(model, dir + "/a.gguf");
  std::filesystem::copy_file(model, dir + "/store/b.gguf");  // only in the store
  cache_system cs;
  // Room for one model and a half: two in use overflow it; neither may go.
  auto cache = cs.sys->spawn(actors::model_cache_actor, cluster::node_id{9},
                             actors::model_cache_config{bytes + bytes / 2, "", dir + "/store", dir + "/cache"});
  const auto a = acquire(*cs.sys, cache, dir + "/a.gguf", "");
  REQUIRE(a.model);
  const auto b = acquire(*cs.sys, cache, "/not/on/this/node/b.gguf", "");
  INFO(b.error.to_error().message);
  REQUIRE(b.model);  // fetched from the store into the cache directory
  CHECK(std::filesystem::exists(dir + "/cache/b.gguf"));
  CHECK(acquire(*cs.sys, cache, dir + "/a.gguf", "").model == a.model);  // both stayed: in use
  // a released twice (two acquires): now the least recently used unpinned one.
  release(cache, dir + "/a.gguf", "");
  release(cache, dir + "/a.gguf", "");
  const auto b2 = acquire(*cs.sys, cache, "/not/on/this/node/b.gguf", "");  // a round trip: the releases are done
  CHECK(b2.model == b.model);
  const auto a2 = acquire(*cs.sys, cache, dir + "/a.gguf", "");
  REQUIRE(a2.model);
  CHECK(a2.model != a.model);  // a was evicted when released, so it loaded again
  // b released: evicted as the least recently used, and its fetched file deleted.
  release(cache, "/not/on/this/node/b.gguf", "");
  release(cache, "/not/on/this/node/b.gguf", "");
  (void)acquire(*cs.sys, cache, dir + "/a.gguf", "");  // a round trip
  CHECK_FALSE(std::filesystem::exists(dir + "/cache/b.gguf"));
  caf::anon_send_exit(cache, caf::exit_reason::user_shutdown);
}

TEST_CASE("a release that comes before its delayed load completes still unpins the model", "[actors][models]") {
  // A replica that stops while its model is still loading releases it at
  // once; the cache pins the model when the load completes, and must drop
  // that pin, or the model could never be evicted.
  const std::string& model = test::tiny_model_path();
  const std::string dir = std::string(EXA_TEST_TMPDIR) + "/model-cache-early-release";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/store");
  std::filesystem::copy_file(model, dir + "/a.gguf");
  std::filesystem::copy_file(model, dir + "/store/b.gguf");
  cache_system cs;
  auto cache = cs.sys->spawn(actors::model_cache_actor, cluster::node_id{10},
                             actors::model_cache_config{1, "", dir + "/store", dir + "/cache"});  // room for nothing unpinned
  caf::anon_send(cache, actors::inject_fault{"slow_load", 0, 60000, 200});
  caf::anon_send(cache, actors::acquire_model{"/nowhere/b.gguf", ""});  // its asker is gone by the time it loads
  caf::anon_send(cache, actors::release_model{"/nowhere/b.gguf", ""});
  // Queued behind b's delayed load: when a is answered, b's load is done.
  const auto a = acquire(*cs.sys, cache, dir + "/a.gguf", "");
  REQUIRE(a.model);
  CHECK_FALSE(std::filesystem::exists(dir + "/cache/b.gguf"));  // fetched, then unpinned and evicted
  caf::anon_send_exit(cache, caf::exit_reason::user_shutdown);
}

TEST_CASE("a node's cache directory from an earlier run is counted at start and reused without a copy",
          "[actors][models]") {
  const std::string& model = test::tiny_model_path();
  const auto bytes = std::filesystem::file_size(model);
  const std::string dir = std::string(EXA_TEST_TMPDIR) + "/model-cache-scan";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/store");
  std::filesystem::create_directories(dir + "/cache");
  std::filesystem::copy_file(model, dir + "/store/b.gguf");
  std::filesystem::copy_file(model, dir + "/store/c.gguf");
  std::filesystem::copy_file(model, dir + "/cache/b.gguf");  // fetched by an earlier run
  { std::ofstream(dir + "/cache/old.gguf", std::ios::binary) << "an older copy no one asked for yet"; }
  const auto now = std::filesystem::file_time_type::clock::now();
  std::filesystem::last_write_time(dir + "/cache/old.gguf", now - std::chrono::seconds(600));
  const auto b_written = now - std::chrono::seconds(300);
  std::filesystem::last_write_time(dir + "/cache/b.gguf", b_written);
  cache_system cs;
  // Room for one model and a half: b and old fit; c too only once old goes.
  auto cache = cs.sys->spawn(actors::model_cache_actor, cluster::node_id{11},
                             actors::model_cache_config{bytes + bytes / 2, "", dir + "/store", dir + "/cache"});
  const auto b = acquire(*cs.sys, cache, "/not/on/this/node/b.gguf", "");
  INFO(b.error.to_error().message);
  REQUIRE(b.model);
  // The copy was checked and used as it was, not copied again.
  CHECK(std::filesystem::last_write_time(dir + "/cache/b.gguf") == b_written);
  CHECK(std::filesystem::exists(dir + "/cache/old.gguf"));
  // c needs room: the copy found at start counts and is the least recently
  // used, so it goes (b is in use and stays).
  const auto c = acquire(*cs.sys, cache, "/not/on/this/node/c.gguf", "");
  REQUIRE(c.model);
  CHECK_FALSE(std::filesystem::exists(dir + "/cache/old.gguf"));
  CHECK(std::filesystem::exists(dir + "/cache/b.gguf"));
  caf::anon_send_exit(cache, caf::exit_reason::user_shutdown);
}

TEST_CASE("the model cache lists what it holds: copies found at start by size, loaded models with their digest",
          "[actors][models][node_cache]") {
  const std::string& model = test::tiny_model_path();
  const auto sha = model::sha256_file(model);
  REQUIRE(sha);
  const auto bytes = std::filesystem::file_size(model);
  const std::string dir = std::string(EXA_TEST_TMPDIR) + "/model-cache-list";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/cache");
  std::filesystem::copy_file(model, dir + "/cache/earlier.gguf");
  cache_system cs;
  auto cache = cs.sys->spawn(actors::model_cache_actor, cluster::node_id{3},
                             actors::model_cache_config{8 * bytes, "", "", dir + "/cache"});
  const auto list = [&] {
    caf::scoped_actor self{*cs.sys};
    actors::cached_files_msg out;
    self->request(cache, std::chrono::seconds(20), actors::cache_contents_atom::value)
        .receive([&](const actors::cached_files_msg& m) { out = m; },
                 [&](const caf::error& e) { FAIL("no answer from the model cache: " << cs.sys->render(e)); });
    return out.files;
  };
  // At start: the scanned copy, its size, no digest (nothing was hashed).
  auto files = list();
  REQUIRE(files.size() == 1);
  CHECK(files[0] == cluster::cached_file{"earlier.gguf", bytes, ""});
  // A model loaded under its pinned digest is listed with it (checked at load).
  const auto h = acquire(*cs.sys, cache, model, *sha);
  REQUIRE(h.model);
  files = list();
  REQUIRE(files.size() == 2);
  CHECK(files[0] == cluster::cached_file{std::filesystem::path(model).filename().string(), bytes, *sha});
  CHECK(files[1].name == "earlier.gguf");
  caf::anon_send_exit(cache, caf::exit_reason::user_shutdown);
}

namespace {

// Where one replica of `tiny` lands on 3 single-device nodes, when node 2's
// cache directory does (or does not) hold a copy of its file from an
// earlier run.
std::uint32_t home_of_new_deployment(bool node2_warm) {
  const std::string& model = test::tiny_model_path();
  const std::string dir = std::string(EXA_TEST_TMPDIR) + "/node-cache-join";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/cache/node-2");
  if (node2_warm)
    std::filesystem::copy_file(model, dir + "/cache/node-2/" + std::filesystem::path(model).filename().string());
  auto o = test::cluster_fixture::defaults(1);
  o.nodes = 3;
  o.devices_per_node = 1;
  o.model_cache_dir = dir + "/cache";
  o.deployments.clear();
  test::cluster_fixture f(o);
  f.advance(100ms);  // every node has joined
  api::deploy_request d;
  d.name = "tiny";
  d.replicas = 1;
  std::optional<expected<void>> out;
  f.backend().deploy(d, [&](expected<void> r) { out = std::move(r); });
  f.advance(200ms);
  REQUIRE(out.has_value());
  REQUIRE(out->has_value());
  const auto st = f.status();
  REQUIRE(st.replicas.size() == 1);
  CHECK(st.replicas[0].state == "ready");
  return st.replicas[0].node;
}

}  // namespace

TEST_CASE("a node whose cache directory holds the file at start is preferred from its join on",
          "[actors][models][node_cache]") {
  // No replica ever loaded the file anywhere: only node 2's join says it has it.
  CHECK(home_of_new_deployment(true) == 2);
  // The control: all nodes alike, the lowest id.
  CHECK(home_of_new_deployment(false) == 0);
}
