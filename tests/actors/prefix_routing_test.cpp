// Prefix-aware routing through the real router, request and replica actors
// with real CPU engines (tiny model), on the deterministic scheduler: a
// prompt sent again goes back to the replica whose prefix cache holds it,
// and is served from that cache, where the load-only policies send it
// elsewhere and compute it again.

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "cluster_fixture.hpp"

using namespace exa;

namespace {

/// 16-token KV blocks for the tiny model (256 bytes a token): a 200-token
/// prompt spans a dozen blocks.
constexpr std::size_t page_bytes = 4096;
constexpr std::uint32_t block_tokens = 16;
/// Bound on the jobs run while waiting for a first token (habit 7).
constexpr int jobs_max = 200000;

test::cluster_fixture with_policy(const std::string& policy, double prefix_slack_s = 0.2) {
  auto o = test::cluster_fixture::defaults(2);
  o.kv_page_bytes = page_bytes;
  o.deployments[0].routing = policy;
  o.deployments[0].prefix_slack_s = prefix_slack_s;
  return test::cluster_fixture(o);
}

std::vector<std::int32_t> long_prompt() {
  std::vector<std::int32_t> ids;
  for (std::int32_t i = 0; i < 200; ++i) ids.push_back(3 + (i * 37) % 250);
  return ids;
}

api::generate_request request(std::string id, std::vector<std::int32_t> prompt, std::uint32_t max_tokens = 4) {
  api::generate_request r;
  r.request_id = std::move(id);
  r.model = "tiny";
  r.prompt_ids = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

const api::generate_result& finished(const std::shared_ptr<test::recording_sink>& s) {
  REQUIRE(s->result.has_value());
  INFO((s->result->err ? s->result->err->message : std::string()));
  REQUIRE_FALSE(s->result->err.has_value());
  return *s->result;
}

/// Sends the long prompt `n` times, one after the other, and returns each
/// one's result.
std::vector<api::generate_result> repeat_sequentially(test::cluster_fixture& f, int n) {
  std::vector<api::generate_result> out;
  for (int i = 0; i < n; ++i) {
    auto s = f.generate(request("p" + std::to_string(i), long_prompt()));
    f.run();
    out.push_back(finished(s));
  }
  return out;
}

/// The long prompt once; then a long request of another prompt that is
/// still generating (it has its first token, 60 more to go) when the long
/// prompt comes again. Returns {first, other, again}. Between the first and
/// the other a short unrelated request runs to completion: idle replicas'
/// ties rotate, so it takes the second replica and the other's tie comes
/// back to the first.
std::vector<api::generate_result> repeat_beside_busy(test::cluster_fixture& f) {
  auto first = f.generate(request("first", long_prompt()));
  f.run();
  auto filler = f.generate(request("filler", std::vector<std::int32_t>{7, 8, 9}, 2));
  f.run();
  REQUIRE(finished(filler).replica != finished(first).replica);
  std::vector<std::int32_t> other_prompt(40);
  for (std::size_t i = 0; i < other_prompt.size(); ++i) other_prompt[i] = static_cast<std::int32_t>(200 + i);
  auto other = f.generate(request("other", other_prompt, 64));
  for (int jobs = 0; other->chunks.empty(); ++jobs) {
    REQUIRE(jobs < jobs_max);
    f.run_some(1);
  }
  REQUIRE_FALSE(other->result.has_value());
  auto again = f.generate(request("again", long_prompt()));
  f.run();
  return {finished(first), finished(other), finished(again)};
}

}  // namespace

TEST_CASE("prefix_aware sends a prompt sent again to the replica that cached it, served from its cache",
          "[actors][routing][prefix]") {
  auto f = with_policy("prefix_aware");
  const auto results = repeat_sequentially(f, 5);
  CHECK(results[0].usage.cached_tokens == 0);
  for (std::size_t i = 1; i < results.size(); ++i) {
    INFO("request " << i);
    CHECK(results[i].replica == results[0].replica);
    // Every full block before the last token's: (200 - 1) / 16 blocks.
    CHECK(results[i].usage.cached_tokens == (200 - 1) / block_tokens * block_tokens);
    CHECK(results[i].usage.prompt_tokens == 200);
  }
}

TEST_CASE("round_robin spreads the same prompt, so each replica computes it once", "[actors][routing][prefix]") {
  auto f = with_policy("round_robin");
  const auto results = repeat_sequentially(f, 4);
  CHECK(results[1].replica != results[0].replica);
  CHECK(results[1].usage.cached_tokens == 0);  // the other replica has not seen it
  // Both replicas hold it now.
  CHECK(results[2].usage.cached_tokens > 0);
  CHECK(results[3].usage.cached_tokens > 0);
}

TEST_CASE("prefix_aware follows the cache to a busier replica within the load slack, and least_outstanding does not",
          "[actors][routing][prefix]") {
  SECTION("prefix_aware") {
    auto f = with_policy("prefix_aware");
    const auto r = repeat_beside_busy(f);
    // The other request shares the cached replica: the setup this test is about.
    REQUIRE(r[1].replica == r[0].replica);
    CHECK(r[2].replica == r[0].replica);
    CHECK(r[2].usage.cached_tokens > 0);
  }
  // The deployment's prefix_slack_s reaches the router, and the replicas'
  // measured prefill speed sizes the slack: a microsecond of prefill is no
  // token, so the busier replica is past the bound; 0 s is tokens alone.
  SECTION("prefix_aware, slack of a microsecond") {
    auto f = with_policy("prefix_aware", 1e-6);
    const auto r = repeat_beside_busy(f);
    REQUIRE(r[1].replica == r[0].replica);
    CHECK(r[2].replica != r[0].replica);
    CHECK(r[2].usage.cached_tokens == 0);
  }
  SECTION("prefix_aware, slack in tokens alone") {
    auto f = with_policy("prefix_aware", 0);
    const auto r = repeat_beside_busy(f);
    REQUIRE(r[1].replica == r[0].replica);
    CHECK(r[2].replica == r[0].replica);
    CHECK(r[2].usage.cached_tokens > 0);
  }
  SECTION("least_outstanding") {
    auto f = with_policy("least_outstanding");
    const auto r = repeat_beside_busy(f);
    REQUIRE(r[1].replica == r[0].replica);
    CHECK(r[2].replica != r[0].replica);  // the idle one
    CHECK(r[2].usage.cached_tokens == 0);
  }
}

TEST_CASE("a replica's prefix-cache evictions reach the metrics", "[actors][prefix][metrics]") {
  auto o = test::cluster_fixture::defaults(1);
  o.kv_page_bytes = page_bytes;
  o.default_kv_tokens = 512;  // 32 blocks: room for two 200-token prompts' blocks, not six
  test::cluster_fixture f(o);
  const auto counter = [&](const std::string& name) {
    std::string text;
    f.backend().metrics([&](std::string t) { text = std::move(t); });
    f.run();
    const std::string key = name + "{model=\"tiny\"} ";
    const auto at = text.find(key);
    return at == std::string::npos ? 0.0 : std::stod(text.substr(at + key.size()));
  };
  const auto evicted = [&] { return counter("exaserve_prefix_cache_evicted_blocks_total"); };
  std::vector<std::int32_t> first, fourth;
  for (std::int32_t p = 0; p < 6; ++p) {
    std::vector<std::int32_t> ids;
    for (std::int32_t i = 0; i < 200; ++i) ids.push_back(3 + (i * 37 + p * 11) % 250);
    if (p == 0) first = ids;
    if (p == 3) fourth = ids;
    auto s = f.generate(request("p" + std::to_string(p), ids));
    f.run();
    finished(s);
    if (p == 0) CHECK(evicted() == 0);  // nothing had to go yet
  }
  CHECK(evicted() >= 6 * 12 - 32);  // at least what did not fit of six prompts' full blocks
  // Six prompts that share nothing: no miss was on a block evicted before.
  CHECK(counter("exaserve_prefix_cache_evicted_miss_tokens_total") == 0);
  // The fourth again: evicted among the cache's last 32 evictions, so its
  // misses count (a cache twice as large would have held it).
  auto fourth_again = f.generate(request("fourth-again", fourth));
  f.run();
  const auto missed = 200 - finished(fourth_again).usage.cached_tokens;
  const auto cached = finished(fourth_again).usage.cached_tokens;
  CHECK(cached > 0);  // its first blocks were still there
  CHECK(cached < 192);
  // Every whole block it missed (12 whole blocks of 16 in 200 tokens) had
  // been evicted lately; the last 8 tokens are no whole block.
  CHECK(counter("exaserve_prefix_cache_evicted_miss_tokens_total") == 192 - cached);
  CHECK(counter("exaserve_prefix_cache_evicted_miss_tokens_total") <= missed);
  // The first prompt went first (least recently used): computed again.
  auto again = f.generate(request("again", first));
  f.run();
  CHECK(finished(again).usage.cached_tokens == 0);
}
