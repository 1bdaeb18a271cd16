// Tenant limits shared across gateways, on the deterministic scheduler in
// virtual time: two gateway routers (each with its own quota board and a
// front door's limiter, driven by the test) and the embedded cluster's
// controller as the quota authority. A tenant flooding both gateways is
// admitted at its limit in total, a tenant on one gateway gets nearly all of
// it there, a departed gateway's share comes back to the other, and a
// gateway cut off from the controller keeps its shares for a while and then
// divides each limit evenly.

#include <catch2/catch.hpp>

#include <caf/actor_registry.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/send.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actors/cluster_supervisor.hpp"
#include "actors/messages.hpp"
#include "actors/router_actor.hpp"
#include "auth/quota_board.hpp"
#include "cluster_fixture.hpp"

using namespace exa;
using namespace std::chrono_literals;

namespace {

constexpr std::int64_t ms_ns = 1000000;

actors::cluster_options no_deployments() {
  auto o = test::cluster_fixture::defaults();
  o.nodes = 1;
  o.devices_per_node = 1;
  o.deployments.clear();
  return o;
}

// One gateway as the test sees it: its router (reporting to the controller)
// and its front door's limiter on the same board.
struct gateway {
  std::shared_ptr<auth::quota_board> board = std::make_shared<auth::quota_board>();
  auth::shared_tenant_limiter limiter{board};
  caf::actor router;
  struct held {
    auth::tenant_limiter::admission a;
    std::int64_t until_ns;
  };
  std::vector<held> in_flight;
};

class quota_fixture {
 public:
  quota_fixture() : f_(no_deployments()) {
    for (std::uint64_t id : {1, 2}) {
      auto g = std::make_unique<gateway>();
      actors::router_config rc;
      rc.quotas = g->board;
      rc.gateway_id = id;
      rc.request_number_base = id << 40;
      g->router = f_.system().spawn(actors::router_actor, rc, std::shared_ptr<actors::cluster_metrics>{});
      gateways_.push_back(std::move(g));
    }
    f_.run();
  }
  ~quota_fixture() {
    for (auto& g : gateways_) caf::anon_send_exit(g->router, caf::exit_reason::user_shutdown);
    f_.run();
  }

  gateway& gw(std::size_t i) { return *gateways_.at(i); }
  test::cluster_fixture& fixture() { return f_; }
  std::int64_t now_ns() const { return now_ns_; }

  // Advances 20 ms; then each gateway in `floods` gets one request of
  // `tenant` (50 a second each), held in flight for `hold_ms`. Returns how
  // many were admitted.
  std::uint32_t tick(const std::string& tenant, const auth::tenant_limits& limits, const std::vector<std::size_t>& floods,
                     std::int64_t hold_ms = 0) {
    f_.advance(20ms, 20ms);
    now_ns_ += 20 * ms_ns;
    std::uint32_t admitted = 0;
    for (auto& g : gateways_)
      std::erase_if(g->in_flight, [&](const gateway::held& h) {
        if (h.until_ns > now_ns_) return false;
        g->limiter.finish(h.a, 16, now_ns_);
        return true;
      });
    for (auto i : floods) {
      auto a = gw(i).limiter.admit(tenant, limits, now_ns_, 16);
      if (!a) continue;
      ++admitted;
      gw(i).in_flight.push_back({*a, now_ns_ + hold_ms * ms_ns});
    }
    return admitted;
  }

  // Admitted per second of `tenant` over `seconds` of flooding.
  double rate(const std::string& tenant, const auth::tenant_limits& limits, const std::vector<std::size_t>& floods,
              int seconds) {
    std::uint64_t n = 0;
    for (int k = 0; k < seconds * 50; ++k) n += tick(tenant, limits, floods);
    return static_cast<double>(n) / seconds;
  }

 private:
  test::cluster_fixture f_;
  std::vector<std::unique_ptr<gateway>> gateways_;
  std::int64_t now_ns_ = 0;
};

}  // namespace

TEST_CASE("two gateways admit a flooding tenant at its limit in total", "[actors][quota]") {
  quota_fixture q;
  const auth::tenant_limits limits{10, 0, 0, 0};
  q.rate("acme", limits, {0, 1}, 3);  // warm-up: the first reports and answers
  const double total = q.rate("acme", limits, {0, 1}, 60);
  INFO("admitted " << total << " a second against a limit of 10");
  CHECK(total <= 10 * 1.1);
  CHECK(total >= 10 * 0.9);
  // Each gateway holds half of the limit.
  CHECK(q.gw(0).board->limits_for("acme", limits).limits.requests_per_s == Approx(5));
  CHECK(q.gw(1).board->limits_for("acme", limits).limits.requests_per_s == Approx(5));
  CHECK(q.gw(0).board->gateways() == 2);
}

