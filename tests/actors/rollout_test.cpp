// Rollouts on the deterministic scheduler, in virtual time: a new version as
// fast as the old one moves through the steps and is promoted; one that is
// clearly slower is rolled back at once; neither loses or fails a request;
// pinned requests stay on their version; a controller that restarts in the
// middle of a rollout rolls it back rather than leave it half done.

#include <catch2/catch.hpp>

#include <caf/actor_system.hpp>
#include <caf/send.hpp>

#include <algorithm>
#include <set>

#include "actors/cluster_supervisor.hpp"
#include "actors/messages.hpp"
#include "cluster_fixture.hpp"

using namespace exa;
using namespace std::chrono_literals;

namespace {

actors::cluster_options timed(std::uint32_t replicas) {
  auto o = test::cluster_fixture::defaults(replicas);
  o.model_step_time = true;
  o.request_deadline_ms = 60000;
  o.rollout_tick_ms = 100;
  o.rollout_min_samples = 10;
  o.rollout_drop_grace_ms = 500;
  return o;
}

api::generate_request request(std::string id, std::string model = "tiny", std::string user = {}) {
  api::generate_request r;
  r.request_id = std::move(id);
  r.model = std::move(model);
  r.prompt_text = "rollout";
  r.max_tokens = 4;
  r.ignore_eos = true;
  r.user = std::move(user);
  return r;
}

expected<api::rollout_result> rollout(test::cluster_fixture& f, api::rollout_request req) {
  std::optional<expected<api::rollout_result>> out;
  f.backend().rollout(std::move(req), [&](expected<api::rollout_result> r) { out = std::move(r); });
  f.run();
  REQUIRE(out.has_value());
  return *out;
}

api::rollout_request start(std::string steps, std::uint32_t surge = 1) {
  api::rollout_request r;
  r.what = api::rollout_request::op::start;
  r.name = "tiny";
  r.model_file = test::tiny_model_path();
  r.steps = std::move(steps);
  r.bake_s = 1;
  r.surge = surge;
  return r;
}

api::rollout_request command(api::rollout_request::op what) {
  api::rollout_request r;
  r.what = what;
  r.name = "tiny";
  return r;
}

std::string phase(test::cluster_fixture& f) {
  auto s = rollout(f, command(api::rollout_request::op::status));
  REQUIRE(s);
  return s->status.substr(0, s->status.find(' '));
}

// Steady traffic while the rollout runs: a request every 20 ms of virtual
// time, until the rollout ends or `limit` passes. Returns every sink.
std::vector<std::shared_ptr<test::recording_sink>> traffic_until_final(test::cluster_fixture& f,
                                                                       std::chrono::milliseconds limit) {
  std::vector<std::shared_ptr<test::recording_sink>> sinks;
  for (std::chrono::milliseconds t{0}; t < limit; t += 20ms) {
    sinks.push_back(f.generate(request("r" + std::to_string(sinks.size()), "tiny", "u" + std::to_string(sinks.size() % 7))));
    f.advance(20ms, 1ms);  // fine steps: latencies are not rounded up to the step
    if (t.count() % 200 == 0) {
      const auto p = phase(f);
      if (p != "in_progress" && p != "paused") break;
    }
  }
  f.advance(2000ms);  // what is in flight finishes
  return sinks;
}

std::set<std::string> replicas_of(const api::cluster_status& s, const std::string& deployment) {
  std::set<std::string> out;
  for (const auto& r : s.replicas)
    if (r.deployment == deployment) out.insert(r.id);
  return out;
}

void check_all_served(const std::vector<std::shared_ptr<test::recording_sink>>& sinks) {
  for (std::size_t i = 0; i < sinks.size(); ++i) {
    const auto& k = sinks[i];
    INFO("request r" << i);
    REQUIRE(k->result.has_value());
    INFO("request error: " << (k->result->err ? to_string(*k->result->err) : std::string()));
    CHECK_FALSE(k->result->err.has_value());
    CHECK(k->result->usage.completion_tokens == 4);
  }
}

}  // namespace

