#include "cluster_fixture.hpp"

#include <catch2/catch.hpp>

#include <filesystem>

#include <caf/actor_registry.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>

#include "actors/cluster_supervisor.hpp"
#include "actors/messages.hpp"
#include "model/model_gen.hpp"

namespace exa::test {

std::vector<std::int32_t> recording_sink::tokens() const {
  std::vector<std::int32_t> out;
  for (const auto& c : chunks) out.insert(out.end(), c.tokens.begin(), c.tokens.end());
  return out;
}

std::string recording_sink::text() const {
  std::string out;
  for (const auto& c : chunks) out += c.text;
  return out;
}

const std::string& tiny_model_path() {
  static const std::string path = [] {
    const std::string dir = std::string(EXA_TEST_TMPDIR) + "/actors";
    std::filesystem::create_directories(dir);
    const std::string p = dir + "/tiny.gguf";
    auto spec = *model::preset_spec("tiny");
    REQUIRE(model::generate_model(spec, p));
    return p;
  }();
  return path;
}

actors::cluster_options cluster_fixture::defaults(std::uint32_t replicas) {
  actors::cluster_options o;
  o.deterministic = true;
  o.nodes = 2;
  o.devices_per_node = 2;
  o.device_memory_bytes = 64ull << 20;
  o.default_model_file = tiny_model_path();
  o.default_kv_tokens = 2048;
  api::deploy_request d;
  d.name = "tiny";
  d.replicas = replicas;
  o.deployments.push_back(d);
  return o;
}

cluster_fixture::cluster_fixture(actors::cluster_options options) {
  auto c = actors::embedded_cluster::start(std::move(options));
  REQUIRE(c.has_value());
  cluster_ = std::move(*c);
  sched_ = cluster_->test_scheduler();
  REQUIRE(sched_ != nullptr);
  backend_ = cluster_->backend();
  run();
}

cluster_fixture::~cluster_fixture() {
  cluster_->stop();
}

void cluster_fixture::run() {
  for (int guard = 0; sched_->run() > 0; ++guard) REQUIRE(guard < 100000);
}

void cluster_fixture::advance(std::chrono::milliseconds total, std::chrono::milliseconds step) {
  for (auto t = std::chrono::milliseconds(0); t < total; t += step) {
    sched_->advance_time(step);
    run();
  }
}

void cluster_fixture::run_some(std::size_t jobs) { sched_->run(jobs); }

caf::actor cluster_fixture::node(std::uint32_t id) {
  auto controller = caf::actor_cast<caf::actor>(system().registry().get(actors::controller_atom::value));
  REQUIRE(controller);
  auto out = std::make_shared<caf::actor>();
  system().spawn([=](caf::event_based_actor* self) {
    self->request(controller, std::chrono::seconds(1), actors::get_node{id}).then([=](const caf::actor& a) { *out = a; });
  });
  run();
  return *out;
}

void cluster_fixture::kill_replica(std::uint32_t node_id, std::uint64_t replica) {
  auto n = node(node_id);
  REQUIRE(n);
  caf::anon_send(n, actors::kill_replica{replica});
  run();
}

api::cluster_status cluster_fixture::status() {
  std::optional<expected<api::cluster_status>> out;
  backend_->status([&](expected<api::cluster_status> s) { out = std::move(s); });
  run();
  REQUIRE(out.has_value());
  if (!out->has_value()) FAIL("status failed: " << to_string(out->error()));
  return **out;
}

bool cluster_fixture::ready() {
  std::optional<bool> out;
  backend_->ready([&](bool r) { out = r; });
  run();
  REQUIRE(out.has_value());
  return *out;
}

std::shared_ptr<recording_sink> cluster_fixture::generate(api::generate_request req) {
  auto sink = std::make_shared<recording_sink>();
  backend_->generate(std::move(req), sink);
  return sink;
}

std::shared_ptr<recording_sink> cluster_fixture::generate_short(std::string model) {
  api::generate_request g;
  g.model = std::move(model);
  g.prompt_text = "Hello";
  g.max_tokens = 4;
  auto sink = generate(std::move(g));
  run();
  return sink;
}

std::size_t replicas_up(const api::cluster_status& s, std::string_view deployment) {
  std::size_t n = 0;
  for (const auto& r : s.replicas)
    n += (deployment.empty() || r.deployment == deployment) && (r.state == "ready" || r.state == "serving");
  return n;
}

}  // namespace exa::test
