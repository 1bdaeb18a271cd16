// `--device-kind auto` as processes: `serve` and a `node` take CUDA devices
// where there are enough GPUs and CPU devices otherwise (saying why), serve
// requests on them, and status shows the kind of every device.

#include <catch2/catch.hpp>
#include <signal.h>

#include <sstream>

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
  std::istringstream in(status);
  std::string line;
  bool in_table = false;
  while (std::getline(in, line)) {
    if (line.rfind("DEVICES", 0) == 0) {
      in_table = true;
      std::getline(in, line);  // the header row
      continue;
    }
    if (!in_table) continue;
    if (line.find_first_not_of(' ') == std::string::npos) break;
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
