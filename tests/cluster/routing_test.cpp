// Routing policies on hand-built candidate sets, the replica table's errors,
// epochs and load accounting, and a randomized cross-check of the table's
// indexes against brute-force choices (each failure prints its seed).

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>
#include <string_view>
#include <vector>

#include "cluster/routing.hpp"

using namespace exa;
using namespace exa::cluster;

namespace {

routing_candidate candidate(replica_id id, std::uint64_t tokens = 0, replica_state state = replica_state::ready) {
  routing_candidate c;
  c.id = id;
  c.slot = slot_ref{"m", static_cast<std::uint32_t>(id)};
  c.epoch = 1;
  c.model = "m";
  c.version = "v1";
  c.state = state;
  c.outstanding_tokens = tokens;
  return c;
}

routing_candidate with_speeds(routing_candidate c, double decode, double prefill) {
  c.decode_tokens_per_s = decode;
  c.prefill_tokens_per_s = prefill;
  return c;
}

replica_table make_table(std::string default_policy = "least_outstanding") {
  replica_table_config config;
  config.default_policy = std::move(default_policy);
  auto table = replica_table::create(config);
  REQUIRE(table);
  return std::move(*table);
}

// A set with one of each reason not to route: 2 is loading, 4 is suspect,
// 6 is full, 7 is stale (slot shared with 8, which has a newer epoch).
std::vector<routing_candidate> mixed_set() {
  std::vector<routing_candidate> set = {candidate(1), candidate(2, 0, replica_state::loading),
                                        candidate(3), candidate(4), candidate(5, 0, replica_state::serving),
                                        candidate(6), candidate(7), candidate(8)};
  set[3].suspect = true;
  set[5].queue_capacity_left = 0;
  set[6].slot = set[7].slot;
  set[7].epoch = 2;
  return set;
}

}  // namespace

TEST_CASE("rng is a pure function of its seed and stays in range", "[routing]") {
  rng_state a(42), b(42), c(43);
  std::vector<std::uint64_t> xa, xb, xc;
  for (int i = 0; i < 16; ++i) {
    xa.push_back(a.next());
    xb.push_back(b.next());
    xc.push_back(c.next());
  }
  CHECK(xa == xb);
  CHECK(xa != xc);
  std::array<int, 7> hits{};
  for (int i = 0; i < 70000; ++i) {
    const auto v = a.below(7);
    REQUIRE(v < 7);
    ++hits[v];
  }
  for (const int h : hits) CHECK(std::abs(h - 10000) < 500);
}

TEST_CASE("a pool admits only ready/serving, unsuspected, current, non-full candidates", "[routing]") {
  const auto set = mixed_set();
  const auto pool = candidate_pool::from(set);
  REQUIRE(pool.size() == 8);
  std::set<replica_id> eligible;
  for (const auto p : pool.eligible_positions()) eligible.insert(pool.at(p).id);
  CHECK(eligible == std::set<replica_id>{1, 3, 5, 8});
  CHECK(pool.full_count() == 1);
  // Positions follow ids whatever the input order.
  for (candidate_pool::position p = 0; p < pool.size(); ++p) CHECK(pool.at(p).id == p + 1);
  CHECK(pool.stale(6));
  CHECK_FALSE(pool.stale(7));
}

TEST_CASE("round robin cycles in id order and skips what it must not route to", "[routing]") {
  round_robin_policy rr;
  rng_state rng(1);
  const auto set = mixed_set();
  std::vector<replica_id> picks;
  for (int i = 0; i < 9; ++i) picks.push_back(*rr.choose({}, set, rng));
  CHECK(picks == std::vector<replica_id>{1, 3, 5, 8, 1, 3, 5, 8, 1});

  // Input order does not matter; a departed cursor resumes at the next id.
  round_robin_policy shuffled;
  std::vector<routing_candidate> set2 = {candidate(30), candidate(10), candidate(20)};
  CHECK(*shuffled.choose({}, set2, rng) == 10);
  CHECK(*shuffled.choose({}, set2, rng) == 20);
  set2.erase(set2.begin() + 2);  // 20 leaves
  CHECK(*shuffled.choose({}, set2, rng) == 30);
  CHECK(*shuffled.choose({}, set2, rng) == 10);
  CHECK_FALSE(shuffled.choose({}, std::vector<routing_candidate>{candidate(1, 0, replica_state::draining)}, rng));
}

