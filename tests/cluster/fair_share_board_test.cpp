// Fair queuing shared across gateways: the controller's authority sums what
// each gateway charged into global counters (totals, so repeats count once),
// lifts a tenant back from idle without credit, forgets stale gateways and
// idle tenants and stays bounded; a gateway's board orders by the global
// counter plus what it charged since, and falls back to its own counters
// without answers. The last case serves two gateways' queues through the
// exchange and checks the split.

#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "cluster/fair_share_board.hpp"

using namespace exa;
using namespace exa::cluster;

namespace {

constexpr std::int64_t s_ns = 1'000'000'000;

fair_share_entry entry(std::string d, std::string t, double charged, std::uint32_t waiting, std::uint64_t gen = 1) {
  return {std::move(d), std::move(t), gen, charged, waiting};
}

double find(const fair_share_answer& a, const std::string& d, const std::string& t) {
  for (const auto& dc : a.deployments)
    if (dc.deployment == d) {
      for (const auto& c : dc.counters)
        if (c.tenant == t) return c.counter;
      return dc.floor;
    }
  return -1;
}

}  // namespace

TEST_CASE("the authority sums what each gateway's totals grew by, once", "[cluster][fair_share]") {
  fair_share_authority a;
  REQUIRE(a.report({1, {entry("m", "acme", 100, 3), entry("m", "beta", 0, 2)}}, 0));
  REQUIRE(a.report({2, {entry("m", "acme", 50, 3)}}, 0));
  CHECK(a.counter("m", "acme") == Approx(150));
  // The same totals again (a lost answer, a repeat) add nothing.
  auto again = a.report({1, {entry("m", "acme", 100, 3), entry("m", "beta", 0, 2)}}, s_ns);
  REQUIRE(again);
  CHECK(find(*again, "m", "acme") == Approx(150));
  CHECK(again->gateways == 2);
  // Growth counts; a total that went down (the gateway started again) counts whole.
  REQUIRE(a.report({1, {entry("m", "acme", 130, 3), entry("m", "beta", 0, 2)}}, 2 * s_ns));
  CHECK(a.counter("m", "acme") == Approx(180));
  REQUIRE(a.report({2, {entry("m", "acme", 20, 3)}}, 2 * s_ns));
  CHECK(a.counter("m", "acme") == Approx(200));
  // So does a new generation of the same entry.
  REQUIRE(a.report({2, {entry("m", "acme", 25, 3, 7)}}, 2 * s_ns));
  CHECK(a.counter("m", "acme") == Approx(225));
  // Nonsense totals are ignored.
  REQUIRE(a.report({2, {entry("m", "acme", -5, 3, 8)}}, 2 * s_ns));
  CHECK(a.counter("m", "acme") == Approx(225));
}

TEST_CASE("a tenant back from idle is lifted to the backlogged floor, no banked credit", "[cluster][fair_share]") {
  fair_share_authority a;
  // acme floods both gateways; beta has been away.
  REQUIRE(a.report({1, {entry("m", "acme", 1000, 5), entry("m", "beta", 10, 0)}}, 0));
  REQUIRE(a.report({2, {entry("m", "acme", 1000, 5)}}, 0));
  CHECK(a.counter("m", "acme") == Approx(2000));
  // beta is forgotten (idle, below the floor) and stands at the floor.
  CHECK(a.counter("m", "beta") == Approx(2000));
  // beta becomes backlogged at gateway 1 after 40 more tokens: lifted first, then charged.
  auto ans = a.report({1, {entry("m", "acme", 1100, 5), entry("m", "beta", 50, 4)}}, s_ns);
  REQUIRE(ans);
  CHECK(find(*ans, "m", "beta") == Approx(2000 + 40));
  CHECK(find(*ans, "m", "acme") == Approx(2100));
  // With nobody backlogged the floor is the largest counter served.
  fair_share_authority b;
  REQUIRE(b.report({1, {entry("m", "acme", 500, 0), entry("m", "beta", 100, 0)}}, 0));
  auto idle = b.report({1, {entry("m", "acme", 500, 0), entry("m", "beta", 100, 1)}}, s_ns);
  REQUIRE(idle);
  CHECK(find(*idle, "m", "beta") == Approx(500));
  // Deployments are separate.
  CHECK(find(*idle, "other", "beta") == -1);
}

