// Messages that cross processes survive CAF's binary serialization with every
// field: a field left out of an inspect() would arrive default-constructed on
// the other node, silently (logprobs lost, a model's facts blank).

#include <catch2/catch.hpp>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>

#include <vector>

#include "actors/messages.hpp"

using namespace exa;

namespace {

class config : public caf::actor_system_config {
 public:
  config() {
    set("scheduler.policy", caf::atom("testing"));
    set("logger.verbosity", caf::atom("quiet"));
    actors::register_message_types(*this);
  }
};

template <class T>
T round_trip(caf::actor_system& sys, T value) {
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  REQUIRE_FALSE(sink(value));
  T out;
  caf::binary_deserializer source{sys, buf};
  REQUIRE_FALSE(source(out));
  return out;
}

}  // namespace

TEST_CASE("token and submit messages keep their logprobs across processes", "[actors][messages][logprobs]") {
  config cfg;
  caf::actor_system sys{cfg};
  actors::token_msg t{9, {5, 6}, 3, {{-0.5f, {5, 7}, {-0.5f, -1.5f}}, {-2.0f, {}, {}}}};
  const auto t2 = round_trip(sys, t);
  CHECK(t2.request == 9);
  CHECK(t2.tokens == t.tokens);
  CHECK(t2.first_index == 3);
  REQUIRE(t2.logprobs.size() == 2);
  CHECK(t2.logprobs[0].logprob == -0.5f);
  CHECK(t2.logprobs[0].top_ids == std::vector<std::int32_t>{5, 7});
  CHECK(t2.logprobs[0].top_logprobs == std::vector<float>{-0.5f, -1.5f});
  CHECK(t2.logprobs[1].logprob == -2.0f);

  actors::submit_msg s;
  s.request = 4;
  s.logprobs = true;
  s.top_logprobs = 20;
  s.request_id = "req-4";
  const auto s2 = round_trip(sys, s);
  CHECK(s2.logprobs);
  CHECK(s2.top_logprobs == 20);
  CHECK(s2.request_id == "req-4");
}

TEST_CASE("model info keeps its file facts across processes", "[actors][messages]") {
  config cfg;
  caf::actor_system sys{cfg};
  api::model_info m;
  m.name = "qwen";
  m.version = "2";
  m.architecture = "qwen2";
  m.quantization = "Q4_K_M";
  m.tokenizer = "gpt2";
  // The gateways' latency figures reach `exaserve-cli top` through the
  // controller's model list, which crosses processes too.
  m.ttft_p50_ms = 12.5;
  m.ttft_p99_ms = 80;
  m.tpot_p50_ms = 3.25;
  m.tpot_p99_ms = 9;
  const auto m2 = round_trip(sys, m);
  CHECK(m2.ttft_p50_ms == 12.5);
  CHECK(m2.ttft_p99_ms == 80);
  CHECK(m2.tpot_p50_ms == 3.25);
  CHECK(m2.tpot_p99_ms == 9);
  CHECK(m2.name == "qwen");
  CHECK(m2.version == "2");
  CHECK(m2.architecture == "qwen2");
  CHECK(m2.quantization == "Q4_K_M");
  CHECK(m2.tokenizer == "gpt2");
}

TEST_CASE("model info keeps its draft model across processes", "[actors][messages][speculative]") {
  // `exaserve-cli status` and /v1/models on a gateway read the controller's
  // model list, which crosses processes.
  config cfg;
  caf::actor_system sys{cfg};
  api::model_info m;
  m.name = "spec";
  m.draft_model = "/models/draft.gguf";
  m.draft_tokens = 6;
  const auto m2 = round_trip(sys, m);
  CHECK(m2.draft_model == "/models/draft.gguf");
  CHECK(m2.draft_tokens == 6);
}

TEST_CASE("model info keeps its routing and prefix slack across processes", "[actors][messages][routing][prefix]") {
  config cfg;
  caf::actor_system sys{cfg};
  api::model_info m;
  m.name = "chat";
  m.routing = "prefix_aware";
  m.prefix_slack_tokens = 777;
  m.prefix_slack_ratio = 1.25;
  m.prefix_slack_s = 0.75;
  const auto m2 = round_trip(sys, m);
  CHECK(m2.routing == "prefix_aware");
  CHECK(m2.prefix_slack_tokens == 777);
  CHECK(m2.prefix_slack_ratio == 1.25);
  CHECK(m2.prefix_slack_s == 0.75);
}

