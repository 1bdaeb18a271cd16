// Joining a distributed cluster: identity checks and the timing rules that
// keep a fenced node from serving a slot the controller gave away.

#include <catch2/catch.hpp>

#include "cluster/membership.hpp"

using namespace exa;
using namespace exa::cluster;
using Catch::Matchers::Contains;

TEST_CASE("a process of the same cluster and build joins", "[membership]") {
  const member_identity ours{"prod", "exaserve/0.1.0", ""};
  CHECK(check_join(ours, {"prod", "exaserve/0.1.0", "node"}).has_value());
  CHECK(check_join(ours, {"prod", "exaserve/0.1.0", "gateway"}).has_value());
}

TEST_CASE("another cluster, another build or an unknown role is refused with both sides named", "[membership]") {
  const member_identity ours{"prod", "exaserve/0.1.0", ""};
  auto other_cluster = check_join(ours, {"staging", "exaserve/0.1.0", "node"});
  REQUIRE_FALSE(other_cluster.has_value());
  CHECK(other_cluster.error().code == errc::invalid_argument);
  CHECK_THAT(other_cluster.error().message, Contains("cluster 'staging'") && Contains("cluster 'prod'"));

  auto other_build = check_join(ours, {"prod", "exaserve/0.2.0", "gateway"});
  REQUIRE_FALSE(other_build.has_value());
  CHECK_THAT(other_build.error().message, Contains("exaserve/0.2.0") && Contains("exaserve/0.1.0"));

  auto role = check_join(ours, {"prod", "exaserve/0.1.0", "router"});
  REQUIRE_FALSE(role.has_value());
  CHECK_THAT(role.error().message, Contains("unknown role 'router'"));
}

TEST_CASE("the lease ends before the monitor can confirm, the transport waits past it", "[membership]") {
  // Defaults: every 2 s, 5 missed, 30 s window: confirmed at 40 s.
  CHECK(node_lease_ms(2000, 5, 30000) == 36000);
  CHECK(transport_timeout_ms(2000, 5, 30000) == 44000);
  for (std::uint32_t interval : {10u, 100u, 2000u})
    for (std::uint32_t k : {1u, 3u, 5u})
      for (std::uint32_t window : {0u, 100u, 30000u}) {
        const std::uint64_t confirm = std::uint64_t{k} * interval + window;
        CHECK(node_lease_ms(interval, k, window) < confirm);
        // Checked once an interval, the lease still ends before confirmation
        // (for any setting that confirms later than three intervals).
        if (confirm > 3ull * interval) CHECK(node_lease_ms(interval, k, window) + interval < confirm);
        CHECK(transport_timeout_ms(interval, k, window) > confirm);
        CHECK(transport_timeout_ms(interval, k, window) >= 3000);
      }
}

TEST_CASE("a restarted controller waits out a backoff, an attempt and a lease before placing", "[membership]") {
  CHECK(reconcile_window_ms(36000, 2000, 5000, 2000) == 45000);
  // A node that held its lease starts a fresh one at the latest after one
  // backoff and one timed-out attempt: it has fenced itself by then.
  for (std::uint32_t lease : {800u, 38000u})
    CHECK(reconcile_window_ms(lease, 100, 5000, 2000) >= lease + 5000 + 2000);
}