TEST_CASE("a stale gateway's lease ends: its backlog stops counting, its service stays", "[cluster][fair_share]") {
  fair_share_authority a({.lease_ns = 5 * s_ns});
  REQUIRE(a.report({1, {entry("m", "acme", 100, 2)}}, 0));
  REQUIRE(a.report({2, {entry("m", "acme", 300, 2), entry("m", "beta", 200, 2)}}, 0));
  CHECK(a.gateways() == 2);
  // beta became backlogged: lifted to acme's 100 before its 200 were charged.
  CHECK(a.counter("m", "beta") == Approx(300));
  REQUIRE(a.report({1, {entry("m", "acme", 100, 2)}}, 3 * s_ns));
  auto later = a.report({1, {entry("m", "acme", 100, 2)}}, 6 * s_ns);
  REQUIRE(later);
  CHECK(a.gateways() == 1);
  CHECK(later->gateways == 1);
  // acme's 400 stay counted; beta, no longer backlogged anywhere and below
  // acme, is forgotten to the floor.
  CHECK(a.counter("m", "acme") == Approx(400));
  CHECK(a.counter("m", "beta") == Approx(400));
  CHECK(a.counters() == 1);
  // Nobody reports the deployment any more: it is dropped.
  CHECK(a.expire(12 * s_ns) == 1);
  CHECK(a.counters() == 0);
}

TEST_CASE("the authority is bounded", "[cluster][fair_share]") {
  fair_share_authority a({.lease_ns = 5 * s_ns, .gateways_max = 2, .entries_max = 3});
  std::vector<fair_share_entry> many;
  for (int i = 0; i < 4; ++i) many.push_back(entry("m", "t" + std::to_string(i), 10, 1));
  auto too_many = a.report({1, many}, 0);
  REQUIRE_FALSE(too_many);
  CHECK(too_many.error().code == errc::invalid_argument);
  REQUIRE(a.report({1, {entry("m", "a", 10, 1), entry("m", "b", 20, 1), entry("m", "c", 30, 1)}}, 0));
  REQUIRE(a.report({2, {entry("n", "d", 40, 1)}}, 0));  // a fourth counter is not kept
  CHECK(a.counters() == 3);
  auto third = a.report({3, {}}, 0);
  REQUIRE_FALSE(third);
  CHECK(third.error().code == errc::overloaded);
}

TEST_CASE("a board orders by the global counter plus what it charged since", "[cluster][fair_share]") {
  fair_share_board b({.entries_max = 8, .keep_ns = 3 * s_ns, .idle_reports_max = 2});
  b.note_charged("m", "acme", 100);
  CHECK(b.counter("m", "acme") == 0);  // before any answer: the queue's own counters
  auto r = b.take_report(1, {{"m", {{"acme", 2}}}});
  REQUIRE(r.entries.size() == 1);
  CHECK(r.entries[0].charged == Approx(100));
  CHECK(r.entries[0].waiting == 2);
  b.note_charged("m", "acme", 30);  // after the report was taken
  CHECK_FALSE(b.apply({{{"m", 500, {{"acme", 900}}}}, 2}, 0));
  CHECK(b.counter("m", "acme") == Approx(930));
  CHECK(b.counter("m", "beta") == Approx(500));  // not listed: the floor
  CHECK(b.gateways() == 2);
  // The queue's waiting tenants are raised to those counters.
  fair_queue q;
  REQUIRE(q.push(1, "acme", priority_class::interactive, 10));
  REQUIRE(q.push(2, "beta", priority_class::interactive, 10));
  REQUIRE(q.push(3, "gamma", priority_class::interactive, 10));
  q.pop(3);
  b.apply_to("m", q);
  CHECK(q.counter("acme") == Approx(930));
  CHECK(q.counter("beta") == Approx(500));
  CHECK(q.peek() == 2u);
  // No answer for keep_ns: back to the queue's own counters, logged once.
  CHECK_FALSE(b.expire(3 * s_ns));
  CHECK(b.expire(3 * s_ns + 1));
  CHECK_FALSE(b.expire(4 * s_ns));
  CHECK(b.fell_back());
  CHECK(b.counter("m", "acme") == 0);
  // Only what the controller never answered is reported, under a new generation.
  auto r2 = b.take_report(1, {});
  REQUIRE(r2.entries.size() == 1);
  CHECK(r2.entries[0].charged == Approx(30));
  CHECK(r2.entries[0].generation != r.entries[0].generation);
  CHECK(b.apply({{{"m", 0, {{"acme", 960}}}}, 2}, 5 * s_ns));  // ends the fallback
  CHECK(b.counter("m", "acme") == Approx(960));
}