TEST_CASE("a version as fast as the old one is promoted step by step and no request fails", "[actors][rollout]") {
  test::cluster_fixture f(timed(2));
  f.advance(200ms);
  auto begun = rollout(f, start("50,100"));
  REQUIRE(begun);
  CHECK_THAT(begun->status, Catch::StartsWith("in_progress step 1/2 split 1=50% 2=50%"));
  // A second rollout of the same deployment is refused while this one runs.
  auto twice = rollout(f, start("100"));
  REQUIRE_FALSE(twice);
  CHECK_THAT(twice.error().message, Catch::Contains("in progress"));
  f.advance(300ms);
  // Pinned requests go to their version only.
  const auto s = f.status();
  const auto old_ids = replicas_of(s, "tiny"), new_ids = replicas_of(s, "tiny@2");
  REQUIRE(new_ids.size() >= 1);
  auto pinned_new = f.generate(request("pin2", "tiny@2"));
  auto pinned_old = f.generate(request("pin1", "tiny@1"));
  f.advance(500ms);
  REQUIRE(pinned_new->result.has_value());
  REQUIRE(pinned_old->result.has_value());
  CHECK(new_ids.count(pinned_new->result->replica));
  CHECK(old_ids.count(pinned_old->result->replica));
  // Latency is exported per version: one series each, under one deployment.
  std::string metrics;
  f.backend().metrics([&](std::string t) { metrics = std::move(t); });
  for (const char* family : {"exaserve_time_to_first_token_ms", "exaserve_time_per_output_token_ms",
                             "exaserve_request_duration_ms"}) {
    CAPTURE(family);
    CHECK_THAT(metrics, Catch::Contains(std::string(family) +
                                        "_count{model=\"tiny@2\",deployment=\"tiny\",version=\"2\",tenant=\"\"} 1"));
    CHECK_THAT(metrics, Catch::Contains(std::string(family) +
                                        "_count{model=\"tiny\",deployment=\"tiny\",version=\"1\",tenant=\"\"}"));
  }

  const auto sinks = traffic_until_final(f, 20000ms);
  CHECK(phase(f) == "complete");
  check_all_served(sinks);
  f.advance(3000ms);
  const auto after = f.status();
  CHECK(replicas_of(after, "tiny").empty());  // the old version drained and stopped
  CHECK(test::replicas_up(after, "tiny@2") == 2);  // the new one at the full count
  REQUIRE(after.models.size() == 1);
  CHECK(after.models[0].name == "tiny");  // listed under the plain name, as its version 2
  CHECK(after.models[0].version == "2");
  // The plain name now means version 2; version 1 is gone.
  auto plain = f.generate(request("plain"));
  auto gone = f.generate(request("gone", "tiny@1"));
  f.advance(500ms);
  REQUIRE(plain->result.has_value());
  CHECK_FALSE(plain->result->err.has_value());
  REQUIRE(gone->result.has_value());
  REQUIRE(gone->result->err.has_value());
  CHECK(gone->result->err->code == errc::not_found);
}

TEST_CASE("a clearly slower version is rolled back at once and no request fails", "[actors][rollout]") {
  test::cluster_fixture f(timed(2));
  f.advance(200ms);
  auto req = start("50,100");
  req.bake_s = 600;  // a regression does not wait for the bake
  REQUIRE(rollout(f, req));
  f.advance(500ms);
  // The new version's replica runs on a device made slow: 30 ms more per step.
  const auto s = f.status();
  const api::replica_status* canary = nullptr;
  for (const auto& r : s.replicas)
    if (r.deployment == "tiny@2") canary = &r;
  REQUIRE(canary != nullptr);
  for (const auto& r : s.replicas)
    if (r.deployment == "tiny") REQUIRE_FALSE((r.node == canary->node && r.device == canary->device));
  caf::anon_send(f.node(canary->node), actors::inject_fault{"slow", canary->device, 600000, 30});
  f.run();
  const auto sinks = traffic_until_final(f, 20000ms);
  const auto line = rollout(f, command(api::rollout_request::op::status));
  REQUIRE(line);
  CHECK_THAT(line->status, Catch::StartsWith("rolled_back step 1/2 split 1=100% 2=0% verdict regression"));
  CHECK_THAT(line->status, Catch::Contains("p99 above its limit"));
  check_all_served(sinks);
  std::string metrics;  // the rolled-back outcome has its own label (the alert counts it)
  f.backend().metrics([&](std::string text) { metrics = std::move(text); });
  f.run();
  CHECK_THAT(metrics,
             Catch::Contains("exaserve_rollout_transitions_total{deployment=\"tiny\",phase=\"rolled_back\"} 1\n"));
  CHECK_THAT(metrics, !Catch::Contains("phase=\"complete\""));
  f.advance(3000ms);
  const auto after = f.status();
  CHECK(replicas_of(after, "tiny@2").empty());
  CHECK(replicas_of(after, "tiny").size() == 2);  // the old version at its full count
  REQUIRE(after.models.size() == 1);
  CHECK(after.models[0].version == "1");
}

