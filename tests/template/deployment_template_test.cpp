// A deployment's own chat template: `[deployment NAME] chat_template =
// NAME|FILE` is resolved to its text while the config is parsed (bad ones
// fail startup naming the deployment, the construct and the line), and it
// wins over the gateway's --chat-template and the model file's template:
// two deployments of one file, one with its own template and one without,
// render the same conversation differently, each exactly as its template
// says. A template text that does not compile is refused at deploy time.

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <future>

#include <nlohmann/json.hpp>

#include "actors/embedded_cluster.hpp"
#include "frontdoor.hpp"
#include "http_client.hpp"
#include "model/llama_model.hpp"
#include "model/model_gen.hpp"
#include "serve_config.hpp"
#include "template/model_chat.hpp"

using namespace exa;
using json = nlohmann::json;
using Catch::Matchers::Contains;

namespace {

std::string tmp_file(const std::string& name, const std::string& text) {
  const std::string dir = std::string(EXA_TEST_TMPDIR) + "/deployment_template";
  std::filesystem::create_directories(dir);
  const std::string p = dir + "/" + name;
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

// The generated tiny model (a byte vocabulary, no template in its file):
// any template's rendering tokenizes.
const std::string& model_path() {
  static const std::string path = [] {
    auto spec = *model::preset_spec("tiny");
    const std::string p = std::string(EXA_TEST_TMPDIR) + "/deployment_template/tiny.gguf";
    std::filesystem::create_directories(std::filesystem::path(p).parent_path());
    REQUIRE(model::generate_model(spec, p));
    return p;
  }();
  return path;
}

std::string builtin(const char* name) { return std::string(*jinja::find_builtin_template(name)); }

}  // namespace

TEST_CASE("serve config: a deployment's chat_template is its resolved text", "[template][config]") {
  const std::string file_text = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}";
  const auto file = tmp_file("mine.jinja", file_text);
  app::serve_config c = app::default_serve_config();
  REQUIRE(app::apply_config_text("[deployment a]\nchat_template = llama3\n"
                                 "[deployment b]\nchat_template = " + file + "\n[deployment c]\nreplicas = 1\n",
                                 c));
  REQUIRE(c.cluster.deployments.size() == 3);
  CHECK(c.cluster.deployments[0].chat_template == builtin("llama3"));
  CHECK(c.cluster.deployments[1].chat_template == file_text);
  CHECK(c.cluster.deployments[2].chat_template.empty());
}

TEST_CASE("serve config: a deployment's chat_template that cannot be used fails, naming it", "[template][config]") {
  app::serve_config c = app::default_serve_config();
  auto r = app::apply_config_text("[deployment a]\nreplicas = 1\nchat_template = no-such-template\n", c);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Contains("line 3: chat_template of deployment 'a'") && Contains("neither a built-in"));

  const auto broken = tmp_file("broken.jinja", "{{ messages }}\n{% macro greet() %}hi{% endmacro %}");
  r = app::apply_config_text("[deployment b]\nchat_template = " + broken + "\n", c);
  REQUIRE_FALSE(r);
  INFO(r.error().message);
  CHECK_THAT(r.error().message, Contains("deployment 'b'") && Contains("unsupported statement 'macro'") &&
                                    Contains("chat template line 2") && Contains(broken));

  const auto empty = tmp_file("empty.jinja", "");
  r = app::apply_config_text("[deployment e]\nchat_template = " + empty + "\n", c);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Contains("deployment 'e'") && Contains("is empty"));

  const auto huge = tmp_file("huge.jinja", std::string(jinja::deployment_template_bytes_max + 1, 'x'));
  r = app::apply_config_text("[deployment h]\nchat_template = " + huge + "\n", c);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Contains("deployment 'h'") && Contains("larger than"));
}

namespace {

std::size_t rendered_prompt_tokens(const std::string& deployment_text, const std::string& override_spec,
                                   const json& messages) {
  auto m = model::llama_model::load(model_path());
  REQUIRE(m);
  auto r = jinja::chat_renderer_for_file(model_path(), override_spec, deployment_text);
  REQUIRE(r);
  jinja::list l;
  for (const auto& msg : messages) l.push_back(jinja::make_message(msg["role"], msg["content"]));
  jinja::chat_inputs in;
  in.messages = jinja::value(std::move(l));
  auto text = r->render(in, 0);
  REQUIRE(text);
  const auto& tok = (*m)->tokenizer();
  auto ids = tok.encode(jinja::strip_special_affixes(*text, r->bos_token(), tok.add_bos(), r->eos_token(), tok.add_eos()),
                        true, true);
  REQUIRE(ids);
  return ids->size();
}

}  // namespace

TEST_CASE("two deployments of one file render with their own templates over --chat-template",
          "[template][serving][chat_template]") {
  // "own" has its own template (a distinctive one, its rendering much longer
  // than llama3's); "plain" falls back to the gateway's --chat-template.
  const std::string own = "{% for m in messages %}<<<{{ m.role | upper }}>>> {{ m.content }} <<<END>>>\n"
                          "{% endfor %}{% if add_generation_prompt %}<<<ASSISTANT>>> {% endif %}";
  actors::cluster_options o;
  o.nodes = 1;
  o.devices_per_node = 1;
  o.device_memory_bytes = 64ull << 20;
  o.default_model_file = model_path();
  o.scheduler_threads = 2;
  o.chat_template = "llama3";
  api::deploy_request a;
  a.name = "own";
  a.replicas = 1;
  a.warm_pool_percent = 0;
  a.chat_template = own;
  api::deploy_request b = a;
  b.name = "plain";
  b.chat_template.clear();
  o.deployments = {a, b};
  auto c = actors::embedded_cluster::start(o);
  REQUIRE(c.has_value());
  auto cluster = std::move(*c);
  frontdoor_config fc;
  fc.http_port = 0;
  fc.rpc_port = 0;
  auto door = frontdoor::start(fc, cluster->backend());
  REQUIRE(door.has_value());

  const json messages = json::array({{{"role", "system"}, {"content", "be brief"}}, {{"role", "user"}, {"content", "hi"}}});
  auto prompt_tokens = [&](const std::string& model) {
    const auto r = test::http_request((*door)->http_port(), "POST", "/v1/chat/completions",
                                      json{{"model", model}, {"messages", messages}, {"max_tokens", 1}}.dump());
    INFO(r.body);
    REQUIRE(r.status == 200);
    return json::parse(r.body)["usage"]["prompt_tokens"].get<std::size_t>();
  };
  const auto want_own = rendered_prompt_tokens(own, "llama3", messages);
  const auto want_plain = rendered_prompt_tokens("", "llama3", messages);
  REQUIRE(want_own != want_plain);
  CHECK(prompt_tokens("own") == want_own);
  CHECK(prompt_tokens("plain") == want_plain);

  // A template text that does not compile is refused at deploy, naming it.
  api::deploy_request bad = a;
  bad.name = "bad";
  bad.chat_template = "{% frobnicate %}";
  std::promise<expected<void>> done;
  cluster->backend()->deploy(bad, [&](expected<void> r) { done.set_value(std::move(r)); });
  const auto r = done.get_future().get();
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::invalid_argument);
  CHECK_THAT(r.error().message, Contains("deployment 'bad'") && Contains("frobnicate"));

  (*door)->stop();
  cluster->stop();
}
