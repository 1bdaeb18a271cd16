// Weighted fair queuing across gateways, on the deterministic scheduler in
// virtual time: a simulated replica shared by two gateway routers (each with
// its own places on it and its own fair queue), the embedded cluster's
// controller keeping the global counters. Tenant A floods through both
// gateways, tenant B through one, both always backlogged. With the counters
// shared the replica's service splits by the tenants' weights; with each
// gateway counting alone, A gets its share at each gateway (about 3/4).
// Last, the replica's [cluster] step_stop gate: a light tenant's arrival stops
// the heavy tenant's step in flight only when it is on.

#include <catch2/catch.hpp>

#include <caf/actor_registry.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/make_message.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actors/cluster_supervisor.hpp"
#include "actors/messages.hpp"
#include "actors/router_actor.hpp"
#include "cluster/fair_share_board.hpp"
#include "cluster/model_ref.hpp"
#include "cluster_fixture.hpp"

using namespace exa;
using namespace std::chrono_literals;

namespace {

constexpr std::uint32_t prompt_tokens = 64;
constexpr std::uint32_t max_tokens = 32;

actors::cluster_options one_simulated_replica() {
  auto o = test::cluster_fixture::defaults();
  o.nodes = 1;
  o.devices_per_node = 1;
  o.engine = "sim";
  o.routers_subscribe = true;
  o.deployments.clear();
  api::deploy_request d;
  d.name = "m";
  d.model_file = cluster::preset_ref("llama-3-8b", cluster::precision::fp16, 4096);
  d.replicas = 1;
  d.kv_tokens = 65536;
  o.deployments.push_back(d);
  return o;
}

class two_gateways {
 public:
  explicit two_gateways(bool shared, std::map<std::string, double> weights = {}, std::uint32_t headroom = 0)
      : f_(one_simulated_replica()), weights_(std::move(weights)) {
    auto& reg = f_.system().registry();
    auto hub = caf::actor_cast<caf::actor>(reg.get(actors::router_atom::value));
    auto controller = caf::actor_cast<caf::actor>(reg.get(actors::controller_atom::value));
    REQUIRE(hub);
    REQUIRE(controller);
    agent_ = f_.system().spawn([](caf::event_based_actor* self) -> caf::behavior {
      self->set_default_handler(caf::drop);
      return {[](actors::tick_atom) {}};
    });
    for (std::uint64_t id : {1, 2}) {
      actors::router_config rc;
      rc.admission.in_flight_per_replica_max = 4;  // each gateway's places on the replica
      rc.admission.queued_per_model_max = 1024;
      rc.fair_across_tenants = true;
      rc.tenant_headroom_slots = headroom;  // 0: the order alone decides, not a per-gateway reserve
      rc.pick_hold_ms = 60000;
      rc.submit_timeout_ms = 90000;
      rc.gateway_id = id;
      rc.request_number_base = id << 40;
      rc.quota_report_ms = 200;
      if (shared) {
        boards_.push_back(std::make_shared<cluster::fair_share_board>());
        rc.fair_shares = boards_.back();
      }
      auto r = f_.system().spawn(actors::router_actor, rc, std::shared_ptr<actors::cluster_metrics>{});
      caf::anon_send(hub, actors::subscribe_msg{r});
      caf::anon_send(controller, actors::gateway_join{r, agent_});
      routers_.push_back(r);
    }
    f_.run();
    f_.advance(2000ms, 20ms);  // the replica loads
  }
  ~two_gateways() {
    for (auto& r : routers_) caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(agent_, caf::exit_reason::user_shutdown);
    f_.run();
  }

  // Runs `seconds` of virtual time, keeping 8 requests of each flood waiting
  // or running; the tokens of the requests that finished, per tenant.
  std::map<std::string, double> flood(int seconds) {
    std::map<std::string, double> done;
    for (int k = 0; k < seconds * 50; ++k) {
      for (const auto& [g, tenant] : floods_) top_up(g, tenant);
      f_.advance(20ms, 20ms);
      for (auto& [key, sinks] : outstanding_)
        std::erase_if(sinks, [&](const std::shared_ptr<test::recording_sink>& s) {
          if (!s->result) return false;
          if (!s->result->err) done[key.second] += prompt_tokens + max_tokens;
          else ++failed_;
          return true;
        });
    }
    return done;
  }
  std::uint64_t failed() const { return failed_; }
  cluster::fair_share_board& board(std::size_t i) { return *boards_.at(i); }
  test::cluster_fixture& fixture() { return f_; }

