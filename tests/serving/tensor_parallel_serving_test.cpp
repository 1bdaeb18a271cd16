// A tensor-parallel deployment in the real embedded cluster (actors and
// device executors on real threads): each replica runs on both devices of
// its node and serves HTTP completions, the same text from run to run and
// under concurrency.

#include <catch2/catch.hpp>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <future>
#include <thread>

#include "actors/embedded_cluster.hpp"
#include "frontdoor.hpp"
#include "http_client.hpp"
#include "model/model_gen.hpp"
#include "serving_fixture.hpp"

using namespace exa;
using json = nlohmann::json;

namespace {

struct tp_server {
  std::unique_ptr<actors::embedded_cluster> cluster;
  std::unique_ptr<frontdoor> door;

  tp_server() {
    actors::cluster_options o;
    o.nodes = 1;
    o.devices_per_node = 2;
    o.device_memory_bytes = 64ull << 20;
    o.default_model_file = test::tiny_model_path();
    o.scheduler_threads = 2;
    api::deploy_request d;
    d.name = "tiny";
    d.replicas = 1;
    d.tensor_parallel = 2;
    o.deployments.push_back(d);
    auto c = actors::embedded_cluster::start(o);
    REQUIRE(c.has_value());
    cluster = std::move(*c);
    door = test::start_door(*cluster);
  }
  ~tp_server() {
    door->stop();
    cluster->stop();
  }

  // No Catch macro here: client threads call it (Catch2 v2's assertions and
  // INFO are not thread-safe; from threads they corrupted its message stack,
  // a "double free or corruption" about 1 run in 60).
  test::http_response request(const std::string& prompt, std::uint32_t max_tokens) {
    const auto body = json{{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", max_tokens}}.dump();
    return test::http_request(door->http_port(), "POST", "/v1/completions", body);
  }

  std::string complete(const std::string& prompt, std::uint32_t max_tokens) {
    return text_of(request(prompt, max_tokens));
  }

  static std::string text_of(const test::http_response& r) {
    INFO(r.body);
    REQUIRE(r.status == 200);
    const auto j = json::parse(r.body);
    CHECK(j["usage"]["completion_tokens"].get<int>() > 0);
    return j["choices"][0]["text"].get<std::string>();
  }

  api::cluster_status status() {
    std::promise<expected<api::cluster_status>> p;
    auto f = p.get_future();
    cluster->backend()->status([&](expected<api::cluster_status> s) { p.set_value(std::move(s)); });
    REQUIRE(f.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
    auto s = f.get();
    REQUIRE(s.has_value());
    return *s;
  }
};

}  // namespace

TEST_CASE("a tensor_parallel 2 deployment serves on both devices, the same text run to run", "[serving][tp]") {
  std::vector<std::string> first;
  for (int run = 0; run < 2; ++run) {
    tp_server s;
    std::vector<std::string> texts;
    for (int i = 0; i < 3; ++i) texts.push_back(s.complete("tensor parallel " + std::to_string(i), 32));
    // Concurrent requests batch together on the group and keep their text.
    std::vector<test::http_response> responses(3);
    std::vector<std::string> errors(3);
    std::vector<std::thread> clients;
    for (int i = 0; i < 3; ++i)
      clients.emplace_back([&, i] {
        try {  // a failure must reach the test, not terminate the process
          responses[i] = s.request("tensor parallel " + std::to_string(i), 32);
        } catch (const std::exception& e) {
          errors[i] = e.what();
        }
      });
    for (auto& t : clients) t.join();
    CHECK(errors == std::vector<std::string>(3));
    std::vector<std::string> concurrent;
    for (const auto& r : responses) concurrent.push_back(tp_server::text_of(r));
    CHECK(concurrent == texts);
    const auto st = s.status();
    REQUIRE(st.replicas.size() == 1);
    CHECK(st.replicas[0].devices == std::vector<std::uint32_t>{0, 1});
    if (run == 0) first = texts;
    else CHECK(texts == first);
  }
}
