#pragma once
// What the serving tests share: the generated tiny model and a front door on
// free loopback ports in front of an embedded cluster.

#include <catch2/catch.hpp>

#include <filesystem>
#include <memory>
#include <string>

#include "actors/embedded_cluster.hpp"
#include "frontdoor.hpp"
#include "model/model_gen.hpp"

namespace exa::test {

/// The `tiny` preset, generated once per test run into the test temp dir.
inline const std::string& tiny_model_path() {
  static const std::string path = [] {
    const std::string dir = std::string(EXA_TEST_TMPDIR) + "/serving";
    std::filesystem::create_directories(dir);
    const std::string p = dir + "/tiny.gguf";
    REQUIRE(model::generate_model(*model::preset_spec("tiny"), p));
    return p;
  }();
  return path;
}

/// HTTP and RPC doors on ports the OS picks, serving `cluster`.
inline std::unique_ptr<frontdoor> start_door(actors::embedded_cluster& cluster) {
  frontdoor_config fc;
  fc.http_port = 0;
  fc.rpc_port = 0;
  auto f = frontdoor::start(fc, cluster.backend());
  REQUIRE(f.has_value());
  return std::move(*f);
}

}  // namespace exa::test