TEST_CASE("rollout commands fit the phase, and bad rollouts name the problem", "[actors][rollout]") {
  test::cluster_fixture f(timed(2));
  f.advance(200ms);
  CHECK(rollout(f, command(api::rollout_request::op::status)).error().code == errc::not_found);
  auto bad = start("10,5,100");
  CHECK_THAT(rollout(f, bad).error().message, Catch::Contains("must grow"));
  auto unknown = start("100");
  unknown.name = "nope";
  CHECK(rollout(f, unknown).error().code == errc::not_found);
  auto pinned = start("100");
  pinned.name = "tiny@3";
  CHECK_THAT(rollout(f, pinned).error().message, Catch::Contains("plain name"));
  auto same = start("100");
  same.version = "1";
  CHECK_THAT(rollout(f, same).error().message, Catch::Contains("plain deployment"));
  auto missing = start("100");
  missing.model_file = "/nonexistent/model.gguf";
  CHECK_FALSE(rollout(f, missing));

  REQUIRE(rollout(f, start("1,10,100")));
  auto paused = rollout(f, command(api::rollout_request::op::pause));
  REQUIRE(paused);
  CHECK_THAT(paused->status, Catch::StartsWith("paused"));
  // Scaling waits for the rollout to end.
  std::optional<expected<void>> scaled;
  f.backend().scale("tiny", 3, [&](expected<void> r) { scaled = std::move(r); });
  f.run();
  REQUIRE(scaled.has_value());
  CHECK_THAT(scaled->error().message, Catch::Contains("rollout"));
  REQUIRE(rollout(f, command(api::rollout_request::op::resume)));
  auto promoted = rollout(f, command(api::rollout_request::op::promote));
  REQUIRE(promoted);
  CHECK_THAT(promoted->status, Catch::StartsWith("complete"));
  CHECK_THAT(rollout(f, command(api::rollout_request::op::abort)).error().message, Catch::Contains("complete"));
  // The loser still drains: the next rollout waits for it.
  auto too_soon = rollout(f, start("50,100"));
  REQUIRE_FALSE(too_soon);
  CHECK_THAT(too_soon.error().message, Catch::Contains("finishing"));
  f.advance(3000ms);
  CHECK(replicas_of(f.status(), "tiny@2").size() == 2);
  // The next rollout counts on from version 2 and rolls back on abort.
  auto third = rollout(f, start("50,100"));
  REQUIRE(third);
  CHECK_THAT(third->status, Catch::Contains("2=50% 3=50%"));
  f.advance(500ms);
  auto aborted = rollout(f, command(api::rollout_request::op::abort));
  REQUIRE(aborted);
  CHECK_THAT(aborted->status, Catch::StartsWith("aborted"));
  f.advance(3000ms);
  const auto after = f.status();
  CHECK(replicas_of(after, "tiny@3").empty());
  CHECK(replicas_of(after, "tiny@2").size() == 2);
  // A label is never used twice: the next one is 4, and 3 cannot be named.
  auto reuse = start("50,100");
  reuse.version = "3";
  CHECK_THAT(rollout(f, reuse).error().message, Catch::Contains("used before"));
  auto fourth = rollout(f, start("50,100"));
  REQUIRE(fourth);
  CHECK_THAT(fourth->status, Catch::Contains("2=50% 4=50%"));
}

TEST_CASE("a controller restarted during a rollout rolls it back", "[actors][rollout]") {
  test::cluster_fixture f(timed(2));
  f.advance(200ms);
  REQUIRE(rollout(f, start("50,100")));
  f.advance(500ms);
  REQUIRE_FALSE(replicas_of(f.status(), "tiny@2").empty());
  auto controller = caf::actor_cast<caf::actor>(f.system().registry().get(actors::controller_atom::value));
  REQUIRE(controller);
  // As the chaos harness kills an actor: an exit message its supervisor sees as a crash.
  caf::anon_send<caf::message_priority::high>(
      controller, caf::exit_msg{caf::actor_addr{}, caf::make_error(caf::sec::runtime_error, "killed (test)")});
  f.advance(3000ms);
  const auto after = f.status();
  CHECK(replicas_of(after, "tiny@2").empty());
  CHECK(replicas_of(after, "tiny").size() == 2);
  auto k = f.generate(request("after"));
  f.advance(500ms);
  REQUIRE(k->result.has_value());
  CHECK_FALSE(k->result->err.has_value());
}

TEST_CASE("a new version keeps its deployment's routing and prefix slack, and so does a restarted controller",
          "[actors][rollout][prefix]") {
  auto o = timed(2);
  o.deployments[0].routing = "prefix_aware";
  o.deployments[0].prefix_slack_tokens = 333;
  o.deployments[0].prefix_slack_ratio = 0.75;
  o.deployments[0].prefix_slack_s = 0.05;
  test::cluster_fixture f(o);
  f.advance(200ms);
  const auto check_routing = [&](const std::string& name) {
    const auto s = f.status();
    const auto m = std::find_if(s.models.begin(), s.models.end(), [&](const auto& x) { return x.name == name; });
    REQUIRE(m != s.models.end());
    CHECK(m->routing == "prefix_aware");
    CHECK(m->prefix_slack_tokens == 333);
    CHECK(m->prefix_slack_ratio == 0.75);
    CHECK(m->prefix_slack_s == 0.05);
  };
  check_routing("tiny");
  REQUIRE(rollout(f, start("50,100")));
  f.advance(500ms);
  check_routing("tiny@2");  // the new version routes as the old one did
  // A restarted controller (which rolls the rollout back) comes back from
  // the supervisor's desired state with them, and routes as before. (From
  // the journal, a process's restart: journal_test [prefix].)
  auto controller = caf::actor_cast<caf::actor>(f.system().registry().get(actors::controller_atom::value));
  REQUIRE(controller);
  caf::anon_send<caf::message_priority::high>(
      controller, caf::exit_msg{caf::actor_addr{}, caf::make_error(caf::sec::runtime_error, "killed (test)")});
  f.advance(3000ms);
  check_routing("tiny");
  auto k = f.generate(request("after"));
  f.advance(500ms);
  REQUIRE(k->result.has_value());
  CHECK_FALSE(k->result->err.has_value());
}
