// Prefix-aware routing: the router's prefix index (reports, optimistic
// updates, bounds), the policy's choice between cached prefix and load, and a
// seeded cross-check of the table against a brute-force reference.

#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <limits>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "cluster/routing.hpp"
#include "model/prefix_hash.hpp"

using namespace exa;
using namespace exa::cluster;

namespace {

constexpr std::uint32_t block = 16;

// A conversation's prompt: a shared system prompt of `app`, then `user`
// tokens of its own, so prompts of one app share their first blocks.
std::vector<model::token_id> prompt(std::uint32_t app, std::uint32_t system_tokens, std::uint32_t conv,
                                    std::uint32_t user_tokens) {
  std::vector<model::token_id> t;
  for (std::uint32_t i = 0; i < system_tokens; ++i) t.push_back(static_cast<model::token_id>(1000 * app + i % 997));
  for (std::uint32_t i = 0; i < user_tokens; ++i) t.push_back(static_cast<model::token_id>(50000 + conv * 131 + i));
  return t;
}

std::vector<std::uint64_t> hashes(const std::vector<model::token_id>& tokens) {
  return model::prefix_block_hashes(tokens, block);
}

routing_candidate candidate(replica_id id, std::uint64_t tokens = 0) {
  routing_candidate c;
  c.id = id;
  c.slot = slot_ref{"m", static_cast<std::uint32_t>(id)};
  c.epoch = 1;
  c.model = "m";
  c.version = "v1";
  c.state = replica_state::ready;
  c.outstanding_tokens = tokens;
  return c;
}

load_report report(std::uint64_t outstanding, std::vector<std::uint64_t> held, std::uint32_t block_tokens = block,
                   double prefill_tokens_per_s = 0) {
  load_report r;
  r.outstanding_tokens = outstanding;
  r.prefill_tokens_per_s = prefill_tokens_per_s;
  r.prefix_block_tokens = block_tokens;
  r.prefix_hashes = std::move(held);
  return r;
}

request_cost cost_of(const std::vector<std::uint64_t>& h, std::uint32_t prompt_tokens = 0) {
  request_cost c{prompt_tokens == 0 ? static_cast<std::uint32_t>(h.size() * block) : prompt_tokens, 16};
  c.prefix_block_tokens = block;
  c.prefix_hashes = h;
  return c;
}

replica_table prefix_table(std::uint32_t replicas, prefix_aware_config config = {}) {
  replica_table_config tc;
  tc.default_policy = "prefix_aware";
  tc.prefix_aware = config;
  auto table = replica_table::create(tc);
  REQUIRE(table);
  for (replica_id id = 1; id <= replicas; ++id) REQUIRE(table->upsert(candidate(id)));
  return std::move(*table);
}

}  // namespace

TEST_CASE("the prefix index matches leading blocks only, per block size", "[routing][prefix]") {
  prefix_index index;
  const auto a = hashes(prompt(1, 64, 1, 64));  // 8 blocks
  const auto b = hashes(prompt(1, 64, 2, 64));  // shares the 4 system blocks
  const auto c = hashes(prompt(2, 64, 1, 64));  // another app: shares nothing
  REQUIRE(a.size() == 8);
  index.replace(7, block, a);
  CHECK(index.matched_blocks(7, block, a) == 8);
  CHECK(index.matched_blocks(7, block, b) == 4);
  CHECK(index.matched_blocks(7, block, c) == 0);
  CHECK(index.matched_blocks(8, block, a) == 0);         // unknown replica
  CHECK(index.matched_blocks(7, 32, a) == 0);            // another block size never matches
  CHECK(index.block_tokens() == block);
  // A hole: the replica holds blocks 0, 1 and 3 but not 2 -- only 2 count.
  std::vector<std::uint64_t> holed = {a[0], a[1], a[3]};
  index.replace(7, block, holed);
  CHECK(index.matched_blocks(7, block, a) == 2);
  // Block size 0 (no prefix cache any more) forgets the replica.
  index.replace(7, 0, a);
  CHECK(index.replicas() == 0);
}