TEST_CASE("a deploy request and its announce keep the prefix slack across processes",
          "[actors][messages][routing][prefix]") {
  config cfg;
  caf::actor_system sys{cfg};
  api::deploy_request d;
  d.name = "chat";
  d.routing = "prefix_aware";
  d.prefix_slack_tokens = 777;
  d.prefix_slack_ratio = 1.25;
  d.prefix_slack_s = 0.75;
  CHECK(round_trip(sys, d) == d);
  actors::deployment_announce a;
  a.name = "chat";
  a.routing = "prefix_aware";
  a.prefix_slack_tokens = 777;
  a.prefix_slack_ratio = 1.25;
  a.prefix_slack_s = 0.75;
  a.tenant = "acme";
  const auto a2 = round_trip(sys, a);
  CHECK(a2.prefix_slack_tokens == 777);
  CHECK(a2.prefix_slack_ratio == 1.25);
  CHECK(a2.prefix_slack_s == 0.75);
  CHECK(a2.tenant == "acme");
}

TEST_CASE("a deployment's announce and deploy request keep its chat template across processes",
          "[actors][messages][chat_template]") {
  config cfg;
  caf::actor_system sys{cfg};
  actors::deployment_announce a;
  a.name = "chat";
  a.model_file = "/m.gguf";
  a.tenant = "acme";
  a.autoscaled = true;
  a.chat_template = "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}";
  const auto a2 = round_trip(sys, a);
  CHECK(a2.name == "chat");
  CHECK(a2.tenant == "acme");
  CHECK(a2.autoscaled);
  CHECK(a2.chat_template == a.chat_template);

  api::deploy_request d;
  d.name = "chat";
  d.chat_template = a.chat_template;
  CHECK(round_trip(sys, d).chat_template == a.chat_template);
}

TEST_CASE("a deploy request and a replica spec keep their draft model across processes",
          "[actors][messages][speculative]") {
  config cfg;
  caf::actor_system sys{cfg};
  api::deploy_request d;
  d.name = "spec";
  d.chat_template = "{{ bos_token }}";
  d.draft_model = "/models/draft.gguf";
  d.draft_sha256 = std::string(64, 'c');
  d.draft_tokens = 5;
  CHECK(round_trip(sys, d) == d);

  actors::replica_spec r;
  r.id = 7;
  r.deployment = "spec";
  r.model_file = "/models/target.gguf";
  r.standby = true;
  r.draft_model = d.draft_model;
  r.draft_sha256 = d.draft_sha256;
  r.draft_tokens = 5;
  const auto r2 = round_trip(sys, r);
  CHECK(r2.id == 7);
  CHECK(r2.standby);
  CHECK(r2.draft_model == d.draft_model);
  CHECK(r2.draft_sha256 == d.draft_sha256);
  CHECK(r2.draft_tokens == 5);
}

TEST_CASE("a deploy request keeps its warm pool and autoscaling across processes", "[actors][messages]") {
  // A gateway process hands `exaserve-cli deploy` to a remote controller: a
  // field left out of inspect arrives as its default, silently.
  config cfg;
  caf::actor_system sys{cfg};
  api::deploy_request d;
  d.name = "auto";
  d.warm_pool_percent = 25;
  d.autoscale_min = 2;
  d.autoscale_max = 9;
  d.autoscale_metric = "ttft_p99_ms";
  d.autoscale_target = 250;
  d.idle_to_zero_s = 600;
  CHECK(round_trip(sys, d) == d);
}

TEST_CASE("a node's join keeps every field across processes, its cached model files included",
          "[actors][messages][node_cache]") {
  config cfg;
  caf::actor_system sys{cfg};
  actors::node_join j;
  j.node = 17;
  j.rack = 3;
  j.devices = 8;
  j.device_memory_bytes = 80ull << 30;
  j.address = "10.0.0.17:7100";
  j.region = "eu-west";
  j.device_kind = "cuda";
  actors::replica_spec spec;
  spec.id = 42;
  spec.deployment = "llama";
  spec.slot = 5;
  spec.epoch = 9;
  spec.model_file = "/models/llama.gguf";
  spec.devices = {2, 3};
  j.replicas.push_back({spec, caf::actor{}});
  const std::string sha(64, 'c');
  j.cached = {{"llama.gguf", 70ull << 30, ""}, {sha + ".gguf", 4096, sha}};
  const auto j2 = round_trip(sys, j);
  CHECK(j2.node == 17);
  CHECK(j2.rack == 3);
  CHECK(j2.devices == 8);
  CHECK(j2.device_memory_bytes == (80ull << 30));
  CHECK(j2.address == "10.0.0.17:7100");
  CHECK(j2.region == "eu-west");
  CHECK(j2.device_kind == "cuda");
  REQUIRE(j2.replicas.size() == 1);
  CHECK(j2.replicas[0].spec.id == 42);
  CHECK(j2.replicas[0].spec.deployment == "llama");
  CHECK(j2.replicas[0].spec.slot == 5);
  CHECK(j2.replicas[0].spec.epoch == 9);
  CHECK(j2.replicas[0].spec.model_file == "/models/llama.gguf");
  CHECK(j2.replicas[0].spec.devices == spec.devices);
  CHECK(j2.cached == j.cached);

  const auto c2 = round_trip(sys, actors::cached_files_msg{j.cached});
  CHECK(c2.files == j.cached);
}