TEST_CASE("least outstanding picks the minimum, ties to the first after its last choice", "[routing]") {
  least_outstanding_policy lot;
  rng_state rng(1);
  std::vector<routing_candidate> set = {candidate(1, 500), candidate(2, 70), candidate(3, 90), candidate(4, 70)};
  CHECK(*lot.choose({}, set, rng) == 2);
  set[1].suspect = true;
  CHECK(*lot.choose({}, set, rng) == 4);
  set[3].state = replica_state::degraded;
  CHECK(*lot.choose({}, set, rng) == 3);
  set[0].outstanding_tokens = 0;
  CHECK(*lot.choose({}, set, rng) == 1);
  CHECK_FALSE(lot.choose({}, std::vector<routing_candidate>{}, rng));
  // Ties: 2 and 4 (suspect cleared) at 70 after choosing 1: 2 first, then 4,
  // then 2 again; a fresh policy starts from the lowest id.
  set[0].outstanding_tokens = 500;
  set[1].suspect = false;
  set[3].state = replica_state::ready;
  CHECK(*lot.choose({}, set, rng) == 2);
  CHECK(*lot.choose({}, set, rng) == 4);
  CHECK(*lot.choose({}, set, rng) == 2);
  CHECK(*least_outstanding_policy{}.choose({}, set, rng) == 2);
}

TEST_CASE("least_loaded_from and least_tied match brute force for every cursor", "[routing]") {
  // Few distinct loads so ties are common; sizes around powers of two so
  // the tournament tree has padding leaves and uneven subtrees.
  rng_state rng(99);
  for (const std::uint32_t n : {1u, 2u, 3u, 5u, 8u, 9u, 31u, 64u, 65u}) {
    for (int round = 0; round < 20; ++round) {
      std::vector<routing_candidate> set;
      for (replica_id id = 1; id <= n; ++id) {
        auto c = candidate(id * 3, rng.below(3) * 100);  // ids with gaps
        if (rng.below(5) == 0) c.suspect = true;
        set.push_back(c);
      }
      auto pool = candidate_pool::from(set);
      const auto check_tied = [&] {
        std::uint64_t min = std::numeric_limits<std::uint64_t>::max();
        int at_min = 0;
        for (candidate_pool::position p = 0; p < n; ++p) {
          if (!pool.eligible(p)) continue;
          const auto load = pool.at(p).outstanding_tokens;
          at_min = load < min ? 1 : at_min + (load == min ? 1 : 0);
          min = std::min(min, load);
        }
        REQUIRE(pool.least_tied() == (at_min >= 2));
      };
      check_tied();
      // Ties appear and vanish as loads change one member at a time.
      for (int change = 0; change < 8; ++change) {
        const auto p = static_cast<candidate_pool::position>(rng.below(n));
        pool.apply_load(p, load_report{0, rng.below(3) * 100}, 0.2);
        check_tied();
      }
      for (candidate_pool::position start = 0; start <= n; ++start) {
        std::optional<candidate_pool::position> expect;
        for (std::uint32_t i = 0; i < n; ++i) {
          const auto p = static_cast<candidate_pool::position>((start + i) % n);
          if (!pool.eligible(p)) continue;
          if (!expect || pool.at(p).outstanding_tokens < pool.at(*expect).outstanding_tokens) expect = p;
        }
        INFO("n " << n << " round " << round << " start " << start);
        REQUIRE(pool.least_loaded_from(start) == expect);
      }
    }
  }
}

TEST_CASE("idle replicas share sequential requests instead of the lowest id taking them", "[routing]") {
  // Light load: each request finishes (its replica reports 0) before the
  // next arrives, so every decision is a tie among idle replicas. A fixed
  // tie-break sent them all to one replica; a fair one gives each about
  // picks / n. power_of_two draws, so its bound is statistical (about 5
  // standard deviations at 2400 picks over 6 replicas, seeded).
  constexpr replica_id n = 6;
  constexpr int picks = 2400;
  for (const char* policy : {"least_outstanding", "prefix_aware", "power_of_two"}) {
    auto table = make_table(policy);
    for (replica_id id = 1; id <= n; ++id) REQUIRE(table.upsert(candidate(id)));
    std::map<replica_id, int> count;
    for (int i = 0; i < picks; ++i) {
      const auto routed = table.route("m", "", request_cost{100, 50});
      REQUIRE(routed);
      const replica_id id = (*routed)->id;
      ++count[id];
      REQUIRE(table.update_load(id, load_report{0, 0}));  // done before the next request
    }
    INFO(policy);
    REQUIRE(count.size() == n);
    const int share = picks / static_cast<int>(n);
    const int slack = std::string_view(policy) == "power_of_two" ? 90 : 0;
    for (const auto& [id, k] : count) {
      INFO("replica " << id << " took " << k);
      CHECK(std::abs(k - share) <= slack);
    }
  }
}