TEST_CASE("a board is bounded and forgets idle entries", "[cluster][fair_share]") {
  fair_share_board b({.entries_max = 2, .keep_ns = 3 * s_ns, .idle_reports_max = 2});
  b.note_charged("m", "a", 1);
  b.note_charged("m", "b", 1);
  b.note_charged("m", "c", 1);
  CHECK(b.entries() == 2);
  CHECK(b.untracked() == 1);
  b.note_charged("m", "a", 0);   // nothing
  b.note_charged("m", "a", -1);  // nonsense
  (void)b.take_report(1, {});
  CHECK_FALSE(b.apply({}, 0));  // no fallback to end
  for (int i = 0; i < 2; ++i) CHECK(b.take_report(1, {}).entries.size() == 2);
  CHECK(b.take_report(1, {}).entries.empty());
  CHECK(b.entries() == 0);
}

TEST_CASE("fair_queue exposes its backlog and takes raised counters", "[cluster][fair_queue][fair_share]") {
  fair_queue q;
  REQUIRE(q.push(1, "a", priority_class::interactive, 10));
  REQUIRE(q.push(2, "a", priority_class::batch, 10));
  REQUIRE(q.push(3, "b", priority_class::interactive, 10));
  const auto bl = q.backlog();
  REQUIRE(bl.size() == 2);
  CHECK(bl[0] == std::pair<std::string, std::size_t>{"a", 2});
  q.raise_counter("a", 50);
  q.raise_counter("a", 20);  // never lowered
  q.raise_counter("zzz", 99);  // unknown: nothing
  CHECK(q.counter("a") == 50);
  CHECK(q.counter("zzz") == 0);
  CHECK(q.peek() == 3u);
}

namespace {

// Two gateways, each serving `per_tick` requests of 100 tokens a tick from
// its fair queue; acme floods both, beta gateway 0 only. Every 10 ticks the
// gateways report and apply the answers (when `shared`). Tokens served per tenant.
std::map<std::string, double> two_gateways(bool shared, int ticks) {
  fair_share_authority authority;
  fair_share_board boards[2];
  fair_queue queues[2];
  std::map<std::uint64_t, std::string> owner;
  std::uint64_t next = 1;
  std::map<std::string, double> served;
  const auto fill = [&](int g, const std::string& tenant) {
    while (queues[g].waiting(tenant) < 8) {
      REQUIRE(queues[g].push(next, tenant, priority_class::interactive, 100));
      queues[g].raise_counter(tenant, boards[g].counter("m", tenant));
      owner[next++] = tenant;
    }
  };
  for (int t = 0; t < ticks; ++t) {
    fill(0, "acme");
    fill(0, "beta");
    fill(1, "acme");
    for (int g = 0; g < 2; ++g) {
      boards[g].apply_to("m", queues[g]);
      for (int k = 0; k < 2; ++k) {
        const auto id = *queues[g].peek();
        queues[g].pop(id);
        served[owner[id]] += 100;
        boards[g].note_charged("m", owner[id], 100);
      }
    }
    if (shared && t % 10 == 0)
      for (std::uint64_t g = 0; g < 2; ++g) {
        auto r = boards[g].take_report(g, {{"m", queues[g].backlog()}});
        auto a = authority.report(r, t * 10'000'000LL);
        REQUIRE(a);
        boards[g].apply(*a, t * 10'000'000LL);
      }
  }
  return served;
}

}  // namespace

