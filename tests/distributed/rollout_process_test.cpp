// Rollouts through the real front door: a controller, two node processes
// and a gateway on loopback; steady HTTP traffic from several clients while
// exaserve-cli rolls out a new version. One as fast as the old version is
// promoted to 100 %; one clearly slower (a model ~30x heavier per token) is
// rolled back. Neither loses or fails a single request.

#include <catch2/catch.hpp>

#include <atomic>
#include <mutex>
#include <thread>

#include "http_client.hpp"
#include "process_cluster.hpp"

using namespace exa;
using namespace exa::test;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

// Judged quickly (a tick every 100 ms, 100 requests of each version), with
// slack enough for the noise of a loaded 2-core machine.
const std::string rollout_timings =
    "rollout_tick_ms = 100\n"
    "rollout_min_samples = 100\n"
    "rollout_latency_slack_ms = 10\n"
    "rollout_drop_grace_ms = 1000\n";

std::string model_like_default(const std::string& dir) {
  const std::string path = dir + "/tiny-v2.gguf";
  auto r = run_process({exaserve, "gen-model", "--preset", "tiny", "--seed", "2", "--out", path}, 60s);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  return path;
}

const std::string prompt = [] {
  std::string p;
  for (int i = 0; i < 1; ++i) p += "The quick brown fox jumps over the lazy dog. ";
  return p;
}();

// Clients sending completions in a loop (each its own conversation) until stopped.
class load {
 public:
  load(std::uint16_t port, unsigned clients) {
    for (unsigned i = 0; i < clients; ++i)
      threads_.emplace_back([this, port, i] {
        while (!stop_) {
          // A prompt of some length: prefill is where a heavier model shows most.
          const auto resp = http_request(port, "POST", "/v1/completions",
                                         R"({"model": "tiny", "prompt": ")" + prompt + R"(", "max_tokens": 4, "user": "client-)" +
                                             std::to_string(i) + "\"}");
          std::lock_guard lock(mu_);
          ++sent_;
          if (resp.status != 200) failures_.push_back(std::to_string(resp.status) + " " + resp.body);
        }
      });
  }
  ~load() { finish(); }
  void finish() {
    stop_ = true;
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }
  std::size_t sent() {
    std::lock_guard lock(mu_);
    return sent_;
  }
  std::vector<std::string> failures() {
    std::lock_guard lock(mu_);
    return failures_;
  }

 private:
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::size_t sent_ = 0;
  std::vector<std::string> failures_;
  std::vector<std::thread> threads_;
};

// Polls `rollout status` until the phase is final (bounded); the last line.
std::string wait_final(process_cluster& c, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string line;
  for (;;) {
    auto r = c.cli_run({"rollout", "status", "tiny"});
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    line = r.out;
    for (const char* p : {"complete", "rolled_back", "aborted"})
      if (line.rfind(p, 0) == 0) return line;
    if (std::chrono::steady_clock::now() > deadline) {
      INFO("last status: " << line << "\ncontroller log:\n" << c.controller().err());
      FAIL("the rollout did not finish in time");
    }
    std::this_thread::sleep_for(200ms);
  }
}

// Two nodes of two devices each: a new version's replica gets a device of
// its own rather than queueing behind an old one's steps.
void start_cluster(process_cluster& c) {
  c.write_config(fast_timings + rollout_timings + "[deployment tiny]\nreplicas = 2\n");
  c.start_controller({"--wait-nodes", "2"});
  c.start_node(1, {"--devices", "2"});
  c.start_node(2, {"--devices", "2"});
  c.start_gateway();
  c.wait_replicas([](const auto& r) { return all_ready(r, 2); }, 60s, "every replica ready on the new cluster");
}

bool all_of_deployment(const std::vector<replica_row>& rows, std::size_t n, const std::string& deployment) {
  if (!all_ready(rows, n)) return false;
  for (const auto& r : rows)
    if (r.deployment != deployment) return false;
  return true;
}

}  // namespace

TEST_CASE("a rollout of a version as fast as the old one is promoted, losing no request", "[process][rollout]") {
  process_cluster c("process-rollout-promote");
  start_cluster(c);
  const std::string v2 = model_like_default(c.dir());
  load clients(c.http_port(), 3);
  std::this_thread::sleep_for(300ms);
  auto r = c.cli_run({"rollout", "tiny", "--model-file", v2, "--steps", "50,100", "--bake-s", "2"});
  INFO(r.err << "\ncontroller log:\n" << c.controller().err());
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, StartsWith("in_progress step 1/2"));
  const std::string line = wait_final(c, 90s);
  CHECK_THAT(line, StartsWith("complete step 2/2 split 1=0% 2=100% verdict pass"));
  c.wait_replicas([](const auto& rows) { return all_of_deployment(rows, 2, "tiny@2"); }, 30s,
                  "two replicas of version 2, none of version 1");
  clients.finish();
  INFO("gateway log:\n" << c.gateway().err());
  CHECK(clients.sent() > 200);
  CHECK(clients.failures().empty());
  for (const auto& f : clients.failures()) UNSCOPED_INFO(f);

  // The plain name serves version 2; version 1 no longer exists.
  auto models = c.cli_run({"models"});
  CHECK_THAT(models.out, Contains("tiny-v2.gguf"));
  const auto gone = http_request(c.http_port(), "POST", "/v1/completions",
                                 R"({"model": "tiny@1", "prompt": "Hello", "max_tokens": 2})");
  CHECK(gone.status == 404);
  const auto pinned = http_request(c.http_port(), "POST", "/v1/completions",
                                   R"({"model": "tiny@2", "prompt": "Hello", "max_tokens": 2})");
  CHECK(pinned.status == 200);
  CHECK_THAT(c.controller().err(), Contains("event=rollout_finished deployment=tiny phase=complete serving=tiny@2"));
  CHECK_THAT(c.status(), Contains("ROLLOUTS (1)\ntiny  complete step 2/2"));
}

TEST_CASE("a rollout of a clearly slower version is rolled back, losing no request", "[process][rollout]") {
  process_cluster c("process-rollout-rollback");
  start_cluster(c);
  const std::string slow = slow_model(c.dir());
  load clients(c.http_port(), 3);
  std::this_thread::sleep_for(300ms);
  // Fewer samples suffice for a version this slow (and it serves few requests).
  auto r = c.cli_run({"rollout", "tiny", "--model-file", slow, "--steps", "50,100", "--bake-s", "600", "--min-samples", "30"});
  INFO(r.err << "\ncontroller log:\n" << c.controller().err());
  REQUIRE(r.exit_code == 0);
  const std::string line = wait_final(c, 90s);
  CHECK_THAT(line, StartsWith("rolled_back step 1/2 split 1=100% 2=0% verdict regression"));
  CHECK_THAT(line, Contains("p99 above its limit"));
  c.wait_replicas([](const auto& rows) { return all_of_deployment(rows, 2, "tiny"); }, 30s,
                  "two replicas of version 1 again, none of the slow one");
  clients.finish();
  INFO("gateway log:\n" << c.gateway().err());
  CHECK(clients.sent() > 100);
  CHECK(clients.failures().empty());
  for (const auto& f : clients.failures()) UNSCOPED_INFO(f);
  auto models = c.cli_run({"models"});
  CHECK_THAT(models.out, !Contains("slow.gguf"));
  CHECK_THAT(c.controller().err(), Contains("event=rollout_finished deployment=tiny phase=rolled_back serving=tiny removed=tiny@2"));
}