TEST_CASE("power of two is seed-deterministic and only picks eligible candidates", "[routing]") {
  const auto set = mixed_set();
  const std::set<replica_id> eligible = {1, 3, 5, 8};
  const auto draws = [&](std::uint64_t seed) {
    power_of_two_policy p2c;
    rng_state rng(seed);
    std::vector<replica_id> out;
    for (int i = 0; i < 200; ++i) out.push_back(*p2c.choose({}, set, rng));
    return out;
  };
  const auto a = draws(7);
  CHECK(a == draws(7));
  CHECK(a != draws(8));
  for (const auto id : a) CHECK(eligible.contains(id));
  // Two candidates: both are always drawn, so the lighter one always wins.
  power_of_two_policy p2c;
  rng_state rng(3);
  const std::vector<routing_candidate> pair = {candidate(1, 900), candidate(2, 100)};
  for (int i = 0; i < 50; ++i) CHECK(*p2c.choose({}, pair, rng) == 2);
  const std::vector<routing_candidate> one = {candidate(9, 5)};
  CHECK(*p2c.choose({}, one, rng) == 9);
}

TEST_CASE("power of two prefers less loaded replicas in proportion", "[routing]") {
  // Ten replicas, load rank k = id - 1. A replica wins iff it is drawn with a
  // heavier one: P(rank k) = 2 (n - 1 - k) / (n (n - 1)).
  std::vector<routing_candidate> set;
  for (replica_id id = 1; id <= 10; ++id) set.push_back(candidate(id, id * 100));
  const auto pool = candidate_pool::from(set);
  power_of_two_policy p2c;
  rng_state rng(2024);
  std::array<int, 10> wins{};
  constexpr int draws = 45000;
  for (int i = 0; i < draws; ++i) ++wins[pool.at(*p2c.choose({}, pool, rng)).id - 1];
  for (int k = 0; k < 10; ++k) {
    const double expected = draws * 2.0 * (9 - k) / 90.0;
    INFO("rank " << k);
    CHECK(std::abs(wins[k] - expected) < 0.08 * draws / 10);
  }
  CHECK(wins[9] == 0);
}

TEST_CASE("predictive prefers the fast idle replica and accounts for queued work", "[routing]") {
  predictive_policy pred;
  rng_state rng(1);
  const request_cost cost{100, 100};
  const std::vector<routing_candidate> idle = {with_speeds(candidate(1), 20, 2000),
                                               with_speeds(candidate(2), 100, 2000)};
  CHECK(*pred.choose(cost, idle, rng) == 2);
  // 10000 queued tokens at 100 tok/s (~100 s) lose to an idle 20 tok/s replica (~5 s).
  const std::vector<routing_candidate> queued = {with_speeds(candidate(1), 20, 2000),
                                                 with_speeds(candidate(2, 10000), 100, 2000)};
  CHECK(*pred.choose(cost, queued, rng) == 1);
  // Equal estimates: lowest id.
  const std::vector<routing_candidate> tie = {with_speeds(candidate(5), 50, 500), with_speeds(candidate(4), 50, 500)};
  CHECK(*pred.choose(cost, tie, rng) == 4);
  // Equal minima at positions 1 and 4, which the scan visits in different lanes.
  std::vector<routing_candidate> eight;
  for (replica_id id = 1; id <= 8; ++id)
    eight.push_back(with_speeds(candidate(id, id == 2 || id == 5 ? 0 : 1000), 100, 1000));
  CHECK(*pred.choose(cost, eight, rng) == 2);
}