TEST_CASE("the prefix index keeps the most recent reported hashes up to its bound", "[routing][prefix]") {
  prefix_index index(prefix_index_config{4, 3});
  const auto a = hashes(prompt(1, 0, 1, 160));  // 10 blocks
  // Most recently used first: the replica's newest blocks are the tail of a.
  std::vector<std::uint64_t> mru(a.rbegin(), a.rend());
  index.replace(1, block, mru);
  CHECK(index.held(1) == 4);
  CHECK(index.matched_blocks(1, block, std::vector<std::uint64_t>(a.begin() + 6, a.end())) == 4);
  CHECK(index.matched_blocks(1, block, a) == 0);
  // Routed blocks: bounded by pending_max, oldest dropped first.
  index.note_routed(1, block, std::span(a).first(5));
  CHECK(index.held(1) == 4 + 3);
  CHECK(index.matched_blocks(1, block, a) == 0);  // blocks 0 and 1 were dropped
  // Pending 2..4, reported 6..9: block 5 is held by neither.
  CHECK(index.matched_blocks(1, block, std::span(a).subspan(2)) == 3);
  CHECK(index.matched_blocks(1, block, std::span(a).subspan(6)) == 4);
}

TEST_CASE("blocks the router sent survive exactly one report", "[routing][prefix]") {
  prefix_index index;
  const auto a = hashes(prompt(1, 64, 1, 64));
  index.replace(1, block, {});
  index.note_routed(1, block, a);
  CHECK(index.matched_blocks(1, block, a) == a.size());
  index.replace(1, block, {});  // the request has not reached the engine yet
  CHECK(index.matched_blocks(1, block, a) == a.size());
  index.replace(1, block, {});  // by now the engine would report them if it had them
  CHECK(index.matched_blocks(1, block, a) == 0);
  // A routed request to a replica that reported another block size (or none) is ignored.
  index.note_routed(2, block, a);
  CHECK(index.held(2) == 0);
  index.replace(3, 32, {});
  index.note_routed(3, block, a);
  CHECK(index.held(3) == 0);
}

TEST_CASE("prefix_aware picks the longest cached prefix near the least loaded", "[routing][prefix]") {
  auto table = prefix_table(3);
  const auto conv = hashes(prompt(1, 256, 1, 256));  // 32 blocks
  const auto other = hashes(prompt(1, 256, 2, 256));  // same app: 16 shared blocks
  // Replica 2 holds the conversation, replica 3 only the app's system prompt.
  REQUIRE(table.update_load(1, report(0, {})));
  REQUIRE(table.update_load(2, report(1000, conv)));
  REQUIRE(table.update_load(3, report(500, std::vector<std::uint64_t>(conv.begin(), conv.begin() + 16))));
  CHECK(table.prefix_block_tokens("m") == block);
  CHECK((*table.route("m", "", cost_of(conv)))->id == 2);
  // Back to the reported loads: the other conversation of the app has 16
  // blocks on 2 and on 3; the less loaded (3) wins the tie.
  REQUIRE(table.update_load(2, report(1000, conv)));
  CHECK((*table.route("m", "", cost_of(other)))->id == 3);
  // No hashes at all (a caller that did not hash): least loaded.
  REQUIRE(table.update_load(2, report(1000, conv)));
  REQUIRE(table.update_load(3, report(500, {})));
  CHECK((*table.route("m", "", request_cost{512, 16}))->id == 1);
}

TEST_CASE("prefix_aware leaves a cached prefix when its replica is past the load bound", "[routing][prefix]") {
  prefix_aware_config config;
  config.load_slack_tokens = 1000;
  config.load_slack_ratio = 0.5;
  const auto conv = hashes(prompt(1, 256, 1, 256));
  // A fresh table per decision: a routed request's blocks would otherwise
  // count for the replica it went to.
  const auto choose = [&](std::uint64_t load1, std::uint64_t load2) {
    auto table = prefix_table(2, config);
    REQUIRE(table.update_load(1, report(load1, {})));
    REQUIRE(table.update_load(2, report(load2, conv)));
    return (*table.route("m", "", cost_of(conv)))->id;
  };
  // Bound = min + max(1000, 0.5 min). min 0: 1000 is within, 1001 is not.
  CHECK(choose(0, 1000) == 2);
  CHECK(choose(0, 1001) == 1);
  // min 4000: the ratio's 2000 is the slack.
  CHECK(choose(4000, 6000) == 2);
  CHECK(choose(4000, 6001) == 1);
  // The cached replica is itself the least loaded: it wins.
  CHECK(choose(10, 0) == 2);
}

