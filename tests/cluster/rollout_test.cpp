// Rollout decisions with synthetic series: steps parse and validate; a
// verdict waits for min_samples of each version, passes an equal version
// and names the regression with its numbers; a conversation stays on one
// version as the share grows; the phase machine bakes, advances, completes,
// rolls back at once, and refuses commands that do not fit its phase.

#include <catch2/catch.hpp>

#include "cluster/rollout.hpp"

using namespace exa;
using namespace exa::cluster;

namespace {
constexpr std::int64_t s_ns = 1'000'000'000;

void fill(version_window& w, std::size_t n, double ttft_ms, double tpot_ms, std::size_t failures = 0) {
  for (std::size_t i = 0; i < n; ++i) w.add_success(ttft_ms + static_cast<double>(i % 10), tpot_ms);
  for (std::size_t i = 0; i < failures; ++i) w.add_failure();
}
}  // namespace

TEST_CASE("rollout steps grow to 100 and bad ones are named", "[rollout]") {
  CHECK(*parse_steps("1,10,100") == std::vector<std::uint32_t>{1, 10, 100});
  CHECK(*parse_steps("100") == std::vector<std::uint32_t>{100});
  CHECK_THAT(parse_steps("1,x,100").error().message, Catch::Contains("'x'"));
  CHECK_THAT(parse_steps("10,5,100").error().message, Catch::Contains("must grow"));
  CHECK_THAT(parse_steps("1,10").error().message, Catch::Contains("last step must be 100"));
  CHECK_FALSE(parse_steps("0,100"));
  CHECK_FALSE(parse_steps("1,,100"));
  CHECK_FALSE(parse_steps(""));
  rollout_plan p;
  CHECK(validate(p));
  p.surge = 0;
  p.max_unavailable = 0;
  CHECK_FALSE(validate(p));
}

TEST_CASE("a verdict waits for samples, passes an equal version and names a regression", "[rollout]") {
  verdict_policy pol;
  pol.min_samples = 50;
  version_window old_v, new_v;
  fill(old_v, 200, 100, 20);
  fill(new_v, 49, 100, 20);
  CHECK(judge(old_v, new_v, pol).result == verdict::kind::insufficient);
  fill(new_v, 151, 102, 20.5);  // as fast, within noise
  const auto same = judge(old_v, new_v, pol);
  CHECK(same.result == verdict::kind::pass);
  CHECK_THAT(same.reason, Catch::Contains("ttft p99"));

  version_window slow;
  fill(slow, 200, 180, 20);  // p99 189 ms > 109 * 1.2 + 5
  const auto r = judge(old_v, slow, pol);
  CHECK(r.result == verdict::kind::regression);
  CHECK_THAT(r.reason, Catch::Contains("ttft p99 above its limit of 135.8 ms") && Catch::Contains("189.0 ms"));

  version_window slow_decode;
  fill(slow_decode, 200, 100, 40);
  CHECK_THAT(judge(old_v, slow_decode, pol).reason, Catch::Contains("tpot p99 above"));

  version_window erroring;
  fill(erroring, 180, 100, 20, 20);  // 10 % errors vs 0 %
  const auto e = judge(old_v, erroring, pol);
  CHECK(e.result == verdict::kind::regression);
  CHECK_THAT(e.reason, Catch::Contains("error rate 10.0%"));
}

TEST_CASE("the window keeps its newest samples only", "[rollout]") {
  version_window w(100);
  fill(w, 100, 1000, 1);  // old, slow
  fill(w, 100, 10, 1);    // replaced by fast ones
  CHECK(w.ttft_p99_ms() < 20);
  CHECK(w.samples() == 200);
}

TEST_CASE("pinned and sticky: a conversation stays on its version while the share grows", "[rollout]") {
  std::size_t on_new_at_10 = 0;
  for (int i = 0; i < 2000; ++i) {
    const std::string user = "user-" + std::to_string(i);
    const bool at10 = goes_to_new(10, user, 0.99);
    const bool at50 = goes_to_new(50, user, 0.99);
    on_new_at_10 += at10;
    if (at10) CHECK(at50);                        // never moved back to the old version
    CHECK(goes_to_new(10, user, 0.0) == at10);    // the key decides, not the draw
  }
  CHECK(on_new_at_10 > 120);  // about 10 % of 2000
  CHECK(on_new_at_10 < 280);
  CHECK(goes_to_new(10, "", 0.05));
  CHECK_FALSE(goes_to_new(10, "", 0.5));
  CHECK(goes_to_new(100, "anyone", 0.99));
  CHECK_FALSE(goes_to_new(0, "anyone", 0.0));
}

