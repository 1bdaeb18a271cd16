// A node's model cache across real processes: a node process that starts
// with the model in its cache directory says so when it joins (node_join
// carries the files across the connection), and the controller places the
// deployment there.

#include <catch2/catch.hpp>

#include <filesystem>

#include "process_cluster.hpp"

using namespace exa;
using namespace exa::test;
using Catch::Matchers::Contains;

TEST_CASE("a node process whose cache directory holds the model gets the replica from its first join",
          "[process][node_cache]") {
  process_cluster c("process-node-cache");
  const std::string model = c.dir() + "/m.gguf";
  auto gen = run_process({exaserve, "gen-model", "--preset", "tiny", "--out", model}, 60s);
  INFO(gen.err);
  REQUIRE(gen.exit_code == 0);
  // Node 2's cache holds a copy from an "earlier run"; node 1 has none.
  std::filesystem::create_directories(c.dir() + "/cache-1");
  std::filesystem::create_directories(c.dir() + "/cache-2");
  std::filesystem::copy_file(model, c.dir() + "/cache-2/m.gguf");
  c.write_config(fast_timings + "[deployment m]\nmodel = " + model + "\nreplicas = 1\n");
  c.start_controller({"--wait-nodes", "2"});
  c.start_node(1, {"--model-cache-dir", c.dir() + "/cache-1"});
  c.start_node(2, {"--model-cache-dir", c.dir() + "/cache-2"});
  c.start_gateway();
  const auto rows = c.wait_replicas([](const auto& r) { return all_ready(r, 1); }, 60s, "the replica ready");
  // Alike in every other way, node 1 would win (the lower id).
  CHECK(rows[0].node == 2);
  CHECK_THAT(c.controller().err(), Contains("event=node_cached_files node=2 files=1 bytes=" +
                                            std::to_string(std::filesystem::file_size(model))));
  CHECK_THAT(c.node(2).err(), Contains("event=node_joining node=2 replicas=0 cached_files=1"));
}