TEST_CASE("prefix_aware's slack in time: a replica's token slack is what it prefills in load_slack_s",
          "[routing][prefix]") {
  const auto conv = hashes(prompt(1, 256, 1, 256));
  // Replica 1 holds nothing at load1, replica 2 the conversation at load2;
  // each reports the prefill speed given (0: none yet).
  const auto choose = [&](prefix_aware_config config, std::uint64_t load1, double speed1, std::uint64_t load2,
                          double speed2) {
    auto table = prefix_table(2, config);
    REQUIRE(table.update_load(1, report(load1, {}, block, speed1)));
    REQUIRE(table.update_load(2, report(load2, conv, block, speed2)));
    return (*table.route("m", "", cost_of(conv)))->id;
  };
  prefix_aware_config config;  // the defaults: 2048 tokens, ratio 0.25, 0.2 s
  REQUIRE(config.load_slack_tokens == 2048);
  REQUIRE(config.load_slack_s == 0.2);
  // A CPU replica prefilling 1,000 tokens/s: 0.2 s is 200 tokens.
  CHECK(choose(config, 0, 1000, 200, 1000) == 2);
  CHECK(choose(config, 0, 1000, 201, 1000) == 1);
  // A fast one: 0.2 s is 20,000 tokens, capped at the 2048.
  CHECK(choose(config, 0, 1e5, 2048, 1e5) == 2);
  CHECK(choose(config, 0, 1e5, 2049, 1e5) == 1);
  // The bound is the holder's own speed, not the least loaded one's.
  CHECK(choose(config, 0, 1e5, 201, 1000) == 1);
  CHECK(choose(config, 0, 1000, 2000, 1e5) == 2);
  // No speed reported by the holder: the pool's median known one (here
  // replica 1's); none at all: the tokens alone.
  CHECK(choose(config, 0, 1000, 201, 0) == 1);
  CHECK(choose(config, 0, 1000, 200, 0) == 2);
  CHECK(choose(config, 0, 0, 2048, 0) == 2);
  CHECK(choose(config, 0, 0, 2049, 0) == 1);
  // The ratio still applies over it: min 4,000 x 0.25 = 1,000 > 200.
  CHECK(choose(config, 4000, 1000, 5000, 1000) == 2);
  CHECK(choose(config, 4000, 1000, 5001, 1000) == 1);
  // 0 s: the tokens alone, whatever the speed.
  config.load_slack_s = 0;
  CHECK(choose(config, 0, 1000, 2048, 1000) == 2);
  CHECK(choose(config, 0, 1000, 2049, 1000) == 1);
  // A model's own seconds through set_policy: 1,500 queued tokens at 1,000
  // tokens/s are within 1.5 s, past 1 s.
  auto table = prefix_table(2);
  const auto choose_with = [&](double seconds) {
    REQUIRE(table.set_policy("m", "prefix_aware", 2048, 0, seconds));
    REQUIRE(table.update_load(1, report(0, {}, block, 1000)));
    REQUIRE(table.update_load(2, report(1500, conv, block, 1000)));
    return (*table.route("m", "", cost_of(conv)))->id;
  };
  CHECK(choose_with(1.5) == 2);
  CHECK(choose_with(1.0) == 1);
}

TEST_CASE("a burst of one conversation sticks before any report, then spreads under load", "[routing][prefix]") {
  prefix_aware_config config;
  config.load_slack_tokens = 2048;
  config.load_slack_ratio = 0;
  auto table = prefix_table(4, config);
  for (replica_id id = 1; id <= 4; ++id) REQUIRE(table.update_load(id, report(0, {})));
  const auto p = prompt(3, 512, 9, 512);
  const auto h = hashes(p);
  // Each request is charged 1024 + 16 tokens. The first lands on the least
  // loaded (1), the second follows its blocks (within 2048 of the others'
  // 0), the third would put 1 past the bound: it goes to 2, which from then
  // on holds the prefix too.
  std::vector<replica_id> got;
  for (int i = 0; i < 6; ++i) got.push_back((*table.route("m", "", cost_of(h)))->id);
  CHECK(got == std::vector<replica_id>{1, 1, 2, 2, 3, 3});
  // With least_outstanding the same burst goes round the replicas.
  auto plain = prefix_table(4);
  REQUIRE(plain.set_policy("m", "least_outstanding"));
  std::vector<replica_id> spread;
  for (int i = 0; i < 4; ++i) spread.push_back((*plain.route("m", "", cost_of(h)))->id);
  CHECK(spread == std::vector<replica_id>{1, 2, 3, 4});
}

