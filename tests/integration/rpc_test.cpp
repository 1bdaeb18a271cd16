// The Cap'n Proto front door with a real capnp client on loopback, against
// the fake backend.

#include <catch2/catch.hpp>

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <kj/debug.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "schemas/exaserve.capnp.h"
#include "test_server.hpp"

using namespace exa;
using namespace exa::test;
using namespace std::chrono_literals;

namespace {

/// A client connection with its own event loop on the test thread. wait()
/// runs the loop until the promise settles, failing after a generous guard.
struct rpc_fixture {
  explicit rpc_fixture(std::uint16_t port) {
    auto address = io.provider->getNetwork().parseAddress("127.0.0.1", port).wait(io.waitScope);
    stream = address->connect().wait(io.waitScope);
    client = kj::heap<capnp::TwoPartyClient>(*stream);
    service = client->bootstrap().castAs<rpc::Service>();
  }

  template <class T>
  T wait(kj::Promise<T> p) {
    auto guard = io.provider->getTimer().afterDelay(20 * kj::SECONDS).then([]() -> kj::Promise<T> {
      return KJ_EXCEPTION(FAILED, "test guard: no answer within 20 s");
    });
    return p.exclusiveJoin(kj::mv(guard)).wait(io.waitScope);
  }

  void disconnect() {
    service = nullptr;
    client = nullptr;
    stream = nullptr;
  }

  kj::AsyncIoContext io = kj::setupAsyncIo();
  kj::Own<kj::AsyncIoStream> stream;
  kj::Own<capnp::TwoPartyClient> client;
  rpc::Service::Client service = nullptr;
};

/// Records chunks; can announce the first one and can stall forever (a
/// client that does not keep up).
struct sink_state {
  std::vector<api::token_chunk> chunks;
  kj::Own<kj::PromiseFulfiller<void>> first;
  bool stall = false;
};

class test_sink final : public rpc::TokenSink::Server {
 public:
  explicit test_sink(std::shared_ptr<sink_state> state) : state_(std::move(state)) {}

 protected:
  kj::Promise<void> chunk(ChunkContext context) override {
    auto c = context.getParams().getChunk();
    api::token_chunk out;
    for (auto id : c.getTokens()) out.tokens.push_back(id);
    out.text = c.getText();
    out.first_index = c.getFirstIndex();
    state_->chunks.push_back(std::move(out));
    if (state_->first) {
      state_->first->fulfill();
      state_->first = nullptr;
    }
    if (state_->stall) return kj::NEVER_DONE;
    return kj::READY_NOW;
  }

 private:
  std::shared_ptr<sink_state> state_;
};

capnp::Request<rpc::Gateway::GenerateParams, rpc::Gateway::GenerateResults> generate_request(
    rpc::Gateway::Client& gateway, const std::string& model, const std::string& prompt, std::uint32_t max_tokens,
    std::shared_ptr<sink_state> sink, const std::string& tag = {}) {
  auto req = gateway.generateRequest();
  auto r = req.initRequest();
  r.setModel(model);
  r.getPrompt().setText(prompt);
  r.setMaxTokens(max_tokens);
  r.setClientRequestId(tag);
  req.setSink(kj::heap<test_sink>(std::move(sink)));
  return req;
}

std::string text_of(const std::vector<api::token_chunk>& chunks) {
  std::string t;
  for (const auto& c : chunks) t += c.text;
  return t;
}

}  // namespace

TEST_CASE("rpc generate streams chunks in order and returns usage", "[rpc]") {
  test_server s;
  s.backend->set_behavior("fake", {.cached_tokens = 6});  // prompt tokens from the prefix cache
  rpc_fixture c(s.rpc_port());
  auto gateway = c.service.gatewayRequest().send().getGateway();
  auto sink = std::make_shared<sink_state>();
  auto response = c.wait(generate_request(gateway, "fake", "hello world", 8, sink).send());
  auto result = response.getResult();
  CHECK(result.getFinishReason() == rpc::FinishReason::LENGTH);
  CHECK(result.getUsage().getPromptTokens() == 11);
  CHECK(result.getUsage().getCompletionTokens() == 8);
  CHECK(result.getUsage().getCachedTokens() == 6);
  CHECK_FALSE(result.hasError());
  CHECK(std::string(result.getRequestId()).rfind("req-", 0) == 0);
  CHECK(std::string(result.getReplica()) == "fake/0");

  CHECK(text_of(sink->chunks) == "dlrow ol");
  std::uint32_t next = 0;
  std::vector<api::token_id> tokens;
  for (const auto& chunk : sink->chunks) {
    CHECK(chunk.first_index == next);
    CHECK(chunk.tokens.size() == chunk.text.size());  // the fake: a byte per token
    next += static_cast<std::uint32_t>(chunk.tokens.size());
    tokens.insert(tokens.end(), chunk.tokens.begin(), chunk.tokens.end());
  }
  CHECK(tokens == std::vector<api::token_id>{'d', 'l', 'r', 'o', 'w', ' ', 'o', 'l'});
  CHECK(s.backend->requests().at(0).request_id == std::string(result.getRequestId()));
}