TEST_CASE("predictive weighs prefill and decode by the request's shape", "[routing]") {
  predictive_policy pred;
  rng_state rng(1);
  // 1: fast prefill, slow decode. 2: slow prefill, fast decode.
  const std::vector<routing_candidate> set = {with_speeds(candidate(1), 10, 10000),
                                              with_speeds(candidate(2), 100, 1000)};
  CHECK(*pred.choose({10000, 1}, set, rng) == 1);  // long prompt, short answer: 1.1 s vs 10.01 s
  CHECK(*pred.choose({10, 1000}, set, rng) == 2);  // short prompt, long answer: 100 s vs 10.01 s
  const auto pool = candidate_pool::from(set);
  CHECK(pred.estimate_s({10000, 1}, pool, 0) == Approx(1.0 + 0.1));
  CHECK(pred.estimate_s({10, 1000}, pool, 1) == Approx(0.01 + 10.0));
}

TEST_CASE("predictive falls back to the median known speed, then to the default", "[routing]") {
  predictive_policy pred(predictive_config{400, 4000});
  rng_state rng(1);
  const request_cost cost{0, 100};
  // Known decode speeds 10, 20, 30 → median 20 for the unknown replica 4.
  std::vector<routing_candidate> set = {with_speeds(candidate(1, 0), 10, 1000),
                                        with_speeds(candidate(2, 10000), 20, 1000),
                                        with_speeds(candidate(3, 10000), 30, 1000), candidate(4, 0)};
  const auto pool = candidate_pool::from(set);
  CHECK(pool.median_decode_tokens_per_s() == 20);
  CHECK(pred.estimate_s(cost, pool, 3) == Approx(100.0 / 20));
  CHECK(*pred.choose(cost, set, rng) == 4);   // 5 s beats replica 1's 10 s
  set[0].decode_tokens_per_s = 40;            // median of 40, 20, 30 is 30 → 3.33 s; replica 1: 2.5 s
  CHECK(*pred.choose(cost, set, rng) == 1);
  // Even count: the mean of the middle two.
  const auto even = candidate_pool::from(
      std::vector<routing_candidate>{with_speeds(candidate(1), 10, 0), with_speeds(candidate(2), 30, 0)});
  CHECK(even.median_decode_tokens_per_s() == 20);
  // Nothing known: the configured defaults.
  const auto unknown = candidate_pool::from(std::vector<routing_candidate>{candidate(1), candidate(2)});
  CHECK(pred.estimate_s({4000, 100}, unknown, 0) == Approx(100.0 / 400 + 4000.0 / 4000));
}

TEST_CASE("the policy factory knows five names and lists them for a typo", "[routing]") {
  REQUIRE(routing_policy_names().size() == 5);
  for (const auto name : routing_policy_names()) {
    auto policy = make_routing_policy(name);
    REQUIRE(policy);
    CHECK((*policy)->name() == name);
  }
  const auto bad = make_routing_policy("fastest");
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code == errc::invalid_argument);
  CHECK(bad.error().message ==
        "unknown routing policy 'fastest'; valid policies: round_robin, least_outstanding, power_of_two, predictive, prefix_aware");
  CHECK_FALSE(make_routing_policy("predictive", predictive_config{0, 100}));
  replica_table_config config;
  config.default_policy = "nope";
  CHECK_FALSE(replica_table::create(config));
}

TEST_CASE("route tells an unknown model from one with no ready replica", "[routing]") {
  auto table = make_table();
  const auto unknown = table.route("llama", "", {});
  REQUIRE_FALSE(unknown);
  CHECK(unknown.error().code == errc::not_found);
  CHECK(unknown.error().message == "unknown model 'llama'");

  REQUIRE(table.upsert(candidate(1, 0, replica_state::loading)));
  const auto none = table.route("m", "", {});
  REQUIRE_FALSE(none);
  CHECK(none.error().code == errc::unavailable);
  CHECK(none.error().message.starts_with("no ready replica of model 'm'"));

  REQUIRE(table.set_policy("declared", "round_robin"));  // a deployment without replicas yet
  CHECK(table.route("declared", "", {}).error().code == errc::unavailable);

  REQUIRE(table.set_state(1, replica_state::ready));
  const auto routed = table.route("m", "", {});
  REQUIRE(routed);
  CHECK((*routed)->id == 1);
  CHECK(table.route("m", "v2", {}).error().code == errc::not_found);
  CHECK(table.route("m", "v1", {}));

  auto v2 = candidate(2);
  v2.version = "v2";
  REQUIRE(table.upsert(v2));
  const auto ambiguous = table.route("m", "", {});
  REQUIRE_FALSE(ambiguous);
  CHECK(ambiguous.error().code == errc::invalid_argument);
  CHECK((*table.route("m", "v2", {}))->id == 2);
  REQUIRE(table.remove(1));  // v1 empties and disappears: "m" is unambiguous again
  CHECK((*table.route("m", "", {}))->id == 2);
}