TEST_CASE("shared counters split two gateways' service by tenant, not by gateway", "[cluster][fair_share]") {
  const auto alone = two_gateways(false, 2000);
  const double alone_share = alone.at("acme") / (alone.at("acme") + alone.at("beta"));
  INFO("acme's share without sharing: " << alone_share);
  CHECK(alone_share > 0.7);  // half of gateway 0 and all of gateway 1
  const auto shared = two_gateways(true, 2000);
  const double share = shared.at("acme") / (shared.at("acme") + shared.at("beta"));
  INFO("acme's share with sharing: " << share);
  CHECK(share == Approx(0.5).epsilon(0.05));
}

TEST_CASE("places across gateways: the answer sums them, a board subtracts its own", "[cluster][fair_share]") {
  fair_share_authority a;
  const auto placed = [](std::string t, double charged, std::uint32_t waiting, std::uint32_t held, std::uint32_t slots) {
    fair_share_entry e = entry("m", std::move(t), charged, waiting);
    e.held = held;
    e.slots = slots;
    return e;
  };
  // Gateway 1: A holds all 4 of its places. Gateway 2: A 2, B 2 of 4, B waiting.
  REQUIRE(a.report({1, {placed("A", 100, 8, 4, 4)}}, 0));
  auto ans = a.report({2, {placed("A", 50, 8, 2, 4), placed("B", 50, 8, 2, 4)}}, 0);
  REQUIRE(ans);
  REQUIRE(ans->deployments.size() == 1);
  const auto& d = ans->deployments[0];
  CHECK(d.slots == 8);
  CHECK(d.active == 2);
  std::map<std::string, std::uint32_t> held;
  for (const auto& c : d.counters) held[c.tenant] = c.held;
  CHECK(held["A"] == 6);
  CHECK(held["B"] == 2);

  // Gateway 2's board: before an answer it knows nothing of the others.
  fair_share_board b;
  b.note_charged("m", "A", 50);
  b.note_charged("m", "B", 50);
  gateway_places here;
  here.slots = 4;
  here.held = {{"A", 2}, {"B", 2}};
  CHECK_FALSE(b.places("m", "B"));
  const auto r = b.take_report(2, {{"m", {{"A", 8}, {"B", 8}}}}, {{"m", here}});
  REQUIRE(r.entries.size() == 2);
  CHECK(r.entries[0].held == 2);
  CHECK(r.entries[0].slots == 4);
  REQUIRE_FALSE(b.apply(*ans, 0));
  const auto pb = b.places("m", "B");
  const auto pa = b.places("m", "A");
  REQUIRE(pb);
  REQUIRE(pa);
  CHECK(pb->slots == 4);  // gateway 1's
  CHECK(pb->held == 0);
  CHECK(pa->held == 4);
  CHECK(pa->active == 2);
  // B, 2 of 8 places with 2 tenants active: below its share, not held to
  // this gateway's cap; A, 6 of 8, is.
  CHECK(below_share_of_all_places(2, 4, 2, *pb));
  CHECK_FALSE(below_share_of_all_places(2, 4, 2, *pa));
  // A deployment the answer did not carry, and a board that fell back: none.
  CHECK_FALSE(b.places("other", "A"));
  REQUIRE(b.expire(10 * s_ns));
  CHECK_FALSE(b.places("m", "B"));
}

