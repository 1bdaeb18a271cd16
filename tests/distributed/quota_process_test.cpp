// Tenant limits shared across gateway processes: a controller, one node and
// two gateways with the same keys file; one client per gateway floods as
// fast as it is answered, and between them the gateways admit the tenant's
// rate, not twice it. Every wait is bounded; every process is killed by its
// pid when the test ends.

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "http_client.hpp"
#include "process_cluster.hpp"
#include "processes.hpp"
#include "run_process.hpp"

using namespace exa;
using namespace exa::test;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;

namespace {

std::string new_key(const std::string& keys, const std::string& tenant, bool admin) {
  std::vector<std::string> argv{exaserve, "keys", "add", "--file", keys, "--tenant", tenant};
  if (admin) argv.push_back("--admin");
  const auto r = run_process(argv, 20s);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  return r.out.substr(0, r.out.find('\n'));
}

struct flood_counts {
  std::atomic<int> ok{0}, limited{0}, other{0};
  std::atomic<bool> named_share{false};
};

// Sends requests to `port` one after another, about 150 a second, until `until`.
void flood(std::uint16_t port, const std::string& auth, std::chrono::steady_clock::time_point until,
           flood_counts& n) {
  const std::string body = R"({"model": "tiny", "prompt": "Hi", "max_tokens": 1})";
  while (std::chrono::steady_clock::now() < until) {
    try {
      const auto r = http_request(port, "POST", "/v1/completions", body, auth);
      if (r.status == 200) {
        ++n.ok;
      } else if (r.status == 429 && !r.header("retry-after").empty()) {
        ++n.limited;
        if (r.body.find("shared by the gateways") != std::string::npos) n.named_share = true;
      } else {
        ++n.other;
      }
    } catch (const std::exception&) {
      ++n.other;  // counted, not thrown: this runs on its own thread
    }
    std::this_thread::sleep_for(5ms);  // pacing: still 50 times the limit, without pegging the CPUs
  }
}

}  // namespace

TEST_CASE("two gateway processes admit a flooding tenant at its limit between them", "[process][auth][quota]") {
  process_cluster c("process-quota");
  const std::string keys = c.dir() + "/keys";
  const std::string key = new_key(keys, "acme", false);
  c.use_api_key(new_key(keys, "ops", true));
  const auto limit = run_process({exaserve, "keys", "limit", "--file", keys, "--tenant", "acme", "--requests-per-s", "4"}, 20s);
  REQUIRE(limit.exit_code == 0);
  c.write_config(fast_timings + "[deployment tiny]\nreplicas = 1\n");
  c.start_controller({"--wait-nodes", "1"});
  c.start_node(1);
  c.start_gateway(0, {"--keys-file", keys});
  c.start_gateway(1, {"--keys-file", keys});
  c.wait_replicas([](const auto& r) { return all_ready(r, 1); }, 60s, "1 ready replica");
  const std::string auth = "Authorization: Bearer " + key + "\r\n";
  for (unsigned g : {0u, 1u})
    REQUIRE(http_request(c.http_port(g), "POST", "/v1/completions", R"({"model": "tiny", "prompt": "Hi", "max_tokens": 1})", auth)
                .status == 200);

  constexpr int seconds = 8;
  flood_counts n;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  std::thread a(flood, c.http_port(0), auth, until, std::ref(n));
  std::thread b(flood, c.http_port(1), auth, until, std::ref(n));
  a.join();
  b.join();
  INFO("admitted " << n.ok << ", limited " << n.limited << ", other " << n.other << " in " << seconds
                   << " s against 4 a second shared by two gateways");
  CHECK(n.other == 0);
  CHECK(n.limited > n.ok);  // the clients asked for far more than the limit
  // Each gateway alone would admit 4 a second and a burst of 4, 72 in all;
  // shared, 32 and a burst of 2 each (measured: 39, with the report period
  // at the start in which the first gateway to report holds more than half).
  CHECK(n.ok <= 4 * seconds * 1.3 + 4);
  CHECK(n.ok >= 4 * seconds * 0.7);
  CHECK(n.named_share);
  CHECK_THAT(c.gateway(0).err(), Contains("event=tenant_limited tenant=acme limit=requests_per_s"));
  // The fair queues' counters are shared across the processes too (fair_share_board.hpp).
  CHECK_THAT(c.gateway(1).err(), Contains("event=fair_share_gateways gateways=2"));
  CHECK_THAT(c.gateway(0).err() + c.gateway(1).err(), !Contains("event=fair_share_fallback"));
}