TEST_CASE("route reports overloaded when every ready replica's queue is full", "[routing]") {
  auto table = make_table();
  for (replica_id id : {1, 2}) {
    auto c = candidate(id);
    c.queue_capacity_left = 1;
    REQUIRE(table.upsert(c));
  }
  REQUIRE(table.route("m", "", {10, 10}));  // charging takes each replica's last place
  REQUIRE(table.route("m", "", {10, 10}));
  const auto full = table.route("m", "", {10, 10});
  REQUIRE_FALSE(full);
  CHECK(full.error().code == errc::overloaded);
  REQUIRE(table.update_load(2, load_report{0, 0, 0, 0, 4}));
  CHECK((*table.route("m", "", {10, 10}))->id == 2);
}

TEST_CASE("epochs fence stale replicas out of routing", "[routing]") {
  auto table = make_table();
  auto old_replica = candidate(1);
  old_replica.slot = {"m", 0};
  old_replica.epoch = 3;
  REQUIRE(table.upsert(old_replica));
  CHECK(table.slot_epoch({"m", 0}) == 3);

  auto stale = candidate(2);
  stale.slot = {"m", 0};
  stale.epoch = 2;
  const auto refused = table.upsert(stale);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == errc::stale_epoch);
  CHECK(table.find(2) == nullptr);

  REQUIRE(table.fence({"m", 0}, 4));  // the old replica is fenced: nothing routable
  CHECK(table.route("m", "", {}).error().code == errc::unavailable);
  CHECK(table.fence({"m", 0}, 3).error().code == errc::stale_epoch);

  auto replacement = candidate(3);
  replacement.slot = {"m", 0};
  replacement.epoch = 4;
  REQUIRE(table.upsert(replacement));
  for (int i = 0; i < 4; ++i) CHECK((*table.route("m", "", {}))->id == 3);

  // A newer epoch arriving by upsert fences the previous holder as well.
  auto newest = candidate(4);
  newest.slot = {"m", 0};
  newest.epoch = 5;
  REQUIRE(table.upsert(newest));
  REQUIRE(table.update_load(4, load_report{0, 1000000, 0, 0, queue_capacity_unbounded}));
  for (int i = 0; i < 4; ++i) CHECK((*table.route("m", "", {}))->id == 4);
}

TEST_CASE("route charges the request until the next load report", "[routing]") {
  auto table = make_table();
  for (replica_id id : {1, 2, 3}) REQUIRE(table.upsert(candidate(id)));
  std::vector<replica_id> picks;
  for (int i = 0; i < 6; ++i) picks.push_back((*table.route("m", "", {50, 50}))->id);
  CHECK(picks == std::vector<replica_id>{1, 2, 3, 1, 2, 3});
  CHECK(table.find(1)->outstanding_tokens == 200);
  CHECK(table.find(1)->outstanding_requests == 2);
  REQUIRE(table.update_load(3, load_report{0, 0, 0, 0, queue_capacity_unbounded}));
  CHECK((*table.route("m", "", {50, 50}))->id == 3);
  CHECK(table.update_load(99, {}).error().code == errc::not_found);
}

TEST_CASE("load reports smooth speeds and reject nonsense", "[routing]") {
  replica_table_config config;
  config.speed_ewma_alpha = 0.5;
  auto table = *replica_table::create(config);
  REQUIRE(table.upsert(candidate(1)));
  REQUIRE(table.update_load(1, load_report{1, 10, 100, 1000, 5}));
  CHECK(table.find(1)->decode_tokens_per_s == 100);  // first observation taken as is
  REQUIRE(table.update_load(1, load_report{1, 10, 200, 0, 5}));
  CHECK(table.find(1)->decode_tokens_per_s == 150);
  CHECK(table.find(1)->prefill_tokens_per_s == 1000);  // 0 = no observation
  CHECK(table.update_load(1, load_report{1, 10, -1, 0, 5}).error().code == errc::invalid_argument);
  CHECK(table.update_load(1, load_report{1, 10, NAN, 0, 5}).error().code == errc::invalid_argument);
}

