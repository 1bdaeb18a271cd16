// Tensor-parallel replicas in the embedded cluster, in virtual time: a
// deployment's tensor_parallel places each replica on that many devices of
// one node and the replica really runs on all of them (one engine over every
// member's KV pool and threads); a member device that fails or hangs takes
// the whole group down -- its collectives aborted, the replica failed and
// started again -- and no request is lost or hangs.

#include <catch2/catch.hpp>

#include <caf/send.hpp>

#include <map>
#include <set>

#include "actors/messages.hpp"
#include "cluster/event_log.hpp"
#include "cluster_fixture.hpp"

using namespace exa;
using namespace std::chrono_literals;

namespace {

actors::cluster_options tp_cluster(std::uint32_t replicas, std::shared_ptr<cluster::event_log> log = nullptr) {
  auto o = test::cluster_fixture::defaults(replicas);
  o.deployments.front().tensor_parallel = 2;
  o.heartbeat_interval_ms = 100;
  o.suspect_after_missed = 5;
  o.observation_window_ms = 1000;
  o.device_check_interval_ms = 5;  // member devices report their pages often
  o.device_check_timeout_ms = 100;
  o.request_deadline_ms = 20000;
  o.model_step_time = true;  // steps take virtual time: requests are in flight while time passes
  o.event_log = std::move(log);
  return o;
}

api::generate_request request(std::string id, std::uint32_t max_tokens) {
  api::generate_request r;
  r.request_id = std::move(id);
  r.model = "tiny";
  r.prompt_text = "tensor parallel";
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

// A gauge's value in the metrics text; -1 when the series is absent.
double gauge(test::cluster_fixture& f, const std::string& series) {
  std::string text;
  f.backend().metrics([&](std::string t) { text = std::move(t); });
  f.run();
  const auto at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

std::string memory_used(std::uint32_t node, std::uint32_t device) {
  return "exaserve_device_memory_bytes{node=\"" + std::to_string(node) + "\",device=\"" + std::to_string(device) +
         "\",kind=\"used\"}";
}

// Generates to the end (bounded in virtual time); the sink.
std::shared_ptr<test::recording_sink> complete(test::cluster_fixture& f, api::generate_request r) {
  auto sink = f.generate(std::move(r));
  for (int i = 0; i < 2000 && !sink->result; ++i) f.advance(5ms, 1ms);
  REQUIRE(sink->result.has_value());
  return sink;
}

}  // namespace

TEST_CASE("tensor_parallel 2: each replica runs on both devices of its node, token-exact run to run",
          "[actors][tp]") {
  std::vector<std::int32_t> first;
  for (int run = 0; run < 2; ++run) {
    test::cluster_fixture f(tp_cluster(2));
    f.advance(100ms);
    const auto s = f.status();
    REQUIRE(s.replicas.size() == 2);
    std::set<std::uint32_t> nodes;
    for (const auto& r : s.replicas) {
      CHECK(r.state == "ready");
      CHECK(r.device == 0);
      CHECK(r.devices == std::vector<std::uint32_t>{0, 1});
      nodes.insert(r.node);
    }
    CHECK(nodes.size() == 2);
    // The ledger holds each replica's share on both devices of its node.
    for (const auto& d : s.devices) CHECK(d.memory_used_bytes > 0);

    // While a long request streams, both member devices hold its KV pages.
    auto sink = f.generate(request("long-" + std::to_string(run), 300));
    bool both_used = false;
    for (int i = 0; i < 400 && !sink->result; ++i) {
      f.advance(2ms, 1ms);
      for (const auto n : nodes)
        both_used |= gauge(f, memory_used(n, 0)) > 0 && gauge(f, memory_used(n, 1)) > 0;
      if (both_used) break;
    }
    CHECK(both_used);
    for (int i = 0; i < 2000 && !sink->result; ++i) f.advance(5ms, 1ms);
    REQUIRE(sink->result.has_value());
    CHECK_FALSE(sink->result->err.has_value());
    CHECK(sink->result->usage.completion_tokens == 300);

    auto again = complete(f, request("exact-" + std::to_string(run), 48));
    CHECK_FALSE(again->result->err.has_value());
    CHECK(again->tokens().size() == 48);
    if (run == 0) first = again->tokens();
    else CHECK(again->tokens() == first);
  }
}

TEST_CASE("a member device that fails or hangs takes its group down, and the request resumes and the replica returns",
          "[actors][tp][failure]") {
  const std::string fault = GENERATE(std::string("fail"), std::string("hang"));
  INFO("fault: " << fault);
  auto log = std::make_shared<cluster::event_log>();
  test::cluster_fixture f(tp_cluster(2, log));
  f.advance(100ms);
  auto sink = f.generate(request("through-" + fault, 200));
  f.advance(10ms, 1ms);
  REQUIRE_FALSE(sink->result.has_value());
  // The node of the replica that serves it: its second device (not the one
  // the steps run on) goes.
  std::optional<api::replica_status> busy;
  for (const auto& r : f.status().replicas)
    if (r.running > 0) busy = r;
  REQUIRE(busy.has_value());
  caf::anon_send(f.node(busy->node), actors::inject_fault{fault, 1, 5000, 0});
  for (int i = 0; i < 4000 && !sink->result; ++i) f.advance(5ms, 1ms);
  REQUIRE(sink->result.has_value());
  CHECK_FALSE(sink->result->err.has_value());
  CHECK(sink->result->usage.completion_tokens == 200);  // resumed, nothing lost

  // The group went down as one: the replica crashed (reported creating for
  // its restart) once its member was lost.
  bool restarted = false;
  for (const auto& e : log->events())
    restarted |= e.kind == cluster::event_kind::replica_state && e.replica == std::stoull(busy->id) &&
                 e.detail == "creating" && e.t_ns > 0;
  CHECK(restarted);
  // Back on both devices and serving.
  f.advance(6000ms, 10ms);
  bool back = false;
  for (const auto& r : f.status().replicas)
    back |= r.node == busy->node && r.state == "ready" && r.devices == std::vector<std::uint32_t>{0, 1};
  CHECK(back);
  auto after = complete(f, request("after-" + fault, 8));
  CHECK_FALSE(after->result->err.has_value());
}

TEST_CASE("status shows a tensor-parallel replica's devices", "[actors][tp]") {
  test::cluster_fixture f(tp_cluster(1));
  f.advance(50ms);
  const auto s = f.status();
  REQUIRE(s.replicas.size() == 1);
  CHECK(s.replicas[0].devices == std::vector<std::uint32_t>{0, 1});
  for (const auto& d : s.devices) CHECK(d.kind == "cpu");
}

TEST_CASE("a deploy whose tensor_parallel is not 1, 2, 4 or 8, or does not split the model, is refused by name",
          "[actors][tp]") {
  test::cluster_fixture f(test::cluster_fixture::defaults(1));
  const auto deploy = [&](std::uint32_t tp) {
    api::deploy_request d;
    d.name = "tp" + std::to_string(tp);
    d.replicas = 1;
    d.tensor_parallel = tp;
    std::optional<expected<void>> out;
    f.backend().deploy(d, [&](expected<void> r) { out = std::move(r); });
    f.run();
    REQUIRE(out.has_value());
    return *out;
  };
  auto three = deploy(3);
  REQUIRE_FALSE(three);
  CHECK(three.error().code == errc::invalid_argument);
  CHECK_THAT(three.error().message, Catch::Contains("tensor_parallel must be 1, 2, 4 or 8, got 3"));
  // The tiny model has 4 attention heads and 2 KV heads: 8 members cannot split them.
  auto eight = deploy(8);
  REQUIRE_FALSE(eight);
  CHECK(eight.error().code == errc::invalid_argument);
  CHECK_THAT(eight.error().message, Catch::Contains("tensor_parallel 8"));
  CHECK(deploy(2).has_value());
}