TEST_CASE("the machine bakes each step, advances on a pass and completes", "[rollout]") {
  rollout_plan plan;
  plan.bake_s = 60;
  verdict_policy pol;
  pol.min_samples = 20;
  rollout_machine m("1", "2", plan, pol, 0);
  CHECK(m.new_percent() == 1);
  CHECK_THAT(m.status_line(), Catch::StartsWith("in_progress step 1/3 split 1=99% 2=1% verdict none yet"));
  fill(m.old_window(), 50, 100, 20);
  fill(m.new_window(), 50, 100, 20);
  CHECK_FALSE(m.tick(30 * s_ns));  // passes, but not baked yet
  CHECK(m.last_verdict().result == verdict::kind::pass);
  CHECK(m.tick(60 * s_ns));
  CHECK(m.step() == 1);
  CHECK(m.new_percent() == 10);
  CHECK_FALSE(m.tick(200 * s_ns));  // a new window: no samples yet
  CHECK(m.last_verdict().result == verdict::kind::insufficient);
  fill(m.old_window(), 50, 100, 20);
  fill(m.new_window(), 50, 100, 20);
  CHECK(m.tick(200 * s_ns));
  CHECK(m.new_percent() == 100);
  fill(m.old_window(), 50, 100, 20);
  fill(m.new_window(), 50, 100, 20);
  CHECK(m.tick(300 * s_ns));
  CHECK(m.phase() == rollout_phase::complete);
  CHECK_THAT(m.status_line(), Catch::StartsWith("complete step 3/3 split 1=0% 2=100% verdict pass"));
  CHECK_FALSE(m.abort());
}

TEST_CASE("a regression rolls back at once, and commands fit the phase", "[rollout]") {
  rollout_plan plan;
  plan.bake_s = 600;
  verdict_policy pol;
  pol.min_samples = 20;
  rollout_machine m("1", "2", plan, pol, 0);
  REQUIRE(m.pause());
  CHECK(m.phase() == rollout_phase::paused);
  CHECK_FALSE(m.tick(1000 * s_ns));  // paused: no verdicts
  CHECK_FALSE(m.pause());
  REQUIRE(m.resume(1000 * s_ns));
  fill(m.old_window(), 50, 100, 20);
  fill(m.new_window(), 50, 400, 20);
  CHECK(m.tick(1001 * s_ns));  // no need to wait for the bake
  CHECK(m.phase() == rollout_phase::rolled_back);
  CHECK(m.new_percent() == 0);
  CHECK_THAT(m.status_line(), Catch::StartsWith("rolled_back step 1/3 split 1=100% 2=0% verdict regression ttft"));
  CHECK_THAT(m.resume(0).error().message, Catch::Contains("rolled_back"));
  CHECK_FALSE(m.promote());

  rollout_machine p("1", "2", plan, pol, 0);
  REQUIRE(p.promote());
  CHECK(p.new_percent() == 100);
  rollout_machine a("1", "2", plan, pol, 0);
  REQUIRE(a.abort());
  CHECK(a.new_percent() == 0);
  CHECK_THAT(a.status_line(), Catch::StartsWith("aborted"));
}

TEST_CASE("at 100 % only errors are judged, against the previous step's old error rate", "[rollout]") {
  rollout_plan plan;
  plan.steps = {50, 100};
  plan.bake_s = 0;
  verdict_policy pol;
  pol.min_samples = 20;
  rollout_machine m("1", "2", plan, pol, 0);
  fill(m.old_window(), 30, 100, 20, 3);  // 10 % errors before
  fill(m.new_window(), 30, 100, 20, 3);
  REQUIRE(m.tick(s_ns));
  REQUIRE(m.new_percent() == 100);
  CHECK(m.old_window().samples() == 33);  // kept as the baseline
  CHECK(m.new_window().samples() == 0);
  fill(m.new_window(), 19, 400, 20);
  CHECK_FALSE(m.tick(2 * s_ns));
  CHECK_THAT(m.last_verdict().reason, Catch::Contains("errors only"));
  fill(m.new_window(), 1, 400, 20);  // slower, but no control group to compare with: not judged
  CHECK(m.tick(2 * s_ns));
  CHECK(m.phase() == rollout_phase::complete);
  CHECK_THAT(m.last_verdict().reason, Catch::Contains("not compared"));

  rollout_machine failing("1", "2", plan, pol, 0);
  fill(failing.old_window(), 30, 100, 20);
  fill(failing.new_window(), 30, 100, 20);
  REQUIRE(failing.tick(s_ns));
  fill(failing.new_window(), 20, 100, 20, 5);  // 20 % errors against 0 % before
  CHECK(failing.tick(2 * s_ns));
  CHECK(failing.phase() == rollout_phase::rolled_back);
  CHECK_THAT(failing.last_verdict().reason, Catch::Contains("error rate 20.0% above 0.0%"));

  plan.steps = {100};  // one step: no baseline at all
  rollout_machine alone("1", "2", plan, pol, 0);
  fill(alone.new_window(), 20, 100, 20);
  CHECK(alone.tick(s_ns));
  CHECK(alone.phase() == rollout_phase::complete);
}

