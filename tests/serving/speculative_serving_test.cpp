// A deployment with a draft model (`[deployment NAME] draft_model = FILE`,
// `exaserve-cli deploy --draft-model`) serves through speculative decoding:
// the serve config parses it (bad values fail naming the line), and through
// the real embedded cluster and HTTP door a deployment with a draft derived
// from its model answers greedy completions with exactly the text of the same
// deployment without one, while /metrics counts the draft's proposals. A
// draft with another vocabulary is refused at deploy, naming both files.

#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <future>
#include <iterator>
#include <map>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/embedded_cluster.hpp"
#include "frontdoor.hpp"
#include "http_client.hpp"
#include "run_process.hpp"
#include "model/draft_model.hpp"
#include "model/model_gen.hpp"
#include "serve_config.hpp"
#include "serving_fixture.hpp"

using namespace exa;
using json = nlohmann::json;
using Catch::Matchers::Contains;

namespace {

std::string dir() {
  const std::string d = std::string(EXA_TEST_TMPDIR) + "/speculative_serving";
  std::filesystem::create_directories(d);
  return d;
}

// A target whose deep blocks mostly refine (model_gen.hpp), so that its
// one-block draft agrees with it often, as with trained models.
const std::string& target_path() {
  static const std::string path = [] {
    auto s = *model::preset_spec("tiny");
    s.name = "spec-target";
    s.n_layers = 4;
    s.deep_block_scale = 0.1f;
    s.deep_block_from = 1;
    const std::string p = dir() + "/target.gguf";
    REQUIRE(model::generate_model(s, p));
    return p;
  }();
  return path;
}

const std::string& draft_path() {
  static const std::string path = [] {
    const std::string p = dir() + "/draft-L1.gguf";
    auto ok = model::derive_draft(target_path(), 1, p);
    if (!ok) FAIL(to_string(ok.error()));
    return p;
  }();
  return path;
}

// The same kind of model with a vocabulary of another size: cannot draft.
const std::string& other_vocab_path() {
  static const std::string path = [] {
    auto s = *model::preset_spec("tiny");
    s.name = "other-vocab";
    s.vocab_size = 300;
    const std::string p = dir() + "/other-vocab.gguf";
    REQUIRE(model::generate_model(s, p));
    return p;
  }();
  return path;
}

double metric_value(const std::string& text, const std::string& series) {
  const auto at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

expected<void> deploy(actors::embedded_cluster& c, const api::deploy_request& d) {
  auto done = std::make_shared<std::promise<expected<void>>>();
  auto f = done->get_future();
  c.backend()->deploy(d, [done](expected<void> r) { done->set_value(std::move(r)); });
  REQUIRE(f.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
  return f.get();
}

}  // namespace

TEST_CASE("serve config: a deployment's draft_model and draft_tokens", "[serving][speculative][config]") {
  app::serve_config c = app::default_serve_config();
  REQUIRE(app::apply_config_text("[deployment a]\ndraft_model = /models/d.gguf\ndraft_tokens = 6\n"
                                 "draft_sha256 = " + std::string(64, 'a') + "\n[deployment b]\nreplicas = 1\n",
                                 c));
  REQUIRE(c.cluster.deployments.size() == 2);
  CHECK(c.cluster.deployments[0].draft_model == "/models/d.gguf");
  CHECK(c.cluster.deployments[0].draft_tokens == 6);
  CHECK(c.cluster.deployments[0].draft_sha256 == std::string(64, 'a'));
  CHECK(c.cluster.deployments[1].draft_model.empty());
  CHECK(c.cluster.deployments[1].draft_tokens == 0);

  auto r = app::apply_config_text("[deployment a]\ndraft_model = /d.gguf\ndraft_tokens = 9\n", c);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Contains("line 3: draft_tokens must be in [1, 8], got 9"));
  r = app::apply_config_text("[deployment a]\ndraft_model = /d.gguf\ndraft_tokens = 0\n", c);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Contains("line 3: draft_tokens must be in [1, 8]"));
  r = app::apply_config_text("[deployment a]\ndraft_model =\n", c);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Contains("line 2: draft_model needs a file"));
  r = app::apply_config_text("[deployment a]\nreplicas = 1\ndraft_tokens = 2\n", c);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::invalid_argument);
  CHECK_THAT(r.error().message, Contains("deployment 'a'") && Contains("need draft_model"));
}