TEST_CASE("a replica that leaves is forgotten by the prefix index", "[routing][prefix]") {
  auto table = prefix_table(2);
  const auto conv = hashes(prompt(1, 256, 1, 256));
  REQUIRE(table.update_load(1, report(100, {})));
  REQUIRE(table.update_load(2, report(200, conv)));
  REQUIRE(table.remove(2));
  REQUIRE(table.upsert(candidate(2, 200)));  // back with the same id, nothing reported yet
  REQUIRE(table.update_load(1, report(100, {})));
  CHECK((*table.route("m", "", cost_of(conv)))->id == 1);
  CHECK(table.prefix_block_tokens("unknown") == 0);
  REQUIRE(table.set_policy("m", "least_outstanding"));
  CHECK(table.prefix_block_tokens("m") == 0);
}

TEST_CASE("prefix_aware's choices match brute force under random reports", "[routing][prefix]") {
  // Replicas report random prefixes of a few conversations' blocks before
  // every decision; requests are random conversations. The reference
  // recomputes the rule from the reports, plus the blocks of the previous
  // decision on the replica it chose (routed before this report, so carried
  // through it).
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    prefix_aware_config config;
    config.load_slack_tokens = 1500;
    config.load_slack_ratio = 0.2;
    config.load_slack_s = 0.3;
    rng_state rng(seed);
    const std::uint32_t n = 2 + rng.below(7);
    auto table = prefix_table(n, config);
    // Each replica's prefill speed, the same in every report (so smoothing
    // keeps it): unknown (0) for about a third, else 500-20,000 tokens/s,
    // which puts the slack in time on both sides of the 1500-token cap.
    // Seeds 1-2: no speed at all, tokens alone.
    std::map<replica_id, double> speed;
    for (replica_id id = 1; id <= n; ++id)
      speed[id] = seed <= 2 || rng.below(3) == 0 ? 0.0 : double(500 + rng.below(19501));
    std::vector<double> known;
    for (const auto& [id, v] : speed)
      if (v > 0) known.push_back(v);
    std::sort(known.begin(), known.end());
    const double median = known.empty()                ? 0
                          : known.size() % 2 == 1      ? known[known.size() / 2]
                                                       : (known[known.size() / 2 - 1] + known[known.size() / 2]) / 2;
    const auto slack_of = [&](replica_id id, std::uint64_t min) {
      const double v = speed[id] > 0 ? speed[id] : median;
      std::uint64_t fixed = 1500;
      if (v > 0) fixed = std::min<std::uint64_t>(fixed, static_cast<std::uint64_t>(config.load_slack_s * v));
      return std::max<std::uint64_t>(fixed, static_cast<std::uint64_t>(0.2 * double(min)));
    };
    std::vector<std::vector<std::uint64_t>> convs;
    for (std::uint32_t c = 0; c < 6; ++c) convs.push_back(hashes(prompt(c % 2, 128, c, 64 + 32 * c)));
    std::map<replica_id, std::set<std::uint64_t>> held;
    std::map<replica_id, std::uint64_t> load;
    replica_id last_chosen = 0;
    std::vector<std::uint64_t> last_request;
    for (int step = 0; step < 400; ++step) {
      // A report from every replica: a random prefix of random conversations, random load.
      for (replica_id id = 1; id <= n; ++id) {
        std::vector<std::uint64_t> h;
        for (const auto& cv : convs)
          if (rng.below(3) == 0) h.insert(h.end(), cv.begin(), cv.begin() + rng.below(cv.size() + 1));
        load[id] = rng.below(6000);
        held[id] = std::set<std::uint64_t>(h.begin(), h.end());
        if (id == last_chosen) held[id].insert(last_request.begin(), last_request.end());
        REQUIRE(table.update_load(id, report(load[id], h, block, speed[id])));
      }
      const auto& req = convs[rng.below(convs.size())];
      const std::uint64_t min = std::min_element(load.begin(), load.end(), [](auto& a, auto& b) {
                                  return a.second < b.second;
                                })->second;
      // Ties go to the first id after the last chosen, wrapping around: visit
      // the ids in that order and let only a strictly better one replace.
      std::vector<replica_id> order;
      for (replica_id i = 0; i < n; ++i) order.push_back((last_chosen + i) % n + 1);
      replica_id expect = 0;
      std::size_t best = 0;
      for (const replica_id id : order) {  // least loaded, first after the cursor
        if (load[id] == min && expect == 0) expect = id;
      }
      for (const replica_id id : order) {
        if (load[id] > min + slack_of(id, min)) continue;
        std::size_t m = 0;
        while (m < req.size() && held[id].count(req[m])) ++m;
        if (m == 0) continue;
        if (m > best || (m == best && load[id] < load[expect])) {
          best = m;
          expect = id;
        }
      }
      INFO("seed " << seed << " step " << step);
      const auto routed = table.route("m", "", cost_of(req));
      REQUIRE(routed);
      REQUIRE((*routed)->id == expect);
      last_chosen = expect;
      last_request = req;
    }
  }
}

