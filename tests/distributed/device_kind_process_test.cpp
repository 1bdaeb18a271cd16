// `--device-kind auto` as processes: `serve` and a `node` take CUDA devices
// where there are enough GPUs and CPU devices otherwise (saying why), serve
// requests on them, and status shows the kind of every device.

#include <catch2/catch.hpp>
#include <signal.h>

#include <algorithm>
#include <sstream>
#include <thread>

#include "gpu/cuda_memory_pool.hpp"
#include "http_client.hpp"
#include "process_cluster.hpp"
#include "processes.hpp"
#include "run_process.hpp"

using namespace exa;
using namespace exa::test;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;

namespace {

// The KIND column of `exaserve-cli status`'s DEVICES table.
std::vector<std::string> device_kinds(const std::string& status) {
  std::vector<std::string> kinds;
  for (const std::string& line : status_table_rows(status, "DEVICES")) {
    std::istringstream row(line);
    std::string node, device, kind;
    row >> node >> device >> kind;
    kinds.push_back(kind);
  }
  return kinds;
}

// What `auto` picks for `needed` devices on this host, and why it falls back.
std::string auto_kind(std::uint32_t needed) {
  auto n = gpu::cuda_device_count();
  return n && static_cast<std::uint32_t>(*n) >= needed ? "cuda" : "cpu";
}

}  // namespace

TEST_CASE("serve --device-kind auto serves on the devices it found and status shows their kind",
          "[process][device]") {
  const std::string dir = fresh_test_dir("process-device-auto");
  child_process s({exaserve, "serve", "--device-kind", "auto", "--nodes", "1", "--devices-per-node", "2",
                   "--replicas", "1", "--http-port", "0", "--rpc-port", "0", "--no-auth"},
                  dir, "serve");
  const auto banner = s.wait_for("Ctrl-C", 120s);
  const auto http = number_after(banner, "http://127.0.0.1:");
  const auto rpc = number_after(banner, "Cap'n Proto RPC:          127.0.0.1:");
  REQUIRE(http);
  REQUIRE(rpc);
  const auto kind = auto_kind(2);
  if (kind == "cpu") CHECK_THAT(s.err(), Contains("event=device_kind_fallback") && Contains("requested=auto"));
  CHECK_THAT(s.err(), Contains("event=embedded_cluster_start") && Contains("device_kind=" + kind));

  auto resp = http_request(static_cast<std::uint16_t>(*http), "POST", "/v1/completions",
                           R"({"model": "tiny", "prompt": "Hello", "max_tokens": 6})");
  INFO(resp.body);
  CHECK(resp.status == 200);
  CHECK_THAT(resp.body, Contains("\"completion_tokens\":6"));

  auto status = run_process({cli, "--connect", "127.0.0.1:" + std::to_string(*rpc), "status"}, 20s);
  INFO(status.err);
  REQUIRE(status.exit_code == 0);
  CHECK(device_kinds(status.out) == std::vector<std::string>{kind, kind});
  s.signal(SIGTERM);
  CHECK(s.wait_exit(30s).has_value());
}

TEST_CASE("a node with --device-kind auto joins with its devices' kind, shown in status", "[process][device]") {
  process_cluster c("process-device-node");
  c.write_config(fast_timings + "[deployment tiny]\nreplicas = 1\n");
  c.start_controller();
  auto& node = c.start_node(1, {"--device-kind", "auto", "--devices", "2"});
  c.start_gateway();
  c.wait_replicas([](const auto& rows) { return all_ready(rows, 1); }, 60s, "the replica ready on the node");
  const auto kind = auto_kind(2);
  CHECK_THAT(node.err(), Contains("event=node_joined") && Contains("device_kind=" + kind));
  CHECK_THAT(c.controller().err(), Contains("event=node_added") && Contains("device_kind=" + kind));
  CHECK(device_kinds(c.status()) == std::vector<std::string>{kind, kind});
  auto resp = http_request(c.http_port(), "POST", "/v1/completions",
                           R"({"model": "tiny", "prompt": "Hello", "max_tokens": 4})");
  CHECK(resp.status == 200);
}

TEST_CASE("exaserve-cli deploy --tp 2 runs a replica on both devices of a node, shown in status",
          "[process][device][tp]") {
  const std::string dir = fresh_test_dir("process-tp");
  child_process s({exaserve, "serve", "--nodes", "1", "--devices-per-node", "2", "--replicas", "1", "--http-port",
                   "0", "--rpc-port", "0", "--no-auth"},
                  dir, "serve");
  const auto banner = s.wait_for("Ctrl-C", 120s);
  const auto http = number_after(banner, "http://127.0.0.1:");
  const auto rpc = number_after(banner, "Cap'n Proto RPC:          127.0.0.1:");
  REQUIRE(http);
  REQUIRE(rpc);
  const std::string at = "127.0.0.1:" + std::to_string(*rpc);
  auto bad = run_process({cli, "--connect", at, "deploy", "--name", "tp3", "--tp", "3"}, 20s);
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Contains("--tp must be 1, 2, 4 or 8"));
  auto ok = run_process({cli, "--connect", at, "deploy", "--name", "tp2", "--tp", "2", "--replicas", "1"}, 20s);
  INFO(ok.err);
  REQUIRE(ok.exit_code == 0);

  std::string status;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  for (;;) {
    auto r = run_process({cli, "--connect", at, "status"}, 20s);
    REQUIRE(r.exit_code == 0);
    status = r.out;
    const auto rows = parse_replicas(status);
    const bool ready = std::any_of(rows.begin(), rows.end(),
                                   [](const auto& row) { return row.deployment == "tp2" && row.state == "ready"; });
    if (ready || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(100ms);
  }
  INFO(status << s.err());
  CHECK_THAT(status, Contains(" 0/0,1 "));  // the tp2 replica's node and both its devices
  CHECK_THAT(s.err(), Contains("event=tensor_parallel_engine devices=0,1 tp=2"));
  auto resp = http_request(static_cast<std::uint16_t>(*http), "POST", "/v1/completions",
                           R"({"model": "tp2", "prompt": "Hello", "max_tokens": 5})");
  INFO(resp.body);
  CHECK(resp.status == 200);
  CHECK_THAT(resp.body, Contains("\"completion_tokens\":5"));
  s.signal(SIGTERM);
  CHECK(s.wait_exit(30s).has_value());
}
