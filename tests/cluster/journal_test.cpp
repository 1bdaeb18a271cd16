// The controller's journal: what is appended survives a reopen; a torn tail
// is cut and reported by record number; damage in the middle refuses to open;
// snapshots replace the log without losing a record.

#include <catch2/catch.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cluster/journal.hpp"
#include "cluster/routing.hpp"

using namespace exa;
using namespace exa::cluster;
using Catch::Matchers::Contains;

namespace {

std::string fresh_dir(const std::string& name) {
  const std::string dir = std::string(EXA_TEST_TMPDIR) + "/journal-" + name + "-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

api::deploy_request dep(const std::string& name, std::uint32_t replicas) {
  api::deploy_request d;
  d.name = name;
  d.model_file = "/models/" + name + " with space.gguf";
  d.replicas = replicas;
  d.routing = "round_robin";
  d.model_sha256 = std::string(63, 'c') + name.substr(0, 1);  // survives the journal (state() is compared)
  return d;
}

std::uintmax_t log_size(const std::string& dir) { return std::filesystem::file_size(dir + "/journal.log"); }

void truncate_log(const std::string& dir, std::uintmax_t size) { std::filesystem::resize_file(dir + "/journal.log", size); }

void flip_byte(const std::string& dir, std::uintmax_t at) {
  std::fstream f(dir + "/journal.log", std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(at));
  f.put(static_cast<char>(c ^ 0x5A));
}

}  // namespace

TEST_CASE("CRC-32 is the IEEE one", "[journal]") {
  CHECK(crc32("123456789", 9) == 0xCBF43926u);
  CHECK(crc32("", 0) == 0u);
}

TEST_CASE("appended records survive a reopen, in order", "[journal]") {
  const auto dir = fresh_dir("reopen");
  durable_state expected_state;
  {
    auto j = journal::open(dir);
    REQUIRE(j.has_value());
    CHECK(j->empty());
    const std::vector<journal_record> records = {
        journal_record::deploy(dep("a", 2)),         journal_record::slot_epoch("a", 0, 1),
        journal_record::slot_epoch("a", 1, 1),       journal_record::replica_taken(2),
        journal_record::scale("a", 3),               journal_record::slot_epoch("a", 0, 2),
        journal_record::deploy(dep("b", 1)),         journal_record::undeploy("b"),
        journal_record::slot_epoch("a", 0, 1),  // an older epoch never lowers it
    };
    for (const auto& r : records) {
      REQUIRE(j->append(r).has_value());
      apply(expected_state, r);
    }
    CHECK(j->state() == expected_state);
  }
  CHECK(expected_state.deployments.size() == 1);
  CHECK(expected_state.deployments.at("a").replicas == 3);
  CHECK(expected_state.epochs.at({"a", 0}) == 2);
  CHECK(expected_state.next_replica_id == 3);

  journal_recovery rep;
  auto again = journal::open(dir, &rep);
  REQUIRE(again.has_value());
  CHECK_FALSE(again->empty());
  CHECK(rep.records_replayed == 9);
  CHECK_FALSE(rep.torn_tail);
  CHECK(again->state() == expected_state);
}

TEST_CASE("a torn tail is cut, reported by record number, and appending goes on", "[journal]") {
  const auto dir = fresh_dir("torn");
  std::uintmax_t after_two = 0;
  {
    auto j = journal::open(dir);
    REQUIRE(j.has_value());
    REQUIRE(j->append(journal_record::deploy(dep("a", 2))).has_value());
    REQUIRE(j->append(journal_record::slot_epoch("a", 0, 1)).has_value());
    after_two = log_size(dir);
    REQUIRE(j->append(journal_record::slot_epoch("a", 1, 1)).has_value());
  }
  SECTION("cut inside the payload") { truncate_log(dir, log_size(dir) - 3); }
  SECTION("cut inside the header") { truncate_log(dir, after_two + 5); }
  SECTION("last record damaged in place") { flip_byte(dir, log_size(dir) - 2); }

  journal_recovery rep;
  auto j = journal::open(dir, &rep);
  REQUIRE(j.has_value());
  CHECK(rep.torn_tail);
  CHECK(rep.torn_record == 3);
  CHECK(rep.torn_offset == after_two);
  CHECK(rep.records_replayed == 2);
  CHECK(j->state().epochs.count({"a", 1}) == 0);
  CHECK(log_size(dir) == after_two);  // cut away, so the next append is whole
  REQUIRE(j->append(journal_record::slot_epoch("a", 1, 4)).has_value());
  j = journal::open(dir, &rep);
  REQUIRE(j.has_value());
  CHECK_FALSE(rep.torn_tail);
  CHECK(j->state().epochs.at({"a", 1}) == 4);
}

TEST_CASE("damage with records after it refuses to open, naming the record", "[journal]") {
  const auto dir = fresh_dir("corrupt");
  std::uintmax_t after_one = 0;
  {
    auto j = journal::open(dir);
    REQUIRE(j.has_value());
    REQUIRE(j->append(journal_record::deploy(dep("a", 2))).has_value());
    after_one = log_size(dir);
    REQUIRE(j->append(journal_record::slot_epoch("a", 0, 1)).has_value());
    REQUIRE(j->append(journal_record::slot_epoch("a", 1, 1)).has_value());
  }
  SECTION("a payload byte") {
    flip_byte(dir, after_one + 10);
    auto j = journal::open(dir);
    REQUIRE_FALSE(j.has_value());
    CHECK(j.error().code == errc::corrupt_data);
    CHECK_THAT(j.error().message, Contains("record 2") && Contains("checksum") && Contains("damaged, not torn"));
  }
  SECTION("a hostile length") {
    flip_byte(dir, after_one + 3);  // the length's top byte
    auto j = journal::open(dir);
    REQUIRE_FALSE(j.has_value());
    CHECK_THAT(j.error().message, Contains("record 2") && Contains("impossible length"));
  }
}

TEST_CASE("a snapshot replaces the log and keeps every record", "[journal]") {
  const auto dir = fresh_dir("snapshot");
  durable_state before;
  {
    auto j = journal::open(dir);
    REQUIRE(j.has_value());
    for (std::uint32_t s = 0; s < 10; ++s) REQUIRE(j->append(journal_record::slot_epoch("a", s, s + 1)).has_value());
    REQUIRE(j->append(journal_record::deploy(dep("a", 10))).has_value());
    REQUIRE(j->snapshot().has_value());
    CHECK(log_size(dir) == 0);
    REQUIRE(j->append(journal_record::replica_taken(41)).has_value());
    before = j->state();
  }
  journal_recovery rep;
  auto j = journal::open(dir, &rep);
  REQUIRE(j.has_value());
  CHECK(rep.from_snapshot);
  CHECK(rep.records_replayed == 1);
  CHECK(j->state() == before);
  CHECK(j->state().next_replica_id == 42);

  std::ofstream(dir + "/snapshot.json") << "{ not json";
  auto broken = journal::open(dir);
  REQUIRE_FALSE(broken.has_value());
  CHECK_THAT(broken.error().message, Contains("snapshot.json is not a valid snapshot"));
}

TEST_CASE("a deployment's tenant survives the journal", "[journal]") {
  api::deploy_request d;
  d.name = "owned";
  d.model_file = "/m.gguf";
  d.tenant = "acme";
  const auto dir = fresh_dir("tenant");
  {
    auto j = cluster::journal::open(dir);
    REQUIRE(j);
    REQUIRE(j->append(cluster::journal_record::deploy(d)));
  }
  auto again = cluster::journal::open(dir);
  REQUIRE(again);
  REQUIRE(again->state().deployments.count("owned"));
  CHECK(again->state().deployments.at("owned").tenant == "acme");
  CHECK(again->state().deployments.at("owned") == d);
}

TEST_CASE("drained nodes survive the log and the snapshot", "[journal]") {
  const auto dir = fresh_dir("drained");
  {
    auto j = journal::open(dir);
    REQUIRE(j);
    REQUIRE(j->append(journal_record::drain_node(3)));
    REQUIRE(j->append(journal_record::drain_node(5)));
    REQUIRE(j->append(journal_record::undrain_node(3)));
  }
  {
    auto j = journal::open(dir);
    REQUIRE(j);
    CHECK(j->state().drained_nodes == std::set<node_id>{5});
    REQUIRE(j->append(journal_record::drain_node(7)));
    REQUIRE(j->snapshot());
  }
  journal_recovery rep;
  auto j = journal::open(dir, &rep);
  REQUIRE(j);
  CHECK(rep.from_snapshot);
  CHECK(rep.records_replayed == 0);
  CHECK(j->state().drained_nodes == std::set<node_id>{5, 7});
}

TEST_CASE("current versions and unfinished rollouts survive the log and the snapshot", "[journal]") {
  const auto dir = fresh_dir("versions");
  {
    auto j = journal::open(dir);
    REQUIRE(j);
    REQUIRE(j->append(journal_record::rollout_begin("tiny", "tiny", "tiny@2", 3)));
    REQUIRE(j->append(journal_record::version_current("tiny", "tiny@2")));
    REQUIRE(j->append(journal_record::rollout_end("tiny")));
    REQUIRE(j->append(journal_record::rollout_begin("tiny", "tiny@2", "tiny@3", 4)));
    REQUIRE(j->append(journal_record::rollout_begin("big", "big", "big@7", 1)));
    REQUIRE(j->append(journal_record::version_current("big", "big")));  // back to the plain name: no entry
  }
  {
    auto j = journal::open(dir);
    REQUIRE(j);
    CHECK(j->state().current_versions == std::map<std::string, std::string>{{"tiny", "tiny@2"}});
    REQUIRE(j->state().rollouts.size() == 2);
    CHECK(j->state().rollouts.at("tiny") == durable_state::rollout_entry{"tiny@2", "tiny@3", 4});
    REQUIRE(j->snapshot());
  }
  auto j = journal::open(dir);
  REQUIRE(j);
  CHECK(j->state().current_versions.at("tiny") == "tiny@2");
  CHECK(j->state().rollouts.at("big") == durable_state::rollout_entry{"big", "big@7", 1});
  CHECK(j->state().rollouts.at("tiny").to == "tiny@3");
  CHECK(j->state().used_versions.at("tiny") == std::set<std::string>{"2", "3"});  // even once ended
}

TEST_CASE("a deployment's chat template text survives the log and the snapshot", "[journal][chat_template]") {
  api::deploy_request d = dep("chat", 1);
  d.chat_template = "{% for m in messages %}[{{ m.role }}]\n{{ m.content | trim }}\x01{% endfor %}";
  const auto dir = fresh_dir("chat-template");
  {
    auto j = journal::open(dir);
    REQUIRE(j);
    REQUIRE(j->append(journal_record::deploy(d)));
  }
  auto again = journal::open(dir);
  REQUIRE(again);
  CHECK(again->state().deployments.at("chat").chat_template == d.chat_template);
  REQUIRE(again->snapshot());
  auto from_snapshot = journal::open(dir);
  REQUIRE(from_snapshot);
  CHECK(from_snapshot->state().deployments.at("chat") == d);
}

TEST_CASE("journals written before per-deployment chat templates still load, with none", "[journal][chat_template]") {
  const auto dir = fresh_dir("chat-template-old");
  std::filesystem::create_directories(dir);
  // A record exactly as an older controller appended it: no chat_template key.
  const std::string payload =
      R"({"op":"deploy","deployment":{"name":"old","model_file":"/m.gguf","replicas":2,"kv_tokens":0,)"
      R"("routing":"","max_replicas_per_node":0}})";
  std::string frame;
  for (std::uint32_t v : {static_cast<std::uint32_t>(payload.size()), crc32(payload.data(), payload.size())})
    for (int i = 0; i < 4; ++i) frame.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  std::ofstream(dir + "/journal.log", std::ios::binary) << frame << payload;
  auto j = journal::open(dir);
  REQUIRE(j);
  REQUIRE(j->state().deployments.count("old"));
  CHECK(j->state().deployments.at("old").replicas == 2);
  CHECK(j->state().deployments.at("old").chat_template.empty());
}

TEST_CASE("a deployment's draft model survives the log and the snapshot, and older journals load with none",
          "[journal][speculative]") {
  api::deploy_request d = dep("spec", 2);
  d.draft_model = "/models/draft.gguf";
  d.draft_sha256 = std::string(64, 'b');
  d.draft_tokens = 6;
  const auto dir = fresh_dir("draft-model");
  {
    auto j = journal::open(dir);
    REQUIRE(j);
    REQUIRE(j->append(journal_record::deploy(d)));
  }
  auto again = journal::open(dir);
  REQUIRE(again);
  CHECK(again->state().deployments.at("spec") == d);
  REQUIRE(again->snapshot());
  auto from_snapshot = journal::open(dir);
  REQUIRE(from_snapshot);
  CHECK(from_snapshot->state().deployments.at("spec") == d);
  CHECK(from_snapshot->state().deployments.at("spec").draft_tokens == 6);

  // The chat-template test's old record has no draft keys: none, default k.
  const auto old_dir = fresh_dir("draft-model-old");
  std::filesystem::create_directories(old_dir);
  const std::string payload =
      R"({"op":"deploy","deployment":{"name":"old","model_file":"/m.gguf","replicas":1,"kv_tokens":0,)"
      R"("routing":"","max_replicas_per_node":0}})";
  std::string frame;
  for (std::uint32_t v : {static_cast<std::uint32_t>(payload.size()), crc32(payload.data(), payload.size())})
    for (int i = 0; i < 4; ++i) frame.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  std::ofstream(old_dir + "/journal.log", std::ios::binary) << frame << payload;
  auto old = journal::open(old_dir);
  REQUIRE(old);
  CHECK(old->state().deployments.at("old").draft_model.empty());
  CHECK(old->state().deployments.at("old").draft_sha256.empty());
  CHECK(old->state().deployments.at("old").draft_tokens == 0);
}

TEST_CASE("a deployment's prefix slack survives the log and the snapshot, and older journals load what they ran with",
          "[journal][routing][prefix]") {
  api::deploy_request d = dep("slack", 2);
  d.routing = "prefix_aware";
  d.prefix_slack_tokens = 512;
  d.prefix_slack_ratio = 0.75;
  d.prefix_slack_s = 1.5;
  const auto dir = fresh_dir("prefix-slack");
  {
    auto j = journal::open(dir);
    REQUIRE(j);
    REQUIRE(j->append(journal_record::deploy(d)));
  }
  auto again = journal::open(dir);
  REQUIRE(again);
  CHECK(again->state().deployments.at("slack") == d);
  REQUIRE(again->snapshot());
  auto from_snapshot = journal::open(dir);
  REQUIRE(from_snapshot);
  CHECK(from_snapshot->state().deployments.at("slack").prefix_slack_tokens == 512);
  CHECK(from_snapshot->state().deployments.at("slack").prefix_slack_ratio == 0.75);
  CHECK(from_snapshot->state().deployments.at("slack").prefix_slack_s == 1.5);

  const auto old_dir = fresh_dir("prefix-slack-old");
  std::filesystem::create_directories(old_dir);
  const std::string payload =
      R"({"op":"deploy","deployment":{"name":"old","model_file":"/m.gguf","replicas":1,"kv_tokens":0,)"
      R"("routing":"prefix_aware","max_replicas_per_node":0}})";
  std::string frame;
  for (std::uint32_t v : {static_cast<std::uint32_t>(payload.size()), crc32(payload.data(), payload.size())})
    for (int i = 0; i < 4; ++i) frame.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  std::ofstream(old_dir + "/journal.log", std::ios::binary) << frame << payload;
  auto old = journal::open(old_dir);
  REQUIRE(old);
  CHECK(old->state().deployments.at("old").prefix_slack_tokens == cluster::prefix_aware_config{}.load_slack_tokens);
  CHECK(old->state().deployments.at("old").prefix_slack_ratio == cluster::prefix_aware_config{}.load_slack_ratio);
  // Written before the slack in time: tokens alone, as it ran.
  CHECK(old->state().deployments.at("old").prefix_slack_s == 0);
}