 private:
  void top_up(std::size_t g, const std::string& tenant) {
    auto& sinks = outstanding_[{g, tenant}];
    while (sinks.size() < 8) {
      api::generate_request r;
      r.request_id = "g" + std::to_string(g) + "-" + std::to_string(next_++);
      r.model = "m";
      r.prompt_ids = std::vector<api::token_id>(prompt_tokens, 7);
      r.max_tokens = max_tokens;
      r.ignore_eos = true;
      r.tenant = tenant;
      if (auto w = weights_.find(tenant); w != weights_.end()) r.tenant_weight = w->second;
      auto sink = std::make_shared<test::recording_sink>();
      caf::anon_send(routers_[g], actors::route_request{r, sink});
      sinks.push_back(sink);
    }
  }

  test::cluster_fixture f_;
  std::map<std::string, double> weights_;
  caf::actor agent_;
  std::vector<caf::actor> routers_;
  std::vector<std::shared_ptr<cluster::fair_share_board>> boards_;
  const std::vector<std::pair<std::size_t, std::string>> floods_{{0, "A"}, {1, "A"}, {0, "B"}};
  std::map<std::pair<std::size_t, std::string>, std::vector<std::shared_ptr<test::recording_sink>>> outstanding_;
  std::uint64_t next_ = 1;
  std::uint64_t failed_ = 0;
};

double share_of_a(const std::map<std::string, double>& done) {
  const double a = done.count("A") ? done.at("A") : 0, b = done.count("B") ? done.at("B") : 0;
  return a + b > 0 ? a / (a + b) : 0;
}

}  // namespace

TEST_CASE("shared fair-queue counters split a replica by tenant across two gateways", "[actors][fair_share]") {
  two_gateways g(/*shared=*/true);
  g.flood(5);  // warm-up: backlogs form, the first reports and answers
  const auto done = g.flood(30);
  const double a = share_of_a(done);
  INFO("A " << done.at("A") << " tokens, B " << done.at("B") << " tokens: A's share " << a);
  CHECK(a == Approx(0.5).epsilon(0.1));
  CHECK(g.board(0).synced());
  CHECK_FALSE(g.board(0).fell_back());
  CHECK(g.board(0).gateways() == 2);
  CHECK(g.failed() == 0);
  // Cut off from the controller, the gateways keep the counters for the
  // board's keep_ns (3 s), then order by their own; back, they share again.
  auto& reg = g.fixture().system().registry();
  auto controller = caf::actor_cast<caf::actor>(reg.get(actors::controller_atom::value));
  reg.erase(actors::controller_atom::value);  // as the uplink does when the controller is lost
  g.flood(2);
  CHECK_FALSE(g.board(0).fell_back());
  g.flood(2);
  CHECK(g.board(0).fell_back());
  const double alone = share_of_a(g.flood(20));
  INFO("A's share with each gateway on its own counters: " << alone);
  CHECK(alone > 0.65);
  actors::register_as(g.fixture().system(), actors::controller_atom::value, controller);
  g.flood(1);
  CHECK_FALSE(g.board(0).fell_back());
}

TEST_CASE("shared fair-queue counters follow the tenants' weights", "[actors][fair_share]") {
  two_gateways g(/*shared=*/true, {{"A", 2.0}, {"B", 1.0}});
  g.flood(5);
  const auto done = g.flood(30);
  const double a = share_of_a(done);
  INFO("A " << done.at("A") << " tokens, B " << done.at("B") << " tokens: A's share " << a);
  CHECK(a == Approx(2.0 / 3).epsilon(0.1));
}

TEST_CASE("without shared counters a tenant on two gateways gets its share at each", "[actors][fair_share]") {
  two_gateways g(/*shared=*/false);
  g.flood(5);
  const auto done = g.flood(30);
  const double a = share_of_a(done);
  INFO("A " << done.at("A") << " tokens, B " << done.at("B") << " tokens: A's share " << a);
  CHECK(a > 0.65);
}

TEST_CASE("fair-share reports and answers keep every field across processes", "[actors][fair_share][messages]") {
  struct config : caf::actor_system_config {
    config() {
      set("scheduler.policy", caf::atom("testing"));
      set("logger.verbosity", caf::atom("quiet"));
      actors::register_message_types(*this);
    }
  } cfg;
  caf::actor_system sys{cfg};
  const auto round_trip = [&](auto value) {
    std::vector<char> buf;
    caf::binary_serializer sink{sys, buf};
    REQUIRE_FALSE(sink(value));
    decltype(value) out;
    caf::binary_deserializer source{sys, buf};
    REQUIRE_FALSE(source(out));
    return out;
  };
  const actors::fair_share_report_msg r{{7, {{"m", "acme", 3, 1234.5, 6, 5, 64}, {"n", "", 1, 0.25, 0, 0, 8}}}};
  CHECK(round_trip(r).report == r.report);
  // As a message (what crosses processes): needs the types registered by name.
  const auto m = round_trip(caf::make_message(r));
  REQUIRE(m.match_elements<actors::fair_share_report_msg>());
  CHECK(m.get_as<actors::fair_share_report_msg>(0).report == r.report);
  const actors::fair_share_answer_msg a{{{{"m", 99.5, {{"acme", 1300, 12}, {"beta", 101, 0}}, 192, 2}}, 3}};
  CHECK(round_trip(a).answer == a.answer);
}

