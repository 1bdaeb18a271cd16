// /v1/chat/completions end to end on loopback: the real embedded cluster
// behind the real HTTP door, serving a model whose GGUF file carries Gemma's
// chat template and control tokens <start_of_turn>/<end_of_turn>. The prompt
// the cluster runs must be exactly the file's template rendering tokenized
// with special tokens parsed and one BOS (llama.cpp's rule); a conversation
// the template refuses comes back as a 400 with the template's message.
// Under a Llama-3-style BPE vocabulary, the ids the cluster runs equal the ids
// llama.cpp makes of the same rendering (fixture from
// scripts/make_chat_ids_fixture.py).

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "actors/embedded_cluster.hpp"
#include "engine/cpu_engine.hpp"
#include "engine/thread_pool.hpp"
#include "frontdoor.hpp"
#include "gpu/cpu_memory_pool.hpp"
#include "http_client.hpp"
#include "model/llama_model.hpp"
#include "model/model_gen.hpp"
#include "model/utf8.hpp"
#include "model/vocab_json.hpp"
#include "template/model_chat.hpp"

using namespace exa;
using json = nlohmann::json;

namespace {

constexpr model::token_id start_of_turn = 3, end_of_turn = 4;

const std::string& model_path() {
  static const std::string path = [] {
    model::vocab v;
    v.model = "llama";
    v.tokens = {"<unk>", "<s>", "</s>", "<start_of_turn>", "<end_of_turn>"};
    v.kinds = {model::token_kind::unknown, model::token_kind::control, model::token_kind::control,
               model::token_kind::control, model::token_kind::control};
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      v.tokens.emplace_back(name);
      v.kinds.push_back(model::token_kind::byte);
    }
    v.tokens.emplace_back("\xe2\x96\x81");
    v.kinds.push_back(model::token_kind::normal);
    v.scores.assign(v.tokens.size(), 0.0f);
    v.ids.bos = 1;
    v.ids.eos = 2;
    v.ids.unk = 0;
    v.add_bos = true;
    v.add_space_prefix = false;
    v.chat_template = std::string(*jinja::find_builtin_template("gemma"));
    auto spec = *model::preset_spec("tiny");
    spec.vocab_size = static_cast<std::uint32_t>(v.tokens.size());
    spec.vocabulary = std::move(v);
    const std::string dir = std::string(EXA_TEST_TMPDIR) + "/template_serving";
    std::filesystem::create_directories(dir);
    const std::string p = dir + "/gemma_like.gguf";
    REQUIRE(model::generate_model(spec, p));
    return p;
  }();
  return path;
}

/// What the cluster must run: the template's text, llama.cpp's BOS rule, specials parsed.
std::vector<model::token_id> expected_prompt(const std::string& override_spec, const std::vector<std::pair<std::string, std::string>>& msgs) {
  auto m = model::llama_model::load(model_path());
  REQUIRE(m);
  auto r = jinja::chat_renderer_for_file(model_path(), override_spec);
  REQUIRE(r);
  jinja::list l;
  for (const auto& [role, content] : msgs) l.push_back(jinja::make_message(role, content));
  jinja::chat_inputs in;
  in.messages = jinja::value(std::move(l));
  auto text = r->render(in, 0);
  REQUIRE(text);
  const auto& tok = (*m)->tokenizer();
  auto ids = tok.encode(jinja::strip_special_affixes(*text, r->bos_token(), tok.add_bos(), r->eos_token(), tok.add_eos()),
                        true, true);
  REQUIRE(ids);
  return *ids;
}

std::string engine_text(const std::vector<model::token_id>& prompt, std::uint32_t max_tokens,
                        const std::string& path = model_path()) {
  auto m = model::llama_model::load(path);
  REQUIRE(m);
  auto pool = gpu::cpu_memory_pool::create(engine::cpu_engine::kv_block_bytes((*m)->config(), 16), 64);
  engine::thread_pool threads(1);
  engine::cpu_engine eng(*m, **pool, threads);
  engine::generation_request req;
  req.prompt = prompt;
  req.max_tokens = max_tokens;
  for (auto t : (*m)->tokenizer().eog_ids()) req.stop_tokens.push_back(t);
  REQUIRE(eng.submit(req));
  std::string bytes;
  while (!eng.idle())
    for (const auto& t : eng.step().tokens) bytes += (*m)->tokenizer().decode_token(t.token);
  return model::sanitize_utf8(bytes);
}

struct server {
  std::unique_ptr<actors::embedded_cluster> cluster;
  std::unique_ptr<frontdoor> door;

  explicit server(const std::string& chat_template = "", const std::string& model_file = model_path()) {
    actors::cluster_options o;
    o.nodes = 1;
    o.devices_per_node = 1;
    o.device_memory_bytes = 64ull << 20;
    o.default_model_file = model_file;
    o.scheduler_threads = 2;
    o.chat_template = chat_template;
    api::deploy_request d;
    d.name = "chat";
    d.replicas = 1;
    o.deployments.push_back(d);
    auto c = actors::embedded_cluster::start(o);
    REQUIRE(c.has_value());
    cluster = std::move(*c);
    frontdoor_config fc;
    fc.http_port = 0;
    fc.rpc_port = 0;
    auto f = frontdoor::start(fc, cluster->backend());
    REQUIRE(f.has_value());
    door = std::move(*f);
  }
  ~server() {
    door->stop();
    cluster->stop();
  }
};

