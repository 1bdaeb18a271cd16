// rpc_loadgen's open loop (--rate) against a real `exaserve serve`: the
// arrivals are a seeded schedule (the same due times in every run with the
// same seed), their count follows the rate, and arrivals past --concurrency
// are counted as skipped, never queued. bench/fair_cluster.sh's numbers rest
// on this.

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <signal.h>

#include <algorithm>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "processes.hpp"
#include "run_process.hpp"

using namespace exa::test;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;

namespace {

const std::string loadgen_bin = std::string(EXA_BIN_DIR) + "/rpc_loadgen";

struct loadgen_run {
  nlohmann::json report;
  std::vector<double> due_s;  // each sampled call's due time, from the window's start, sorted
};

loadgen_run run_loadgen(const std::string& at, const std::string& samples, std::vector<std::string> extra) {
  std::vector<std::string> argv{loadgen_bin, "--connect", at, "--warmup-s", "0", "--json", "--samples", samples};
  argv.insert(argv.end(), extra.begin(), extra.end());
  const auto r = run_process(argv, 60s);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  loadgen_run out;
  out.report = nlohmann::json::parse(r.out);
  std::istringstream lines(read_file(samples));
  double due = 0, ttft = 0, e2e = 0;
  while (lines >> due >> ttft >> e2e) {
    CHECK(ttft >= 0);
    CHECK(e2e >= ttft);
    out.due_s.push_back(due);
  }
  std::sort(out.due_s.begin(), out.due_s.end());
  return out;
}

}  // namespace

TEST_CASE("rpc_loadgen's open loop: a seeded Poisson schedule at the rate, arrivals past --concurrency skipped",
          "[process][loadgen]") {
  const std::string dir = fresh_test_dir("process-loadgen");
  auto serve = std::make_unique<child_process>(
      std::vector<std::string>{exaserve_bin, "serve", "--http-port", "0", "--rpc-port", "0", "--no-auth"}, dir, "serve");
  const auto banner = serve->wait_for("Ctrl-C", 120s);
  const auto rpc = number_after(banner, "Cap'n Proto RPC:          127.0.0.1:");
  REQUIRE(rpc);
  const std::string at = "127.0.0.1:" + std::to_string(*rpc);

  // 40 calls/s for 2 s with room for all of them: about 80 arrivals, every
  // one served (Poisson: 80 ± 9; the bounds are over 4 standard deviations).
  const std::vector<std::string> open{"--rate", "40", "--duration-s", "2", "--concurrency", "64"};
  const auto with_seed = [&](const std::string& seed, const std::string& name) {
    std::vector<std::string> args = open;
    args.insert(args.end(), {"--seed", seed});
    return run_loadgen(at, dir + "/" + name, args);
  };
  const loadgen_run a = with_seed("7", "a.samples");
  CHECK(a.report["errors"] == 0);
  CHECK(a.report["skipped"] == 0);
  CHECK(a.report["rate"] == 40.0);
  const auto n = a.report["requests"].get<std::size_t>();
  CHECK(n == a.due_s.size());
  CHECK(n >= 44);
  CHECK(n <= 116);
  REQUIRE_FALSE(a.due_s.empty());
  CHECK(a.due_s.front() >= 0);
  CHECK(a.due_s.back() <= 2.0);  // written to the millisecond
  // The same seed, the same due times (written to the millisecond); another
  // seed, another schedule.
  const loadgen_run b = with_seed("7", "b.samples");
  REQUIRE(b.report["skipped"] == 0);  // the samples are the calls served
  CHECK(b.due_s == a.due_s);
  CHECK(with_seed("8", "c.samples").due_s != a.due_s);

  // One call in flight at most, 400 arrivals/s of 256-token calls: most
  // arrive while the one before is still running and are skipped, and every
  // arrival in the window is either served or skipped (400 ± 20 per second).
  const loadgen_run busy = run_loadgen(at, dir + "/busy.samples",
                                       {"--rate", "400", "--duration-s", "1", "--concurrency", "1", "--max-tokens",
                                        "256", "--ignore-eos", "--seed", "3"});
  CHECK(busy.report["errors"] == 0);
  const auto served = busy.report["requests"].get<std::uint64_t>();
  const auto skipped = busy.report["skipped"].get<std::uint64_t>();
  CHECK(served >= 1);
  CHECK(skipped > served);
  CHECK(served + skipped >= 320);
  CHECK(served + skipped <= 480);

  // A bad rate is refused by name, before anything is sent.
  const auto bad = run_process({loadgen_bin, "--connect", at, "--rate", "fast"}, 20s);
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Contains("--rate must be a number of calls per second"));

  serve->signal(SIGTERM);
  CHECK(serve->wait_exit(30s).has_value());
}