TEST_CASE("state, suspicion and removal change routing and policies are per model", "[routing]") {
  auto table = make_table();
  REQUIRE(table.set_policy("other", "round_robin"));
  for (replica_id id : {1, 2}) REQUIRE(table.upsert(candidate(id)));
  auto o = candidate(10);
  o.model = "other";
  o.slot = {"other", 0};
  REQUIRE(table.upsert(o));
  CHECK(*table.policy_name("m") == "least_outstanding");
  CHECK(*table.policy_name("other") == "round_robin");
  CHECK(table.policy_name("x").error().code == errc::not_found);
  CHECK(table.set_policy("m", "bogus").error().code == errc::invalid_argument);

  REQUIRE(table.set_suspect(1, true));
  CHECK((*table.route("m", "", {1, 1}))->id == 2);
  REQUIRE(table.set_suspect(1, false));
  REQUIRE(table.set_state(2, replica_state::draining));
  CHECK((*table.route("m", "", {1, 1}))->id == 1);
  CHECK((*table.route("m", "", {1, 1}))->id == 1);
  REQUIRE(table.remove(1));
  CHECK(table.route("m", "", {}).error().code == errc::unavailable);
  CHECK(table.remove(1).error().code == errc::not_found);
  CHECK((*table.route("other", "", {}))->id == 10);
  CHECK(table.size() == 2);
}

TEST_CASE("table bounds refuse growth instead of allocating", "[routing]") {
  replica_table_config config;
  config.replicas_max = 2;
  config.models_max = 1;
  auto table = *replica_table::create(config);
  REQUIRE(table.upsert(candidate(1)));
  auto other = candidate(2);
  other.model = "other";
  CHECK(table.upsert(other).error().code == errc::overloaded);
  REQUIRE(table.upsert(candidate(2)));
  CHECK(table.upsert(candidate(3)).error().code == errc::overloaded);
  CHECK(table.upsert(candidate(2)));  // replacing an existing replica is not growth
}

// ---- randomized cross-check: indexes vs brute force ----------------------------------

namespace {

struct reference {
  replica_table* table;
  std::set<replica_id> ids;