json chat(std::uint16_t port, const json& messages, std::uint32_t max_tokens, int want_status) {
  const auto r = test::http_request(port, "POST", "/v1/chat/completions",
                                    json{{"model", "chat"}, {"messages", messages}, {"max_tokens", max_tokens}}.dump());
  INFO(r.body);
  REQUIRE(r.status == want_status);
  return json::parse(r.body);
}

}  // namespace

TEST_CASE("chat completions run the file's template, specials parsed, one BOS", "[template][serving]") {
  const std::vector<std::pair<std::string, std::string>> msgs = {{"user", "Hi there"}, {"assistant", "Hello"}, {"user", "Bye"}};
  const auto want = expected_prompt("", msgs);
  // The template wrote "<bos>" as text; llama.cpp drops it and the tokenizer
  // adds the one BOS; the turn markers are single control tokens.
  REQUIRE(want.size() > 3);
  CHECK(want[0] == 1);
  CHECK(want[1] == start_of_turn);
  CHECK(std::count(want.begin(), want.end(), 1) == 1);
  CHECK(std::count(want.begin(), want.end(), end_of_turn) == 3);

  server s;
  json messages = json::array();
  for (const auto& [role, content] : msgs) messages.push_back({{"role", role}, {"content", content}});
  const auto j = chat(s.door->http_port(), messages, 8, 200);
  CHECK(j["usage"]["prompt_tokens"] == want.size());
  CHECK(j["choices"][0]["message"]["content"] == engine_text(want, 8));
}

TEST_CASE("chat completions: a template that raises is a 400 with its message", "[template][serving]") {
  server s;
  const auto j = chat(s.door->http_port(),
                      json::array({{{"role", "system"}, {"content", "be brief"}}, {{"role", "user"}, {"content", "hi"}}}), 4,
                      400);
  CHECK(j["error"]["message"].get<std::string>().find("System role not supported") != std::string::npos);
  // Streamed, the refusal comes before any event: a plain 400 too.
  const auto r = test::http_request(
      s.door->http_port(), "POST", "/v1/chat/completions",
      json{{"model", "chat"},
           {"stream", true},
           {"messages", json::array({{{"role", "system"}, {"content", "x"}}, {{"role", "user"}, {"content", "y"}}})}}
          .dump());
  INFO(r.body);
  CHECK(r.status == 400);
  CHECK(r.body.find("System role not supported") != std::string::npos);
}

TEST_CASE("chat completions: --chat-template overrides the file's template", "[template][serving]") {
  const std::vector<std::pair<std::string, std::string>> msgs = {{"system", "be brief"}, {"user", "hi"}};
  const auto want = expected_prompt("chatml", msgs);
  server s("chatml");
  json messages = json::array();
  for (const auto& [role, content] : msgs) messages.push_back({{"role", role}, {"content", content}});
  const auto j = chat(s.door->http_port(), messages, 4, 200);  // Gemma's would refuse the system role
  CHECK(j["usage"]["prompt_tokens"] == want.size());
}

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// The fixture's model: the committed BPE vocabulary plus the header control
/// tokens, add_bos_token, and the family's template.
std::string llama3_like_model(const nlohmann::json& fixture, const std::string& template_name) {
  auto v = nlohmann::json::parse(read_text(std::string(EXA_FIXTURES_DIR) + "/tokenizer/bpe-vocab.json"));
  v.erase("learned_from");
  for (const auto& t : fixture["added_control_tokens"]) {
    v["tokens"].push_back(t);
    v["token_type"].push_back(3);
  }
  v["add_bos_token"] = true;
  v["chat_template"] = read_text(std::string(EXA_FIXTURES_DIR) + "/templates/" + template_name + ".jinja");
  auto vocab = model::vocab_from_json(v.dump());
  REQUIRE(vocab);
  auto spec = *model::preset_spec("tiny");
  spec.vocab_size = static_cast<std::uint32_t>(vocab->tokens.size());
  spec.vocabulary = std::move(*vocab);
  const std::string p = std::string(EXA_TEST_TMPDIR) + "/template_serving/bpe_" + template_name + ".gguf";
  REQUIRE(model::generate_model(spec, p));
  return p;
}

}  // namespace

TEST_CASE("chat completions run the ids llama.cpp makes of the rendered conversation", "[template][serving][llamacpp]") {
  const auto fixture = nlohmann::json::parse(read_text(std::string(EXA_FIXTURES_DIR) + "/templates/llamacpp_chat_ids.json"));
  REQUIRE(fixture["cases"].size() == 3);
  for (const auto& c : fixture["cases"]) {
    const std::string name = c["template"].get<std::string>();
    INFO(name << ": " << c["messages"].dump());
    const std::string path = llama3_like_model(fixture, name);
    const auto want = c["llamacpp_ids"].get<std::vector<model::token_id>>();
    // Our rendering is the one llama.cpp tokenized...
    auto r = jinja::chat_renderer_for_file(path, "");
    REQUIRE(r);
    jinja::list l;
    for (const auto& m : c["messages"]) l.push_back(jinja::make_message(m["role"], m["content"]));
    jinja::chat_inputs in;
    in.messages = jinja::value(std::move(l));
    CHECK(*r->render(in, 0) == c["rendered"].get<std::string>());
    // ...and the cluster runs exactly llama.cpp's ids for it.
    server s("", path);
    const auto j = chat(s.door->http_port(), c["messages"], 6, 200);
    CHECK(j["usage"]["prompt_tokens"] == want.size());
    CHECK(j["choices"][0]["message"]["content"] == engine_text(want, 6, path));
  }
}
