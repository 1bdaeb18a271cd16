#include <catch2/catch.hpp>

#include "auth/api_keys.hpp"
#include "auth/tenant_limits.hpp"

using namespace exa;
using namespace exa::auth;
using Catch::Matchers::Contains;

namespace {
constexpr std::int64_t ms = 1000000;  // ns
}

TEST_CASE("requests per second: a burst of one second's worth, then the refill rate", "[auth][limits]") {
  tenant_limiter l;
  const tenant_limits lim{2, 0, 0, 0};
  std::int64_t t = 0;
  auto a = l.admit("acme", lim, t, 10);
  auto b = l.admit("acme", lim, t, 10);
  REQUIRE(a);
  REQUIRE(b);
  auto c = l.admit("acme", lim, t, 10);
  REQUIRE_FALSE(c);
  CHECK(c.error().limit == "requests_per_s");
  CHECK(c.error().code == errc::overloaded);
  CHECK(c.error().retry_after_ms == 500);  // one request refills in 1/2 s
  CHECK_THAT(c.error().message, Contains("tenant acme") && Contains("2 requests per second"));
  CHECK_FALSE(l.admit("acme", lim, t + 499 * ms, 10));
  CHECK(l.admit("acme", lim, t + 500 * ms, 10));
  // Another tenant has buckets of its own.
  CHECK(l.admit("beta", lim, t, 10));
}

TEST_CASE("tokens per minute: reserved at admission, settled with what was used", "[auth][limits]") {
  tenant_limiter l;
  const tenant_limits lim{0, 600, 0, 0};  // 10 tokens a second, a 600-token burst
  auto a = l.admit("acme", lim, 0, 500);
  REQUIRE(a);
  CHECK(a->reserved_tokens == 500);
  auto b = l.admit("acme", lim, 0, 200);  // 100 left
  REQUIRE_FALSE(b);
  CHECK(b.error().limit == "tokens_per_min");
  CHECK(b.error().retry_after_ms == 10000);  // 100 missing at 10 a second
  l.finish(*a, 120, 0);                      // used 120 of 500: 380 come back
  CHECK(l.admit("acme", lim, 0, 200));       // 480 left, 280 after
  // Using more than reserved is a debt that later requests wait off.
  auto c = l.admit("acme", lim, 0, 10);
  REQUIRE(c);
  l.finish(*c, 400, 0);                       // 270 - 390 = -120
  auto d = l.admit("acme", lim, 0, 10);
  REQUIRE_FALSE(d);
  CHECK(d.error().retry_after_ms == 13000);   // 130 missing
  // A request larger than the whole bucket waits for a full one, never forever.
  tenant_limiter fresh;
  CHECK(fresh.admit("acme", lim, 0, 100000));
}

TEST_CASE("requests in flight and tokens per request", "[auth][limits]") {
  tenant_limiter l;
  const tenant_limits lim{0, 0, 2, 64};
  auto a = l.admit("acme", lim, 0, 64);
  auto b = l.admit("acme", lim, 0, 1);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(l.in_flight("acme") == 2);
  auto c = l.admit("acme", lim, 0, 1);
  REQUIRE_FALSE(c);
  CHECK(c.error().limit == "max_concurrent");
  CHECK(c.error().retry_after_ms > 0);
  l.finish(*a, 64, 0);
  CHECK(l.in_flight("acme") == 1);
  CHECK(l.admit("acme", lim, 0, 1));
  auto big = l.admit("beta", lim, 0, 65);
  REQUIRE_FALSE(big);
  CHECK(big.error().limit == "max_tokens");
  CHECK(big.error().code == errc::invalid_argument);  // waiting does not help
  CHECK(big.error().retry_after_ms == 0);
  CHECK_THAT(big.error().message, Contains("max_tokens 65") && Contains("limit of 64"));
  CHECK(l.in_flight("beta") == 0);  // a refused request holds nothing
}

TEST_CASE("a tenant's limits live in the keys file beside its keys", "[auth][limits]") {
  key_set keys;
  (void)keys.add("acme", false, 1);
  REQUIRE(keys.set_limits("acme", {5, 60000, 8, 1024}));
  auto back = key_set::parse(keys.serialize());
  REQUIRE(back);
  CHECK(back->limits_for("acme") == tenant_limits{5, 60000, 8, 1024});
  CHECK(back->limits_for("beta") == tenant_limits{});  // none set: unlimited
  REQUIRE(keys.set_limits("beta", {0, 0, 0, 0, 2.5}));  // a weight alone is kept
  back = key_set::parse(keys.serialize());
  REQUIRE(back);
  CHECK(back->limits_for("beta").weight == 2.5);
  CHECK(back->limits_for("acme").weight == 1);
  CHECK(key_set::parse("tenant old requests_per_s=1\n")->limits_for("old").weight == 1);  // files from before weights
  REQUIRE(keys.set_limits("acme", {}));                // all 0: the line goes
  CHECK(keys.serialize().find("tenant acme") == std::string::npos);
  for (const char* bad : {"tenant acme speed=3\n", "tenant acme requests_per_s=-1\n", "tenant acme max_concurrent=1.5\n",
                          "tenant acme weight=0\n",
                          "tenant a/b\n", "tenant acme\ntenant acme\n"}) {
    INFO(bad);
    auto r = key_set::parse(bad);
    CHECK_FALSE(r);
  }
}