  bool routable(const routing_candidate& c) const {
    return is_routable(c, c.epoch < table->slot_epoch(c.slot));
  }
  // Healthy replicas first; degraded ones only when no healthy one is routable.
  std::vector<const routing_candidate*> eligible() const {
    std::vector<const routing_candidate*> out;
    for (const auto id : ids) {
      const auto* c = table->find(id);
      if (routable(*c)) out.push_back(c);
    }
    if (!out.empty()) return out;
    for (const auto id : ids) {
      auto c = *table->find(id);
      if (c.state != replica_state::degraded) continue;
      c.state = replica_state::serving;
      if (routable(c)) out.push_back(table->find(id));
    }
    return out;
  }
  // Ties to the first id after the last routed one, wrapping around.
  replica_id least_outstanding(replica_id last) const {
    const auto all = eligible();
    const auto first = std::find_if(all.begin(), all.end(), [&](const auto* c) { return c->id > last; });
    const routing_candidate* best = nullptr;
    for (std::size_t i = 0; i < all.size(); ++i) {
      const auto* c = all[(static_cast<std::size_t>(first - all.begin()) + i) % all.size()];
      if (!best || c->outstanding_tokens < best->outstanding_tokens) best = c;
    }
    return best->id;
  }
  double median(bool decode) const {
    std::vector<double> known;
    for (const auto id : ids) {
      const auto* c = table->find(id);
      const double s = decode ? c->decode_tokens_per_s : c->prefill_tokens_per_s;
      if (s > 0) known.push_back(s);
    }
    if (known.empty()) return decode ? 1000 : 10000;
    std::sort(known.begin(), known.end());
    const auto n = known.size();
    return n % 2 ? known[n / 2] : (known[n / 2 - 1] + known[n / 2]) / 2;
  }
  replica_id predictive(const request_cost& cost) const {
    const routing_candidate* best = nullptr;
    double best_s = 0;
    for (const auto* c : eligible()) {
      const double d = c->decode_tokens_per_s > 0 ? c->decode_tokens_per_s : median(true);
      const double p = c->prefill_tokens_per_s > 0 ? c->prefill_tokens_per_s : median(false);
      // Same association as the policy documents, so the choice matches exactly.
      const double s = static_cast<double>(c->outstanding_tokens) * (1.0 / d) +
                       double(cost.max_tokens) * (1.0 / d) + double(cost.prompt_tokens) * (1.0 / p);
      if (!best || s < best_s) {
        best = c;
        best_s = s;
      }
    }
    return best->id;
  }
};

void random_change(replica_table& table, reference& ref, rng_state& rng, replica_id& next_id,
                   bool unknown_speeds) {
  const auto pick = [&]() {
    auto it = ref.ids.begin();
    std::advance(it, rng.below(static_cast<std::uint32_t>(ref.ids.size())));
    return *it;
  };
  constexpr std::array states = {replica_state::ready, replica_state::serving, replica_state::ready,
                                 replica_state::degraded, replica_state::warming};
  const std::uint32_t op = ref.ids.size() < 4 ? 0 : rng.below(7);
  if (op == 0) {
    auto c = candidate(next_id++, rng.below(5000));
    c.slot = {"m", rng.below(40)};
    c.epoch = table.slot_epoch(c.slot) + rng.below(2);
    const std::uint32_t unknown_one_in = unknown_speeds ? 3 : 0xffffffff;
    c.decode_tokens_per_s = rng.below(unknown_one_in) == 0 ? 0 : 10 + rng.below(90);
    c.prefill_tokens_per_s = rng.below(unknown_one_in) == 0 ? 0 : 500 + rng.below(5000);
    REQUIRE(table.upsert(c));
    ref.ids.insert(c.id);
  } else if (op == 1) {
    const double decode = rng.below(4) == 0 ? 0 : 10 + rng.below(90);
    REQUIRE(table.update_load(pick(), load_report{1, rng.below(8000), decode, 0, 1 + rng.below(3)}));
  } else if (op == 2) {
    REQUIRE(table.set_state(pick(), states[rng.below(states.size())]));
  } else if (op == 3) {
    REQUIRE(table.set_suspect(pick(), rng.below(4) == 0));
  } else if (op == 4) {
    const slot_ref slot = table.find(pick())->slot;
    REQUIRE(table.fence(slot, table.slot_epoch(slot) + 1));
  } else if (op == 5) {
    const auto id = pick();
    REQUIRE(table.remove(id));
    ref.ids.erase(id);
  } else {
    REQUIRE(table.update_load(pick(), load_report{0, rng.below(100), 0, 0, 0}));  // full queue
  }
}

void cross_check(const std::string& policy, std::uint64_t seed, bool unknown_speeds) {
  auto table = make_table(policy);
  reference ref{&table, {}};
  rng_state rng(seed);
  replica_id next_id = 1;
  replica_id last = 0;
  for (int step = 0; step < 1500; ++step) {
    random_change(table, ref, rng, next_id, unknown_speeds);
    const request_cost cost{rng.below(2000), 1 + rng.below(500)};
    const auto eligible = ref.eligible();
    const replica_id expect = eligible.empty() ? 0
                              : policy == "predictive" ? ref.predictive(cost)
                                                       : ref.least_outstanding(last);
    const auto routed = table.route("m", "", cost);
    INFO("policy " << policy << ", seed " << seed << ", unknown speeds " << unknown_speeds << ", step " << step);
    REQUIRE(routed.has_value() == !eligible.empty());
    if (routed) REQUIRE((*routed)->id == expect);
    if (routed) last = (*routed)->id;
  }
}

}  // namespace

TEST_CASE("table choices match brute force under random changes", "[routing]") {
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    cross_check("least_outstanding", seed, true);
    cross_check("predictive", seed, true);   // replicas without speeds: the fallback scan
    cross_check("predictive", seed, false);  // every speed known: the fast scan
  }
}

TEST_CASE("degraded replicas get requests only when no healthy replica can take them", "[routing]") {
  for (const char* policy : {"round_robin", "least_outstanding", "power_of_two", "predictive", "prefix_aware"}) {
    INFO(policy);
    auto table = make_table(policy);
    for (replica_id id : {1, 2, 3}) REQUIRE(table.upsert(candidate(id, 0)).has_value());
    REQUIRE(table.set_state(1, replica_state::degraded));
    auto slow = candidate(4, 0);
    slow.state = replica_state::degraded;  // degraded as first seen (a gateway joining late)
    REQUIRE(table.upsert(slow));
    for (int i = 0; i < 40; ++i) {
      auto c = table.route("m", "", {1, 1});
      REQUIRE(c.has_value());
      CHECK(((*c)->id == 2 || (*c)->id == 3));
    }
    // The healthy ones gone (draining, full): the degraded ones still serve.
    REQUIRE(table.set_state(2, replica_state::draining));
    REQUIRE(table.update_load(3, load_report{0, 0, 0, 0, 0}));
    std::set<replica_id> seen;
    for (int i = 0; i < 40; ++i) {
      auto c = table.route("m", "", {1, 1});
      REQUIRE(c.has_value());
      seen.insert((*c)->id);
      CHECK(table.find((*c)->id)->state == replica_state::degraded);  // shown, then hidden again
    }
    CHECK(seen.count(2) == 0);
    CHECK(seen.count(3) == 0);
    // Recovered: it is a full member again; removed: it is forgotten.
    REQUIRE(table.set_state(1, replica_state::ready));
    REQUIRE(table.remove(4));
    for (int i = 0; i < 10; ++i) CHECK((*table.route("m", "", {1, 1}))->id == 1);
    REQUIRE(table.set_state(1, replica_state::draining));
    CHECK(table.route("m", "", {1, 1}).error().code == errc::overloaded);
  }
}