TEST_CASE("rpc generate: refusals and invalid requests come back as result errors", "[rpc]") {
  test_server s;
  rpc_fixture c(s.rpc_port());
  auto gateway = c.service.gatewayRequest().send().getGateway();

  auto refused = c.wait(generate_request(gateway, "nope", "x", 4, std::make_shared<sink_state>()).send());
  CHECK(refused.getResult().getFinishReason() == rpc::FinishReason::ERROR);
  REQUIRE(refused.getResult().hasError());
  CHECK(std::string(refused.getResult().getError().getCode()) == "not_found");
  CHECK(std::string(refused.getResult().getError().getMessage()) == "model 'nope' is not deployed");

  auto invalid = c.wait(generate_request(gateway, "fake", "x", 0, std::make_shared<sink_state>()).send());
  REQUIRE(invalid.getResult().hasError());
  CHECK(std::string(invalid.getResult().getError().getCode()) == "invalid_argument");
  CHECK(std::string(invalid.getResult().getError().getMessage()) == "max_tokens must be between 1 and 16384 (got 0)");
  CHECK(s.backend->requests().size() == 1);  // the invalid one never reached it
}

TEST_CASE("rpc Gateway.cancel stops the named request", "[rpc]") {
  test_server s;
  s.backend->set_behavior("hang", {.hang_after = 1});
  rpc_fixture c(s.rpc_port());
  auto gateway = c.service.gatewayRequest().send().getGateway();
  auto sink = std::make_shared<sink_state>();
  auto first = kj::newPromiseAndFulfiller<void>();
  sink->first = kj::mv(first.fulfiller);
  auto call = generate_request(gateway, "hang", "abc", 8, sink, "t1").send();
  c.wait(kj::mv(first.promise));

  // The tag is taken while the call runs.
  auto dup = generate_request(gateway, "hang", "abc", 8, std::make_shared<sink_state>(), "t1").send();
  auto dup_error = kj::runCatchingExceptions([&] { c.wait(kj::mv(dup)); });
  REQUIRE(dup_error != nullptr);
  CHECK(std::string(KJ_ASSERT_NONNULL(dup_error).getDescription().cStr()).find("'t1' is already used") !=
        std::string::npos);

  auto cancel = gateway.cancelRequest();
  cancel.setRequestId("t1");
  c.wait(cancel.send());
  auto response = c.wait(kj::mv(call));
  CHECK(response.getResult().getFinishReason() == rpc::FinishReason::CANCELLED);
  CHECK(response.getResult().getUsage().getCompletionTokens() == 1);
  const auto cancels = s.backend->cancels();
  REQUIRE(cancels.size() == 1);
  CHECK(cancels[0] == std::string(response.getResult().getRequestId()));
}

TEST_CASE("rpc: dropping the call or the connection cancels the backend request", "[rpc]") {
  test_server s;
  s.backend->set_behavior("hang", {.hang_after = 1});
  rpc_fixture c(s.rpc_port());
  auto gateway = c.service.gatewayRequest().send().getGateway();

  SECTION("the client cancels the call") {
    auto first = kj::newPromiseAndFulfiller<void>();
    auto sink = std::make_shared<sink_state>();
    sink->first = kj::mv(first.fulfiller);
    {
      auto call = generate_request(gateway, "hang", "abc", 8, sink).send();
      c.wait(kj::mv(first.promise));
    }  // dropped: capnp sends Finish
    // A later call on the same connection is answered after the Finish was
    // processed, so the cancel has happened by then.
    c.wait(c.service.adminRequest().send().getAdmin().modelsRequest().send());
    CHECK(s.backend->wait_for_cancel(s.backend->requests().at(0).request_id, 20s));
  }
  SECTION("the client disconnects") {
    auto first = kj::newPromiseAndFulfiller<void>();
    auto sink = std::make_shared<sink_state>();
    sink->first = kj::mv(first.fulfiller);
    auto call = generate_request(gateway, "hang", "abc", 8, sink).send();
    c.wait(kj::mv(first.promise));
    c.disconnect();
    CHECK(s.backend->wait_for_cancel(s.backend->requests().at(0).request_id, 20s));
  }
  CHECK(s.backend->wait_idle(20s));
}

