// Routing policies and admission control through the real router actor, on
// the deterministic scheduler: which replica each request lands on.

#include <catch2/catch.hpp>

#include <map>
#include <optional>

#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

#include "actors/messages.hpp"
#include "actors/router_actor.hpp"
#include "cluster_fixture.hpp"

using namespace exa;

namespace {

api::generate_request request(std::string id, std::uint32_t max_tokens = 4) {
  api::generate_request r;
  r.request_id = std::move(id);
  r.model = "tiny";
  r.prompt_text = "route me";
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

std::map<std::string, int> spread(test::cluster_fixture& f, int n, std::vector<std::string>* order = nullptr) {
  std::vector<std::shared_ptr<test::recording_sink>> sinks;
  for (int i = 0; i < n; ++i) sinks.push_back(f.generate(request("q" + std::to_string(i))));
  f.run();
  std::map<std::string, int> count;
  for (const auto& s : sinks) {
    REQUIRE(s->result.has_value());
    REQUIRE_FALSE(s->result->err.has_value());
    ++count[s->result->replica];
    if (order) order->push_back(s->result->replica);
  }
  return count;
}

test::cluster_fixture with_policy(const std::string& policy, std::uint32_t replicas = 2) {
  auto o = test::cluster_fixture::defaults(replicas);
  o.deployments[0].routing = policy;
  return test::cluster_fixture(o);
}

}  // namespace

TEST_CASE("round robin alternates between replicas", "[actors][routing]") {
  auto f = with_policy("round_robin");
  std::vector<std::string> order;
  const auto count = spread(f, 6, &order);
  CHECK(count.size() == 2);
  for (std::size_t i = 1; i < order.size(); ++i) CHECK(order[i] != order[i - 1]);
}

TEST_CASE("least outstanding spreads concurrent requests evenly", "[actors][routing]") {
  auto f = with_policy("least_outstanding", 3);
  const auto count = spread(f, 9);
  REQUIRE(count.size() == 3);
  for (const auto& [replica, n] : count) CHECK(n == 3);
}

TEST_CASE("power of two choices uses every replica and replays with its seed", "[actors][routing]") {
  std::vector<std::string> first, second;
  {
    auto f = with_policy("power_of_two", 3);
    CHECK(spread(f, 12, &first).size() == 3);
  }
  {
    auto f = with_policy("power_of_two", 3);
    spread(f, 12, &second);
  }
  CHECK(first == second);  // deterministic under the same seed
}

TEST_CASE("predictive routing spreads work across idle replicas", "[actors][routing]") {
  auto f = with_policy("predictive");
  const auto count = spread(f, 8);
  CHECK(count.size() == 2);
}

TEST_CASE("deploying with an unknown routing policy is refused, naming the valid ones", "[actors][routing]") {
  test::cluster_fixture f(test::cluster_fixture::defaults(1));
  api::deploy_request d;
  d.name = "other";
  d.routing = "fastest";
  std::optional<expected<void>> out;
  f.backend().deploy(d, [&](expected<void> r) { out = r; });
  f.run();
  REQUIRE(out.has_value());
  REQUIRE_FALSE(out->has_value());
  CHECK(out->error().code == errc::invalid_argument);
  CHECK_THAT(out->error().message, Catch::Contains("round_robin"));
}

TEST_CASE("admission control refuses beyond the queue bound with overloaded", "[actors][admission]") {
  auto o = test::cluster_fixture::defaults(1);
  o.queued_per_model_max = 2;
  test::cluster_fixture f(o);
  std::vector<std::shared_ptr<test::recording_sink>> sinks;
  for (int i = 0; i < 5; ++i) sinks.push_back(f.generate(request("a" + std::to_string(i))));
  f.run();
  int refused = 0, completed = 0;
  for (const auto& s : sinks) {
    REQUIRE(s->result.has_value());
    if (s->result->err) {
      CHECK(s->result->err->code == errc::overloaded);
      ++refused;
    } else {
      ++completed;
    }
  }
  CHECK(refused == 3);
  CHECK(completed == 2);
  // The bound is on what waits, not a ceiling forever: later requests pass.
  auto later = f.generate(request("later"));
  f.run();
  REQUIRE(later->result.has_value());
  CHECK_FALSE(later->result->err.has_value());
}

TEST_CASE("a tenant's deployment does not exist for another tenant's requests", "[actors][routing][tenant]") {
  auto o = test::cluster_fixture::defaults(1);
  o.deployments[0].tenant = "acme";
  api::deploy_request shared;
  shared.name = "shared";
  o.deployments.push_back(shared);
  test::cluster_fixture f(o);
  f.run();
  REQUIRE(f.ready());
  const auto as = [&](std::string id, std::string model, std::string tenant) {
    auto r = request(std::move(id));
    r.model = std::move(model);
    r.tenant = std::move(tenant);
    auto sink = f.generate(r);
    f.run();
    REQUIRE(sink->result.has_value());
    return *sink->result;
  };
  CHECK_FALSE(as("own", "tiny", "acme").err.has_value());
  CHECK_FALSE(as("unscoped", "tiny", "").err.has_value());  // no keys, or an admin key
  CHECK_FALSE(as("shared", "shared", "beta").err.has_value());
  const auto other = as("other", "tiny", "beta");
  REQUIRE(other.err.has_value());
  CHECK(other.err->code == errc::not_found);
  // Worded as for a model that does not exist, and the list names only what beta may use.
  const auto unknown = as("unknown", "nonexistent", "beta");
  REQUIRE(unknown.err.has_value());
  CHECK(other.err->message == "unknown model 'tiny' (serving: shared)");
  CHECK(unknown.err->message == "unknown model 'nonexistent' (serving: shared)");
}

TEST_CASE("a gateway of a region uses its region's replicas and spills over when they are down", "[actors][routing]") {
  auto o = test::cluster_fixture::defaults(2);
  o.regions = 2;  // node 0 in r0, node 1 in r1; one replica on each
  o.gateway_region = "r1";
  test::cluster_fixture f(o);
  const auto s = f.status();
  std::string local, remote;
  for (const auto& r : s.replicas) (r.node == 1 ? local : remote) = r.id;
  REQUIRE_FALSE(local.empty());
  REQUIRE_FALSE(remote.empty());
  // Sequential and concurrent alike: all on the replica of its own region.
  auto count = spread(f, 8);
  CHECK(count[local] == 8);
  CHECK(count.count(remote) == 0);
  // Its region has no replica left (its node drained): the other region serves.
  std::optional<expected<api::drain_result>> drained;
  f.backend().drain({api::drain_request::target::node, 1, 0, false},
                    [&](expected<api::drain_result> r) { drained = std::move(r); });
  f.run();
  REQUIRE(drained.has_value());
  REQUIRE(drained->has_value());
  auto spilled = f.generate(request("spill"));
  f.run();
  REQUIRE(spilled->result.has_value());
  CHECK_FALSE(spilled->result->err.has_value());
  std::uint32_t served_on = 99;
  for (const auto& r : f.status().replicas)
    if (r.id == spilled->result->replica) served_on = r.node;
  CHECK(served_on == 0);
}

TEST_CASE("a gateway's router holds requests for unheard-of models until the controller's list comes", "[actors][routing]") {
  // A gateway process's router (await_controller) before the controller's
  // first deployment_set: a request to a model it has not heard of waits
  // instead of 404 (a configured model's request could arrive first); the
  // list then refuses those the controller does not have, and from then on
  // an unknown model is refused at once. The embedded cluster's router
  // (without it) refuses at once from the start.
  auto o = test::cluster_fixture::defaults(1);
  o.deployments.clear();
  test::cluster_fixture f(o);
  f.run();
  const auto spawn = [&](bool await) {
    actors::router_config rc;
    rc.await_controller = await;
    return f.system().spawn(actors::router_actor, rc, std::shared_ptr<actors::cluster_metrics>{});
  };
  const auto send = [&](const caf::actor& router, std::string id, std::string model) {
    auto r = request(std::move(id));
    r.model = std::move(model);
    auto sink = std::make_shared<test::recording_sink>();
    caf::anon_send(router, actors::route_request{r, sink});
    return sink;
  };
  auto gateway = spawn(true);
  auto early = send(gateway, "early", "tiny");
  auto stray = send(gateway, "stray", "nope");
  f.run();
  CHECK_FALSE(early->result.has_value());
  CHECK_FALSE(stray->result.has_value());
  caf::anon_send(gateway, actors::deployment_set{{"tiny"}});  // the controller has "tiny", still starting
  f.run();
  REQUIRE(stray->result.has_value());
  REQUIRE(stray->result->err.has_value());
  CHECK(stray->result->err->code == errc::not_found);
  CHECK_FALSE(early->result.has_value());  // waits for tiny's start, as a starting deployment's requests do
  auto late = send(gateway, "late", "nope");
  f.run();
  REQUIRE(late->result.has_value());
  REQUIRE(late->result->err.has_value());
  CHECK(late->result->err->code == errc::not_found);

  auto embedded = spawn(false);
  auto at_once = send(embedded, "at-once", "tiny");
  f.run();
  REQUIRE(at_once->result.has_value());
  REQUIRE(at_once->result->err.has_value());
  CHECK(at_once->result->err->code == errc::not_found);
  for (const auto& r : {gateway, embedded}) caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
  f.run();
}