TEST_CASE("version names: plain is version 1, tiny@2 pins, labels are checked and counted up", "[rollout]") {
  CHECK(split_version("tiny@2").base == "tiny");
  CHECK(split_version("tiny@2").version == "2");
  CHECK(split_version("tiny").version.empty());
  CHECK(version_of("tiny") == "1");
  CHECK(version_of("tiny@v2") == "v2");
  CHECK(deployment_for("tiny", "1") == "tiny");
  CHECK(deployment_for("tiny", "3") == "tiny@3");
  CHECK(check_version("2025-01.b"));
  CHECK_THAT(check_version("a b").error().message, Catch::Contains("'a b'"));
  CHECK_FALSE(check_version(""));
  CHECK(next_version({"1"}) == "2");
  CHECK(next_version({"1", "7", "canary"}) == "8");
  CHECK(next_version({}) == "2");
}

TEST_CASE("step targets keep the old version serving below 100 %", "[rollout]") {
  rollout_plan surge;
  CHECK(step_targets(10, 1, surge) == version_counts{9, 1});
  CHECK(step_targets(10, 10, surge) == version_counts{9, 1});
  CHECK(step_targets(10, 25, surge) == version_counts{7, 3});
  CHECK(step_targets(10, 100, surge) == version_counts{0, 10});
  CHECK(step_targets(1, 10, surge) == version_counts{1, 1});  // surging: the old one stays
  rollout_plan in_place;
  in_place.surge = 0;
  CHECK(step_targets(1, 10, in_place) == version_counts{0, 1});
  CHECK(step_targets(2, 90, in_place) == version_counts{1, 1});  // the old one keeps serving its share
  CHECK(step_targets(2, 100, in_place) == version_counts{0, 2});
}

TEST_CASE("surge: new replicas start first and old ones stop once they are ready", "[rollout]") {
  rollout_plan plan;
  plan.surge = 1;
  plan.max_unavailable = 1;
  version_counts wanted{4, 0}, ready{4, 0};
  std::uint32_t most = 0, moves = 0;
  while (!(wanted == version_counts{0, 4})) {
    const auto next = next_counts(4, 100, plan, wanted, ready);
    REQUIRE(++moves < 32);
    if (next == wanted) {  // waiting for the new ones to be ready
      ready.new_replicas = wanted.new_replicas;
      continue;
    }
    CHECK(next.old_replicas + next.new_replicas <= 5);  // never past total + surge
    most = std::max(most, next.old_replicas + next.new_replicas);
    wanted = next;
    ready.old_replicas = std::min(ready.old_replicas, wanted.old_replicas);
  }
  CHECK(most == 5);
  // A batch larger than the surge never leaves fewer than `total` serving.
  plan.max_unavailable = 3;
  CHECK(next_counts(4, 100, plan, {4, 1}, {4, 1}) == version_counts{3, 1});
}

TEST_CASE("zero surge: an old replica stops first and never more than max_unavailable are down", "[rollout]") {
  rollout_plan plan;
  plan.surge = 0;
  plan.max_unavailable = 1;
  version_counts wanted{3, 0}, ready{3, 0};
  std::uint32_t moves = 0;
  while (!(wanted == version_counts{0, 3})) {
    const auto next = next_counts(3, 100, plan, wanted, ready);
    REQUIRE(++moves < 32);
    if (next == wanted) {
      ready.new_replicas = wanted.new_replicas;
      continue;
    }
    CHECK(next.old_replicas + next.new_replicas <= 3);  // no extra GPUs
    if (next.old_replicas < wanted.old_replicas) CHECK(ready.old_replicas + ready.new_replicas == 3);
    wanted = next;
    ready.old_replicas = std::min(ready.old_replicas, wanted.old_replicas);
  }
  // Nothing moves while a replacement is not ready.
  CHECK(next_counts(3, 100, plan, {2, 1}, {2, 0}) == version_counts{2, 1});
}