TEST_CASE("a tenant holding places without a kept counter is listed at the floor", "[cluster][fair_share]") {
  // B holds places but was never charged (so has no counter): it is listed
  // at the floor with its places, while the answer stays within entries_max.
  for (const std::size_t bound : {2, 1}) {
    CAPTURE(bound);
    fair_share_authority_config cfg;
    cfg.entries_max = bound;
    fair_share_authority a(cfg);
    fair_share_entry y = entry("m", "B", 0, 0);
    y.held = 3;
    y.slots = 8;
    REQUIRE(a.report({1, {entry("m", "A", 10, 1)}}, 0));
    auto ans = a.report({2, {y}}, 0);
    REQUIRE(ans);
    REQUIRE(ans->deployments.size() == 1);
    const auto& d = ans->deployments[0];
    CHECK(d.counters.size() == bound);
    CHECK(d.slots == 8);
    bool listed = false;
    for (const auto& c : d.counters)
      if (c.tenant == "B") {
        listed = true;
        CHECK(c.held == 3);
        CHECK(c.counter == Approx(d.floor));
      }
    CHECK(listed == (bound == 2));
  }
}

TEST_CASE("below its share of all the gateways' places", "[cluster][fair_share]") {
  places_elsewhere none;
  CHECK(below_share_of_all_places(0, 4, 2, none));        // 0 < 2
  CHECK_FALSE(below_share_of_all_places(2, 4, 2, none));  // 2 = ceil(4 / 2)
  places_elsewhere e{12, 5, 4};                           // 16 places, 4 tenants somewhere
  CHECK(below_share_of_all_places(0, 4, 2, e) == false);  // 0 + 5 >= 4
  e.held = 3;
  CHECK(below_share_of_all_places(0, 4, 2, e));           // 3 < 4
  CHECK(below_share_of_all_places(0, 0, 0, places_elsewhere{}) == false);  // no places: nothing to share
}

TEST_CASE("a board subtracts only the places its report carried", "[cluster][fair_share]") {
  // entries_max 1: B's places here are not in the report, so the controller
  // never counted them and they are not taken off what it answers.
  fair_share_board_config cfg;
  cfg.entries_max = 1;
  fair_share_board b(cfg);
  b.note_charged("m", "A", 10);
  gateway_places here;
  here.slots = 4;
  here.held = {{"A", 1}, {"B", 2}};
  const auto r = b.take_report(1, {}, {{"m", here}});
  REQUIRE(r.entries.size() == 1);
  CHECK(r.entries[0].tenant == "A");
  fair_share_answer ans;
  fair_deployment_counters d;
  d.deployment = "m";
  d.slots = 8;  // 4 here + 4 at another gateway
  d.active = 2;
  d.counters = {{"B", 0, 3}, {"A", 10, 1}};  // B: 3 places, all at the other gateway (first: the board keeps 1)
  ans.deployments.push_back(d);
  (void)b.apply(ans, 0);
  const auto pb = b.places("m", "B");
  REQUIRE(pb);
  CHECK(pb->held == 3);
  CHECK(pb->slots == 4);
  const auto pa = b.places("m", "A");
  REQUIRE(pa);
  CHECK(pa->held == 0);
}

TEST_CASE("an answer over several deployments stays within entries_max", "[cluster][fair_share]") {
  // Gateway 1 holds places for H1 and H2 on two deployments (never charged:
  // no counters); gateway 2 reports A on both. Its answer lists A's two
  // counters and the holders only while the whole answer has room.
  fair_share_authority_config cfg;
  cfg.entries_max = 4;
  fair_share_authority a(cfg);
  std::vector<fair_share_entry> holders;
  for (const char* d : {"m", "n"})
    for (const char* t : {"H1", "H2"}) {
      fair_share_entry e = entry(d, t, 0, 0);
      e.held = 1;
      e.slots = 4;
      holders.push_back(e);
    }
  REQUIRE(a.report({1, holders}, 0));
  const auto ans = a.report({2, {entry("m", "A", 10, 1), entry("n", "A", 10, 1)}}, 0);
  REQUIRE(ans);
  REQUIRE(ans->deployments.size() == 2);
  std::size_t listed = 0;
  for (const auto& d : ans->deployments) {
    listed += d.counters.size();
    CHECK(d.slots == 4);
  }
  CHECK(listed == 4);  // A twice, then two of the four holders
}