TEST_CASE("a model's own prefix slack overrides the table's, and bad values are refused naming the key",
          "[routing][prefix]") {
  const auto conv = hashes(prompt(1, 256, 1, 256));
  // Replica 2 holds the conversation 1500 tokens behind replica 1: within
  // the default 2048, past a deployment's 1000.
  const auto choose = [&](std::optional<std::pair<std::uint64_t, double>> slack) {
    auto table = prefix_table(2);
    if (slack) REQUIRE(table.set_policy("m", "prefix_aware", slack->first, slack->second, 0.2));
    REQUIRE(table.update_load(1, report(0, {})));
    REQUIRE(table.update_load(2, report(1500, conv)));
    return (*table.route("m", "", cost_of(conv)))->id;
  };
  CHECK(choose(std::nullopt) == 2);
  CHECK(choose(std::pair<std::uint64_t, double>{1000, 0}) == 1);
  CHECK(choose(std::pair<std::uint64_t, double>{1500, 0}) == 2);

  auto table = prefix_table(1);
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto& [tokens, ratio, seconds, words] : std::vector<std::tuple<std::uint64_t, double, double, std::string>>{
           {0, -0.1, 0, "prefix_slack_ratio must be a number in [0, 100], got -0.1"},
           {0, 100.5, 0, "prefix_slack_ratio"},
           {0, inf, 0, "prefix_slack_ratio"},
           {0, nan, 0, "prefix_slack_ratio"},
           {prefix_slack_tokens_max + 1, 0.25, 0, "prefix_slack_tokens must be in [0, 4294967296], got 4294967297"},
           {0, 0.25, -0.5, "prefix_slack_s must be a number of seconds in [0, 3600], got -0.5"},
           {0, 0.25, 3600.5, "prefix_slack_s"},
           {0, 0.25, inf, "prefix_slack_s"},
           {0, 0.25, nan, "prefix_slack_s"}}) {
    const auto ok = table.set_policy("m", "prefix_aware", tokens, ratio, seconds);
    INFO(words);
    REQUIRE_FALSE(ok);
    CHECK(ok.error().code == errc::invalid_argument);
    CHECK(ok.error().message.find(words) != std::string::npos);
    CHECK_FALSE(check_prefix_slack(tokens, ratio, seconds));
  }
  CHECK(table.policy_name("m").value() == "prefix_aware");  // a refused change leaves the policy
  CHECK(check_prefix_slack(0, 0, 0));
  CHECK(check_prefix_slack(prefix_slack_tokens_max, prefix_slack_ratio_max, prefix_slack_s_max));
}

TEST_CASE("prefix_aware refuses a bad configuration", "[routing][prefix]") {
  prefix_aware_config bad;
  bad.load_slack_ratio = -1;
  CHECK_FALSE(make_routing_policy("prefix_aware", {}, bad));
  bad.load_slack_ratio = 0.5;
  bad.load_slack_s = -1;
  CHECK_FALSE(make_routing_policy("prefix_aware", {}, bad));
  bad.load_slack_s = std::numeric_limits<double>::quiet_NaN();
  CHECK_FALSE(make_routing_policy("prefix_aware", {}, bad));
  bad.load_slack_s = 0.2;
  bad.index.reported_max = 0;
  CHECK_FALSE(make_routing_policy("prefix_aware", {}, bad));
  replica_table_config tc;
  tc.default_policy = "prefix_aware";
  tc.prefix_aware = bad;
  CHECK_FALSE(replica_table::create(tc));
}