TEST_CASE("a tenant on one gateway gets nearly all of its limit there", "[actors][quota]") {
  quota_fixture q;
  const auth::tenant_limits limits{10, 0, 0, 0};
  q.rate("solo", limits, {0}, 3);
  const double there = q.rate("solo", limits, {0}, 60);
  INFO("admitted " << there << " a second against a limit of 10");
  CHECK(there >= 10 * 0.9);
  CHECK(there <= 10 * 1.02);
  // The other gateway keeps a floor of 5 % for it, so it can admit at once.
  CHECK(q.gw(1).board->limits_for("solo", limits).limits.requests_per_s == Approx(0.5));
  CHECK(q.gw(1).limiter.admit("solo", limits, q.now_ns(), 16));
}

TEST_CASE("requests in flight are shared as whole requests", "[actors][quota]") {
  quota_fixture q;
  const auth::tenant_limits limits{0, 0, 4, 0};
  for (int k = 0; k < 150; ++k) q.tick("acme", limits, {0, 1}, 200);  // warm-up
  std::size_t most = 0;
  for (int k = 0; k < 1500; ++k) {
    q.tick("acme", limits, {0, 1}, 200);
    most = std::max(most, q.gw(0).in_flight.size() + q.gw(1).in_flight.size());
  }
  CHECK(most == 4);  // the limit, between them
  CHECK(q.gw(0).board->limits_for("acme", limits).limits.max_concurrent == 2);
  CHECK(q.gw(1).board->limits_for("acme", limits).limits.max_concurrent == 2);
}

TEST_CASE("a departed gateway's share returns to the others after its lease", "[actors][quota]") {
  quota_fixture q;
  const auth::tenant_limits limits{10, 0, 0, 0};
  q.rate("acme", limits, {0, 1}, 3);
  CHECK(q.gw(0).board->limits_for("acme", limits).limits.requests_per_s == Approx(5));
  caf::anon_send_exit(q.gw(1).router, caf::exit_reason::user_shutdown);
  // The controller's lease is 5 s; the next report after it gets it all.
  q.rate("acme", limits, {0}, 7);
  CHECK(q.gw(0).board->limits_for("acme", limits).limits.requests_per_s == Approx(10));
  CHECK(q.gw(0).board->gateways() == 1);
  const double alone = q.rate("acme", limits, {0}, 20);
  CHECK(alone >= 10 * 0.95);
  CHECK(alone <= 10 * 1.02);
}

TEST_CASE("a gateway cut off from the controller keeps its shares, then divides evenly", "[actors][quota]") {
  quota_fixture q;
  const auth::tenant_limits limits{10, 0, 0, 0};
  q.rate("solo", limits, {0}, 3);
  CHECK(q.gw(0).board->limits_for("solo", limits).limits.requests_per_s == Approx(9.5));
  auto& reg = q.fixture().system().registry();
  auto controller = caf::actor_cast<caf::actor>(reg.get(actors::controller_atom::value));
  REQUIRE(controller);
  reg.erase(actors::controller_atom::value);  // as the uplink does when the controller is lost
  q.rate("solo", limits, {0}, 2);
  CHECK_FALSE(q.gw(0).board->fell_back());  // kept for shares_keep_ns (3 s)
  CHECK(q.gw(0).board->limits_for("solo", limits).limits.requests_per_s == Approx(9.5));
  q.rate("solo", limits, {0}, 2);
  CHECK(q.gw(0).board->fell_back());
  CHECK(q.gw(0).board->limits_for("solo", limits).limits.requests_per_s == Approx(5));  // limit / 2 gateways
  const double even = q.rate("solo", limits, {0}, 10);
  CHECK(even <= 5 * 1.05);
  actors::register_as(q.fixture().system(), actors::controller_atom::value, controller);
  q.rate("solo", limits, {0}, 2);
  CHECK_FALSE(q.gw(0).board->fell_back());
  CHECK(q.gw(0).board->limits_for("solo", limits).limits.requests_per_s > 9);
}