TEST_CASE("a deployment with a draft serves the same greedy text as without one, and counts proposals",
          "[serving][speculative]") {
  actors::cluster_options o;
  o.nodes = 1;
  o.devices_per_node = 2;
  o.device_memory_bytes = 32ull << 20;  // room for the tiny replicas, not for the big draft below
  o.default_model_file = target_path();
  o.scheduler_threads = 2;
  api::deploy_request plain;
  plain.name = "plain";
  plain.replicas = 1;
  plain.warm_pool_percent = 0;
  api::deploy_request spec = plain;
  spec.name = "spec";
  spec.draft_model = draft_path();
  spec.draft_tokens = 4;
  o.deployments = {plain, spec};
  auto c = actors::embedded_cluster::start(o);
  REQUIRE(c.has_value());
  auto cluster = std::move(*c);
  auto door = test::start_door(*cluster);
  const auto port = door->http_port();

  auto complete = [&](const std::string& model, const std::string& prompt) {
    const auto r = test::http_request(port, "POST", "/v1/completions",
                                      json{{"model", model}, {"prompt", prompt}, {"max_tokens", 48}, {"temperature", 0}}.dump());
    INFO(r.body);
    REQUIRE(r.status == 200);
    const auto j = json::parse(r.body);
    return std::pair{j["choices"][0]["text"].get<std::string>(), j["usage"]["completion_tokens"].get<std::uint32_t>()};
  };
  for (const std::string prompt : {"Hello, ExaServe", "speculative decoding keeps the target's text", "abc"}) {
    INFO(prompt);
    const auto want = complete("plain", prompt);
    const auto got = complete("spec", prompt);
    CHECK(want.second > 0);
    CHECK(got == want);
  }

  // The draft proposed (and the model verified) tokens for "spec" only.
  const auto m = test::http_request(port, "GET", "/metrics");
  REQUIRE(m.status == 200);
  INFO(m.body);
  const double proposed = metric_value(m.body, "exaserve_draft_proposed_tokens_total{model=\"spec\"}");
  const double accepted = metric_value(m.body, "exaserve_draft_accepted_tokens_total{model=\"spec\"}");
  CHECK(proposed > 0);
  CHECK(accepted >= 0);
  CHECK(accepted <= proposed);
  CHECK(metric_value(m.body, "exaserve_draft_proposed_tokens_total{model=\"plain\"}") <= 0);

  // /v1/models names each deployment's draft (null without one), and
  // `exaserve-cli status` shows it in the REPLICAS and DEPLOYMENTS tables.
  const auto models = test::http_request(port, "GET", "/v1/models");
  INFO(models.body);
  REQUIRE(models.status == 200);
  std::map<std::string, json> listed;
  const json model_list = json::parse(models.body);
  for (const auto& d : model_list["data"]) listed[d["id"].get<std::string>()] = d;
  REQUIRE(listed.count("spec"));
  REQUIRE(listed.count("plain"));
  CHECK(listed["spec"]["draft_model"] == draft_path());
  CHECK(listed["spec"]["draft_tokens"] == 4);
  CHECK(listed["spec"]["object"] == "model");  // still an OpenAI model object
  CHECK(listed["plain"]["draft_model"].is_null());
  CHECK(listed["plain"]["draft_tokens"].is_null());
  const std::string connect = "127.0.0.1:" + std::to_string(door->rpc_port());
  const auto st = test::run_process({std::string(EXA_BIN_DIR) + "/exaserve-cli", "--connect", connect, "status"},
                                    std::chrono::seconds(60));
  INFO(st.out << st.err);
  REQUIRE(st.exit_code == 0);
  const std::string cell = std::filesystem::path(draft_path()).filename().string() + ",k=4";
  int spec_rows = 0, plain_rows = 0;
  bool in_replicas = false;
  std::istringstream lines(st.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("REPLICAS", 0) == 0) {
      in_replicas = true;
      std::getline(lines, line);
      CHECK_THAT(line, Contains("KV USE") && Contains("DRAFT"));
      continue;
    }
    if (!in_replicas) continue;
    if (line.find_first_not_of(' ') == std::string::npos) break;
    std::istringstream row(line);
    std::vector<std::string> cells{std::istream_iterator<std::string>(row), std::istream_iterator<std::string>()};
    REQUIRE(cells.size() == 13);
    // PREFILL/S and DECODE/S: the speeds the replica reported with its load,
    // whole tokens a second. Both have prefilled (warm-up, prompts); the
    // plain one has run decode-only steps too (the spec one's verify steps
    // carry several tokens each, counted as it measures them).
    const auto speed = [](const std::string& c) { return c == "-" ? 0.0 : std::stod(c); };
    CHECK(cells[10].find_first_not_of("0123456789") == std::string::npos);
    CHECK(speed(cells[10]) > 0);
    CHECK((cells[11] == "-" || cells[11].find_first_not_of("0123456789") == std::string::npos));
    if (cells[1] == "plain") CHECK(speed(cells[11]) > 0);
    if (cells[1] == "spec") {
      ++spec_rows;
      CHECK(cells.back() == cell);
    } else if (cells[1] == "plain") {
      ++plain_rows;
      CHECK(cells.back() == "-");
    }
  }
  CHECK(spec_rows == 1);
  CHECK(plain_rows == 1);
  CHECK_THAT(st.out, Contains("DEPLOYMENTS") && Contains(cell));

  // A draft with another vocabulary is refused at deploy, naming both files.
  api::deploy_request bad = spec;
  bad.name = "bad";
  bad.draft_model = other_vocab_path();
  auto r = deploy(*cluster, bad);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::invalid_argument);
  CHECK_THAT(r.error().message, Contains("deployment 'bad'") && Contains(other_vocab_path()) &&
                                    Contains(target_path()) && Contains("different vocabularies"));
  // As are draft_tokens out of range, and a draft file that is not there.
  bad.draft_model = draft_path();
  bad.draft_tokens = 9;
  r = deploy(*cluster, bad);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Contains("draft_tokens must be in [1, 8]"));
  bad.draft_tokens = 0;
  bad.draft_model = dir() + "/no-such-draft.gguf";
  r = deploy(*cluster, bad);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Contains("deployment 'bad': draft model") && Contains("no-such-draft.gguf"));


  // Memory: a draft far larger than its model (about 45 MiB with its KV and
  // activations). The model's replica fits a device; with the draft counted,
  // none does.
  auto big = *model::preset_spec("tiny");
  big.name = "big-draft";
  big.dim = 512;
  big.n_heads = 4;
  big.ff_dim = 1536;
  const std::string big_path = dir() + "/big-draft.gguf";
  REQUIRE(model::generate_model(big, big_path));
  bad.draft_model = big_path;
  r = deploy(*cluster, bad);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::unavailable);
  CHECK_THAT(r.error().message, Contains("cannot place any replica of 'bad'"));
  bad.draft_model.clear();
  CHECK(deploy(*cluster, bad));
  // Served (so loaded) before the cluster stops: a replica stopped while its
  // warm-up step is out on the device is another test's subject.
  CHECK(complete("bad", "abc") == complete("plain", "abc"));

  door->stop();
  cluster->stop();
}