TEST_CASE("with few places, each gateway's per-tenant cap does not decide the split", "[actors][fair_share]") {
  // 4 places per gateway, 2 kept per other active tenant: A fills gateway 1
  // (B is not there) and gateway 2 would hold B to 2 of its 4 places (A
  // 0.74). B has less than its share of the 8 places in all, so it is not
  // held to the cap; A, over its share, is.
  two_gateways g(true, {}, 2);
  (void)g.flood(10);
  const double a = share_of_a(g.flood(30));
  INFO("A's share with the places counted across gateways: " << a);
  CHECK(a == Approx(0.5).epsilon(0.1));
  CHECK(g.failed() == 0);
}

TEST_CASE("without shared counters the per-gateway cap splits a few places unevenly", "[actors][fair_share]") {
  two_gateways g(false, {}, 2);
  (void)g.flood(10);
  const double a = share_of_a(g.flood(30));
  INFO("A's share, each gateway on its own: " << a);
  CHECK(a > 0.65);
}

namespace {

// One simulated replica whose engine stops decode steps at layer boundaries
// (sim_step_stop), four long requests of a heavy tenant decoding, then one
// short request of a light tenant. Returns the light request's time to first
// token (virtual) and the stopped-steps counter the replica exported.
struct stop_run {
  std::chrono::milliseconds ttft{0};
  std::string stopped;  // the counter's line, empty when none was exported
  bool light_done = false;  // its four tokens, half a second on
  bool all_ok = true;       // no request failed
};

stop_run light_beside_heavy(bool step_stop) {
  auto o = one_simulated_replica();
  o.routers_subscribe = false;  // the backend's own router
  o.sim_step_stop = engine::sim_step_stop::every_step;
  o.step_stop = step_stop;
  test::cluster_fixture f(o);
  for (int i = 0; i < 600 && !f.ready(); ++i) f.advance(100ms, 20ms);  // the replica loads
  REQUIRE(f.ready());
  const auto request = [](const std::string& id, const std::string& tenant, std::uint32_t tokens) {
    api::generate_request r;
    r.request_id = id;
    r.model = "m";
    r.prompt_ids = std::vector<api::token_id>(prompt_tokens, tenant == "heavy" ? 7 : 9);
    r.max_tokens = tokens;
    r.ignore_eos = true;
    r.tenant = tenant;
    return r;
  };
  std::vector<std::shared_ptr<test::recording_sink>> sinks;
  for (int i = 0; i < 4; ++i) sinks.push_back(f.generate(request("heavy-" + std::to_string(i), "heavy", 4000)));
  f.advance(300ms, 1ms);  // all four decoding: a step is in flight at almost every moment
  stop_run out;
  auto light = f.generate(request("light", "light", 4));
  sinks.push_back(light);
  for (int i = 0; i < 2000 && light->chunks.empty(); ++i) {
    f.advance(1ms, 1ms);
    out.ttft += 1ms;
  }
  REQUIRE_FALSE(light->chunks.empty());
  f.advance(500ms, 10ms);  // a load report exports the counter
  std::string text;
  f.backend().metrics([&](std::string t) { text = std::move(t); });
  f.run();
  const std::string name = "exaserve_engine_stopped_steps_total{model=\"m\"} ";
  if (const auto at = text.find(name); at != std::string::npos)
    out.stopped = text.substr(at, text.find('\n', at) - at);
  out.light_done = light->result && !light->result->err && light->tokens().size() == 4;
  for (const auto& s : sinks)
    if (s->result && s->result->err) out.all_ok = false;
  return out;
}

}  // namespace

TEST_CASE("[cluster] step_stop on: a light tenant's prompt stops the heavy tenant's step in flight, counted",
          "[actors][fair][step_stop]") {
  const stop_run on = light_beside_heavy(true);
  const stop_run off = light_beside_heavy(false);
  INFO("time to first token with the stop " << on.ttft.count() << " ms, without " << off.ttft.count() << " ms");
  CHECK(on.light_done);
  CHECK(off.light_done);
  CHECK(on.all_ok);
  CHECK(off.all_ok);
  // Off, replicas offer no arrivals: no step stops part way, none is counted.
  CHECK(off.stopped.empty());
  REQUIRE_FALSE(on.stopped.empty());
  const double stops = std::stod(on.stopped.substr(on.stopped.rfind(' ') + 1));
  CHECK(stops >= 1);
  // The light request waits for a layer of the step in flight, not all of it.
  CHECK(on.ttft < off.ttft);
}
