// `--device-kind cpu|cuda|auto` of serve and node: a bad value is refused
// naming the valid ones, and CUDA devices that are not there (none on a host
// without a GPU, too few on one with) are `unavailable` naming why, before
// anything starts. (`auto` serving on CPU devices: tests/distributed.)

#include <catch2/catch.hpp>

#include "gpu/cuda_memory_pool.hpp"
#include "run_command.hpp"

using namespace exa;
using Catch::Matchers::Contains;

namespace {

const std::string exaserve = std::string(EXA_BIN_DIR) + "/exaserve";

test::command_result run(std::vector<std::string> args) {
  args.insert(args.begin(), exaserve);
  auto r = test::run_command(args);
  INFO("stderr: " << r.err);
  REQUIRE_FALSE(r.signaled);
  return r;
}

// Why CUDA devices are unavailable here: the runtime's reason on a host
// without a usable GPU, else the count of the request that cannot be met.
std::string expected_reason(std::uint32_t needed) {
  auto n = gpu::cuda_device_count();
  if (!n) return n.error().message;
  return std::to_string(needed) + " CUDA devices needed, " + std::to_string(*n) + " present";
}

}  // namespace

TEST_CASE("serve and node refuse an unknown device kind, naming the valid ones", "[cli][device]") {
  for (const auto& argv : std::vector<std::vector<std::string>>{
           {"serve", "--device-kind", "gpu", "--no-auth", "--http-port", "0", "--rpc-port", "0"},
           {"node", "--device-kind", "gpu", "--join", "127.0.0.1:1", "--node-id", "0"}}) {
    const auto r = run(argv);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Contains("--device-kind") && Contains("cpu, cuda or auto") && Contains("'gpu'"));
  }
  auto help = run({"serve", "--help"});
  CHECK(help.exit_code == 0);
  CHECK_THAT(help.out, Contains("--device-kind"));
}

TEST_CASE("serve --device-kind cuda without the GPUs it needs exits non-zero naming the CUDA runtime's reason",
          "[cli][device]") {
  // 64 nodes x 64 devices: more GPUs than any host has, so this holds with
  // or without one (without: cudaGetDeviceCount's own reason).
  const auto r = run({"serve", "--device-kind", "cuda", "--nodes", "64", "--devices-per-node", "64", "--no-auth",
                      "--http-port", "0", "--rpc-port", "0"});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Contains("unavailable") && Contains(expected_reason(64 * 64)));
  CHECK_THAT(r.out, !Contains("ExaServe is serving"));
}

TEST_CASE("node --device-kind cuda without the GPUs fails before it tries to join", "[cli][device]") {
  // Port 1 has no controller: reaching it would fail differently (and later).
  const auto r = run({"node", "--device-kind", "cuda", "--devices", "64", "--join", "127.0.0.1:1", "--node-id", "0",
                      "--join-timeout-ms", "100"});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Contains("unavailable") && Contains(expected_reason(64)));
}

TEST_CASE("generate --device-kind cuda --tp N without N GPUs exits non-zero naming why", "[cli][device][tp]") {
  // --tp 64: more GPUs than any host has, so this holds with or without one.
  const std::vector<std::string> base = {"generate", "--prompt-ids", "1,72,105,33", "--max-tokens", "4", "--ids"};
  auto args = base;
  for (const char* a : {"--device-kind", "cuda", "--tp", "64"}) args.emplace_back(a);
  const auto r = run(args);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Contains("unavailable") && Contains(expected_reason(64)));
  CHECK(r.out.empty());
  args = base;
  for (const char* a : {"--device-kind", "gpu"}) args.emplace_back(a);
  const auto bad = run(args);
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Contains("--device-kind must be cpu or cuda, not 'gpu'"));
}