TEST_CASE("a retry passes over a degraded replica it already failed on, unless only it is left", "[routing]") {
  auto table = make_table("least_outstanding");
  for (replica_id id : {1, 2}) {
    auto c = candidate(id, id == 1 ? 0 : 500);  // 1 is the less loaded
    c.state = replica_state::degraded;
    REQUIRE(table.upsert(c));
  }
  for (int i = 0; i < 10; ++i) CHECK((*table.route("m", "", {1, 1}, {1}))->id == 2);
  CHECK(table.route("m", "", {1, 1}, {1, 2}).has_value());  // only they are left: one is chosen after all
}

TEST_CASE("a retry passes over the replicas it already failed on, unless only they are left", "[routing]") {
  for (const char* policy : {"round_robin", "least_outstanding", "power_of_two", "predictive", "prefix_aware"}) {
    INFO(policy);
    auto table = make_table(policy);
    for (replica_id id : {1, 2, 3}) REQUIRE(table.upsert(candidate(id, id == 2 ? 0 : 100)).has_value());
    for (int i = 0; i < 20; ++i) {
      auto chosen = table.route("m", "", {1, 1}, {2, 3});
      REQUIRE(chosen.has_value());
      CHECK((*chosen)->id == 1);
    }
    // Everything excluded: a replica is still chosen (better than none)...
    auto all = table.route("m", "", {1, 1}, {1, 2, 3});
    REQUIRE(all.has_value());
    // ...and exclusion leaves no trace: with equal loads and no exclusion,
    // more than one replica wins.
    for (replica_id id : {1, 2, 3}) REQUIRE(table.update_load(id, {}).has_value());
    std::set<replica_id> seen;
    for (int i = 0; i < 200; ++i) {
      auto c = table.route("m", "", {1, 1});
      REQUIRE(c.has_value());
      seen.insert((*c)->id);
      // Report replica 1 busier each time, so load-aware policies move on.
      cluster::load_report busy;
      busy.outstanding_tokens = (*c)->id == 1 ? 1000 : 0;
      REQUIRE(table.update_load((*c)->id, busy).has_value());
    }
    CHECK(seen.size() >= 2);
    // A suspect replica stays suspect after an exclusion passed over it.
    REQUIRE(table.set_suspect(3, true).has_value());
    (void)table.route("m", "", {1, 1}, {3});
    for (int i = 0; i < 20; ++i) {
      auto c = table.route("m", "", {1, 1});
      REQUIRE(c.has_value());
      CHECK((*c)->id != 3);
      REQUIRE(table.update_load((*c)->id, {}).has_value());
    }
  }
}

TEST_CASE("region names are checked, and a gateway passes over replicas outside its region", "[routing][region]") {
  CHECK(check_region(""));
  CHECK(check_region("eu-west.1"));
  CHECK_THAT(check_region("eu west").error().message, Catch::Contains("'eu west'"));
  CHECK_FALSE(check_region(std::string(65, 'a')));
  const std::map<node_id, std::string> regions{{1, "eu"}, {2, "us"}};
  const std::vector<std::pair<replica_id, node_id>> members{{10, 1}, {11, 2}, {12, 3}};  // node 3: no region
  CHECK(outside_region("eu", members, regions) == std::vector<replica_id>{11, 12});
  CHECK(outside_region("us", members, regions) == std::vector<replica_id>{10, 12});
  CHECK(outside_region("", members, regions).empty());  // no region: no preference
  CHECK(outside_region("ap", members, regions).size() == 3);  // none local: all are the last resort, so all serve
}