TEST_CASE("rpc: a sink that stops accepting chunks gets its request cancelled with an error", "[rpc]") {
  frontdoor_config config = test_config();
  config.stream_buffer_chunks_max = 8;
  config.limits.max_tokens_max = 1 << 20;
  test_server s(config);
  rpc_fixture c(s.rpc_port());
  auto gateway = c.service.gatewayRequest().send().getGateway();
  auto sink = std::make_shared<sink_state>();
  sink->stall = true;  // never returns from chunk(): the flow-control window fills
  auto req = generate_request(gateway, "fake", "ab", 1 << 20, sink);
  req.getRequest().setIgnoreEos(true);
  auto response = c.wait(req.send());
  auto result = response.getResult();
  CHECK(result.getFinishReason() == rpc::FinishReason::ERROR);
  REQUIRE(result.hasError());
  CHECK(std::string(result.getError().getCode()) == "overloaded");
  CHECK(std::string(result.getError().getMessage()).find("client fell behind") != std::string::npos);
  CHECK(s.backend->wait_for_cancel(std::string(result.getRequestId()), 20s));
  CHECK(s.backend->wait_idle(20s));
}

TEST_CASE("rpc admin: status and models and deploy and scale and undeploy round-trip to the backend", "[rpc]") {
  test_server s;
  rpc_fixture c(s.rpc_port());
  auto admin = c.service.adminRequest().send().getAdmin();

  auto status = c.wait(admin.statusRequest().send());
  auto st = status.getStatus();
  REQUIRE(st.getNodes().size() == 1);
  CHECK(std::string(st.getNodes()[0].getState()) == "healthy");
  REQUIRE(st.getDevices().size() == 1);
  CHECK(st.getDevices()[0].getMemoryBytes() == (8ull << 30));
  REQUIRE(st.getReplicas().size() == 1);
  CHECK(std::string(st.getReplicas()[0].getId()) == "fake/0");
  CHECK(std::string(st.getReplicas()[0].getState()) == "ready");
  CHECK(st.getReplicas()[0].getKvCapacityTokens() == 4096);

  auto deploy = admin.deployRequest();
  auto d = deploy.initRequest();
  d.setName("big");
  d.setModelFile("m.gguf");
  d.setReplicas(2);
  d.setKvTokens(1000);
  d.setRouting("least_loaded");
  c.wait(deploy.send());
  CHECK(s.backend->admin_log().back() == "deploy name=big model_file=m.gguf replicas=2 kv_tokens=1000 routing=least_loaded");

  auto scale = admin.scaleRequest();
  scale.setName("big");
  scale.setReplicas(3);
  c.wait(scale.send());
  auto models = c.wait(admin.modelsRequest().send());
  REQUIRE(models.getModels().size() == 2);
  CHECK(std::string(models.getModels()[1].getName()) == "big");
  CHECK(models.getModels()[1].getReplicasDesired() == 3);
  CHECK(c.wait(admin.statusRequest().send()).getStatus().getReplicas().size() == 4);

  auto undeploy = admin.undeployRequest();
  undeploy.setName("big");
  c.wait(undeploy.send());
  auto again = admin.undeployRequest();
  again.setName("big");
  auto failure = kj::runCatchingExceptions([&] { c.wait(again.send()); });
  REQUIRE(failure != nullptr);
  auto& e = KJ_ASSERT_NONNULL(failure);
  CHECK(e.getType() == kj::Exception::Type::FAILED);
  CHECK(std::string(e.getDescription().cStr()).find("not_found: deployment 'big' does not exist") != std::string::npos);

  s.backend->set_status_error(error{errc::overloaded, "controller is busy"});
  auto busy = kj::runCatchingExceptions([&] { c.wait(admin.statusRequest().send()); });
  REQUIRE(busy != nullptr);
  CHECK(KJ_ASSERT_NONNULL(busy).getType() == kj::Exception::Type::OVERLOADED);
  s.backend->set_status_error(error{errc::unsupported, "no status in this mode"});
  auto unsupported = kj::runCatchingExceptions([&] { c.wait(admin.statusRequest().send()); });
  REQUIRE(unsupported != nullptr);
  CHECK(KJ_ASSERT_NONNULL(unsupported).getType() == kj::Exception::Type::UNIMPLEMENTED);
}

TEST_CASE("rpc connections beyond max_connections are closed and the others keep working", "[rpc]") {
  frontdoor_config config = test_config();
  config.max_connections = 1;
  test_server s(config);
  rpc_fixture first(s.rpc_port());
  first.wait(first.service.adminRequest().send().getAdmin().modelsRequest().send());  // accepted and served
  {
    // A second connection on the same thread (one event loop per thread).
    auto address = first.io.provider->getNetwork().parseAddress("127.0.0.1", s.rpc_port()).wait(first.io.waitScope);
    auto stream = address->connect().wait(first.io.waitScope);
    capnp::TwoPartyClient client(*stream);
    auto service = client.bootstrap().castAs<rpc::Service>();
    auto refused = kj::runCatchingExceptions(
        [&] { first.wait(service.adminRequest().send().getAdmin().modelsRequest().send()); });
    REQUIRE(refused != nullptr);
    CHECK(KJ_ASSERT_NONNULL(refused).getType() == kj::Exception::Type::DISCONNECTED);
  }
  auto models = first.wait(first.service.adminRequest().send().getAdmin().modelsRequest().send());
  CHECK(models.getModels().size() == 1);
}
