#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>
#include <random>

#include "auth/quota_board.hpp"
#include "auth/quota_share.hpp"

using namespace exa;
using namespace exa::auth;
using Catch::Matchers::Contains;

namespace {

constexpr std::int64_t ms = 1000000;  // ns
constexpr std::int64_t s = 1000 * ms;

double sum(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

std::vector<double> divide(double limit, std::vector<double> demands, bool whole = false,
                           quota_division_config c = {}) {
  return divide_limit(limit, demands, c, whole);
}

quota_demand demand(std::string tenant, double rps, double limit_rps, double conc = 0, std::uint32_t limit_conc = 0) {
  quota_demand d;
  d.tenant = std::move(tenant);
  d.requests_per_s = rps;
  d.limit_requests_per_s = limit_rps;
  d.concurrent = conc;
  d.limit_concurrent = limit_conc;
  return d;
}

const quota_share* find(const quota_grant& g, const std::string& tenant) {
  for (const auto& s : g.shares)
    if (s.tenant == tenant) return &s;
  return nullptr;
}

}  // namespace

TEST_CASE("division: below the limit, shares follow demand", "[auth][quota]") {
  // Floors of 0.5 each; both get what they want, and the spare 6 goes 1:3.
  auto d = divide(10, {1, 3});
  CHECK(d[0] == Approx(2.5));
  CHECK(d[1] == Approx(7.5));
  CHECK(sum(d) <= 10);
  // Nobody wants anything: an even split.
  auto z = divide(9, {0, 0, 0});
  for (double x : z) CHECK(x == Approx(3));
}

TEST_CASE("division: above the limit, max-min fair", "[auth][quota]") {
  // The small demand is met in full; the two large ones split the rest evenly.
  auto d = divide(10, {1, 20, 30});
  CHECK(d[0] == Approx(1));
  CHECK(d[1] == Approx(4.5));
  CHECK(d[2] == Approx(4.5));
  CHECK(sum(d) <= 10);
  // Equal floods get equal shares.
  auto e = divide(10, {100, 100});
  CHECK(e[0] == Approx(5));
  CHECK(e[1] == Approx(5));
}

TEST_CASE("division: floors let an idle gateway admit, and take little from a busy one", "[auth][quota]") {
  auto two = divide(10, {100, 0});
  CHECK(two[1] == Approx(0.5));  // 5 % of the limit
  CHECK(two[0] == Approx(9.5));
  // Ten gateways, one busy: all floors together take at most 10 %.
  std::vector<double> ten(10, 0.0);
  ten[3] = 1000;
  auto t = divide(10, ten);
  CHECK(t[3] == Approx(9.1));
  for (std::size_t i = 0; i < t.size(); ++i)
    if (i != 3) CHECK(t[i] == Approx(0.1));
  // Whole units: one in flight each while the limit has two per gateway...
  auto w = divide(8, {50, 0}, true);
  CHECK(w == std::vector<double>{7, 1});
  // ... none below that: a limit of 1 goes where the demand is.
  CHECK(divide(1, {0, 5}, true) == std::vector<double>{0, 1});
  CHECK(divide(3, {10, 10}, true) == std::vector<double>{2, 1});
}

TEST_CASE("division: shares never sum above the limit and are never negative", "[auth][quota]") {
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> u(0, 1);
  for (int round = 0; round < 2000; ++round) {
    const auto n = 1 + static_cast<std::size_t>(u(rng) * 20);
    const bool whole = round % 2 == 1;
    const double limit = whole ? std::floor(u(rng) * 64) : u(rng) * 1000;
    std::vector<double> want(n);
    for (auto& w : want) w = u(rng) < 0.3 ? 0 : u(rng) * limit * 2;
    INFO("round " << round << " n " << n << " limit " << limit);
    auto d = divide(limit, want, whole);
    REQUIRE(d.size() == n);
    REQUIRE(sum(d) <= limit * (1 + 1e-12));
    for (double x : d) REQUIRE(x >= 0);
    if (whole) {
      for (double x : d) REQUIRE(x == std::floor(x));
      REQUIRE(sum(d) == limit);  // whole units: nothing lost to rounding
      if (limit >= 2.0 * static_cast<double>(n))
        for (double x : d) REQUIRE(x >= 1);
    } else if (limit > 0) {
      REQUIRE(sum(d) == Approx(limit));  // none of the limit lies idle
    }
    // Max-min: a gateway gets at least the smaller of its demand and an equal split.
    for (std::size_t i = 0; i < n && !whole; ++i)
      REQUIRE(d[i] >= std::min(want[i], limit / static_cast<double>(n)) * (1 - 1e-9));
  }
}

TEST_CASE("division: degenerate inputs", "[auth][quota]") {
  CHECK(divide(10, {}).empty());
  CHECK(divide(0, {1, 2}) == std::vector<double>{0, 0});
  CHECK(divide(-5, {1}) == std::vector<double>{0});
  auto bad = divide(10, {std::nan(""), -3, INFINITY});
  CHECK(sum(bad) <= 10);
  for (double x : bad) CHECK(x == Approx(10.0 / 3));  // all count as zero demand
}

TEST_CASE("authority: flooding gateways split the limit, one-gateway tenants keep it", "[auth][quota]") {
  quota_authority a;
  REQUIRE(a.report(1, {demand("acme", 50, 10)}, 0));
  auto g2 = a.report(2, {demand("acme", 50, 10), demand("solo", 3, 4)}, 0);
  auto g1 = a.report(1, {demand("acme", 50, 10)}, 1);
  REQUIRE(g1);
  REQUIRE(g2);
  CHECK(g1->gateways == 2);
  REQUIRE(find(*g1, "acme"));
  CHECK(find(*g1, "acme")->requests == Approx(0.5));
  // Gateway 1 never reported "solo", yet holds its floor for it...
  REQUIRE(find(*g1, "solo"));
  CHECK(find(*g1, "solo")->requests == Approx(0.05));
  // ... and once gateway 2 reports solo's demand, it gets the rest.
  auto again = a.report(2, {demand("acme", 50, 10), demand("solo", 30, 4)}, 2);
  REQUIRE(again);
  CHECK(find(*again, "solo")->requests == Approx(0.95));
  CHECK(find(*again, "solo")->requests + find(*g1, "solo")->requests <= 1.0);
  // A dimension with no limit is not divided.
  CHECK(find(*again, "solo")->concurrent == 1);
}

TEST_CASE("authority: a departed gateway's share returns after its lease", "[auth][quota]") {
  quota_authority_config c;
  c.lease_ns = 5 * s;
  quota_authority a(c);
  REQUIRE(a.report(1, {demand("acme", 50, 10, 20, 8)}, 0));
  REQUIRE(a.report(2, {demand("acme", 50, 10, 20, 8)}, 0));
  auto half = a.report(1, {demand("acme", 50, 10, 20, 8)}, 4 * s);
  REQUIRE(half);
  CHECK(find(*half, "acme")->requests == Approx(0.5));
  CHECK(find(*half, "acme")->concurrent == Approx(0.5));  // 4 of 8 in flight
  // Gateway 2 stopped reporting at 0; past its lease gateway 1 has it all.
  auto all = a.report(1, {demand("acme", 50, 10, 20, 8)}, 5 * s + 1);
  REQUIRE(all);
  CHECK(all->gateways == 1);
  CHECK(find(*all, "acme")->requests == Approx(1));
  CHECK(find(*all, "acme")->concurrent == Approx(1));
  CHECK(a.gateways() == 1);
}

TEST_CASE("authority: bounded gateways and tenants, the smallest reported limit", "[auth][quota]") {
  quota_authority_config c;
  c.gateways_max = 2;
  c.tenants_max = 3;
  quota_authority a(c);
  REQUIRE(a.report(1, {demand("t1", 1, 10), demand("t2", 1, 10)}, 0));
  REQUIRE(a.report(2, {demand("t1", 1, 20)}, 0));
  auto third = a.report(3, {}, 0);
  REQUIRE_FALSE(third);
  CHECK(third.error().code == errc::overloaded);
  auto many = a.report(2, {demand("a", 1, 1), demand("b", 1, 1), demand("c", 1, 1), demand("d", 1, 1)}, 0);
  REQUIRE_FALSE(many);
  CHECK(many.error().code == errc::invalid_argument);
  // t1, t2 known; only one more fits in all: t3 gets a share, t4 none.
  auto g = a.report(2, {demand("t1", 1, 20), demand("t3", 1, 5), demand("t4", 1, 5)}, 1);
  REQUIRE(g);
  CHECK(g->shares.size() == 3);
  CHECK(find(*g, "t3"));
  CHECK_FALSE(find(*g, "t4"));
  CHECK(a.tenants() == 3);
  // Gateways disagree on t1's limit (10 and 20): the division is of 10, so
  // gateway 2's fraction is of the smaller limit. Demands 1 and 1 of 10:
  // proportional halves.
  CHECK(find(*g, "t1")->requests == Approx(0.5));
}

TEST_CASE("board: shares scale the limits, stale ones fall back to an even split", "[auth][quota]") {
  quota_board_config c;
  c.shares_keep_ns = 3 * s;
  quota_board b(c);
  const tenant_limits whole{10, 6000, 8, 0};
  // Before any answer: this gateway alone, the whole limits.
  CHECK_FALSE(b.limits_for("acme", whole).shared);
  CHECK(b.limits_for("acme", whole).limits == whole);
  quota_grant g;
  g.gateways = 4;
  g.shares = {{"acme", 0.25, 0.5, 0.375}};
  CHECK_FALSE(b.apply(g, 0));
  auto part = b.limits_for("acme", whole);
  CHECK(part.shared);
  CHECK(part.limits.requests_per_s == Approx(2.5));
  CHECK(part.limits.tokens_per_min == Approx(3000));
  CHECK(part.limits.max_concurrent == 3);
  // A tenant without a share: limit / gateways.
  auto other = b.limits_for("beta", whole);
  CHECK(other.limits.requests_per_s == Approx(2.5));
  CHECK(other.limits.max_concurrent == 2);
  CHECK_FALSE(b.expire_shares(3 * s));
  CHECK(b.expire_shares(3 * s + 1));
  CHECK_FALSE(b.expire_shares(10 * s));  // said once
  CHECK(b.fell_back());
  CHECK(b.limits_for("acme", whole).limits.requests_per_s == Approx(2.5));
  CHECK(b.limits_for("acme", whole).limits.max_concurrent == 2);
  CHECK(b.apply(g, 11 * s));  // the fallback ends
  CHECK_FALSE(b.fell_back());
  // A zero share of requests in flight refuses them all (0 would mean unlimited).
  g.shares = {{"acme", 1, 1, 0}};
  b.apply(g, 12 * s);
  CHECK(b.limits_for("acme", whole).concurrent_none);
}

TEST_CASE("board: demand per period, idle tenants forgotten, bounded", "[auth][quota]") {
  quota_board_config c;
  c.tenants_max = 2;
  c.idle_reports_max = 2;
  quota_board b(c);
  const tenant_limits whole{10, 600, 4, 0};
  for (int i = 0; i < 6; ++i) b.note_arrival("acme", whole, 50);
  b.note_admitted("acme");
  b.note_admitted("acme");
  b.note_refused_concurrent("acme");
  b.note_arrival("beta", whole, 1);
  b.note_arrival("gamma", whole, 1);  // past the bound: not tracked
  auto d = b.take_demand(2.0);
  REQUIRE(d.size() == 2);
  CHECK(d[0].tenant == "acme");
  CHECK(d[0].requests_per_s == Approx(3));
  CHECK(d[0].tokens_per_min == Approx(9000));
  CHECK(d[0].concurrent == Approx(3));  // 2 in flight + 1 refused
  CHECK(d[0].limit_requests_per_s == 10);
  CHECK(d[0].limit_concurrent == 4);
  b.note_finished("acme");
  auto next = b.take_demand(1.0);
  CHECK(next[0].requests_per_s == 0);
  CHECK(next[0].concurrent == Approx(2));  // the peak carries over what is still in flight
  // beta idles out after two idle reports past the one it arrived in.
  b.take_demand(1.0);
  auto later = b.take_demand(1.0);
  REQUIRE(later.size() == 1);
  CHECK(later[0].tenant == "acme");  // one request is still in flight
  CHECK(b.tenants() == 1);
}

TEST_CASE("shared limiter: two gateways under one authority admit the limit between them", "[auth][quota]") {
  // Pure simulation of the protocol: every second each gateway reports and
  // applies its grant; a client floods each gateway at 50 requests a second.
  quota_authority authority;
  auto b1 = std::make_shared<quota_board>(), b2 = std::make_shared<quota_board>();
  shared_tenant_limiter g1(b1), g2(b2);
  const tenant_limits whole{10, 0, 0, 0};
  std::uint64_t admitted = 0, measured_from = 0;
  for (std::int64_t t = 0; t <= 63 * s; t += 20 * ms) {
    if (t % s == 0) {
      b1->apply(*authority.report(1, b1->take_demand(1), t), t);
      b2->apply(*authority.report(2, b2->take_demand(1), t), t);
    }
    if (t == 3 * s) measured_from = admitted;
    for (auto* g : {&g1, &g2})
      if (auto a = g->admit("acme", whole, t, 16)) {
        ++admitted;
        g->finish(*a, 16, t);
      }
  }
  const double rate = static_cast<double>(admitted - measured_from) / 60.0;
  CHECK(rate <= 10 * 1.02);
  CHECK(rate >= 10 * 0.9);
  // Refusals name the whole limit and this gateway's part of it.
  auto r = g1.admit("acme", whole, 63 * s, 16);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Contains("limit of 10 requests per second") && Contains("5 at this one"));
}

TEST_CASE("shared limiter: a zero share of requests in flight refuses with the limit's name", "[auth][quota]") {
  auto board = std::make_shared<quota_board>();
  quota_grant g;
  g.gateways = 2;
  g.shares = {{"acme", 1, 1, 0}};
  board->apply(g, 0);
  shared_tenant_limiter l(board);
  auto r = l.admit("acme", {0, 0, 1, 0}, 0, 16);
  REQUIRE_FALSE(r);
  CHECK(r.error().limit == "max_concurrent");
  CHECK(r.error().code == errc::overloaded);
  CHECK(r.error().retry_after_ms > 0);
  auto d = board->take_demand(1);
  REQUIRE(d.size() == 1);
  CHECK(d[0].concurrent == 1);  // the refusal is demand
  // max_tokens past the tenant's cap stays a 400 and is not demand.
  auto big = l.admit("beta", {0, 0, 0, 8}, 0, 9);
  REQUIRE_FALSE(big);
  CHECK(big.error().code == errc::invalid_argument);
  CHECK(board->take_demand(1).size() == 1);
}
