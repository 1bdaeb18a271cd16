// `exaserve chat-template`: the rendered prompt exactly on stdout (no added
// newline), the file's template with its BOS/EOS texts, overrides by name,
// the ChatML default, and a raising template's message on stderr.

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "run_command.hpp"

namespace {

const std::string exaserve = std::string(EXA_BIN_DIR) + "/exaserve";

std::string tmp(const std::string& name) {
  const std::string dir = std::string(EXA_TEST_TMPDIR) + "/template_cli";
  std::filesystem::create_directories(dir);
  return dir + "/" + name;
}

exa::test::command_result run(std::vector<std::string> args) {
  args.insert(args.begin(), exaserve);
  auto r = exa::test::run_command(args);
  INFO("stderr: " << r.err);
  REQUIRE_FALSE(r.signaled);
  return r;
}

/// A tiny model whose vocabulary has "<s>"/"</s>" and Gemma's chat template.
const std::string& gemma_like_model() {
  static const std::string path = [] {
    nlohmann::json v;
    v["model"] = "llama";
    std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
    std::vector<int> types = {2, 3, 3};
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      tokens.emplace_back(name);
      types.push_back(6);
    }
    tokens.emplace_back("\xe2\x96\x81");  // ▁
    types.push_back(1);
    v["tokens"] = tokens;
    v["token_type"] = types;
    v["scores"] = std::vector<float>(tokens.size(), 0.0f);
    v["bos_token_id"] = 1;
    v["eos_token_id"] = 2;
    v["unknown_token_id"] = 0;
    v["add_space_prefix"] = false;
    std::ifstream t(std::string(EXA_TEMPLATE_FIXTURES) + "/gemma.jinja", std::ios::binary);
    v["chat_template"] = std::string(std::istreambuf_iterator<char>(t), {});
    const std::string vocab = tmp("gemma_vocab.json");
    std::ofstream(vocab) << v.dump();
    const std::string p = tmp("gemma_like.gguf");
    auto r = run({"gen-model", "--preset", "tiny", "--seed", "1", "--vocab", vocab, "--out", p});
    REQUIRE(r.exit_code == 0);
    return p;
  }();
  return path;
}

const std::string& plain_model() {
  static const std::string path = [] {
    const std::string p = tmp("plain.gguf");
    auto r = run({"gen-model", "--preset", "tiny", "--seed", "2", "--out", p});
    REQUIRE(r.exit_code == 0);
    return p;
  }();
  return path;
}

const std::string conversation = R"([{"role": "user", "content": "Hi \"there\" é"}, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}])";

}  // namespace

TEST_CASE("chat-template prints the file's template rendering exactly", "[template][cli]") {
  auto r = run({"chat-template", "--model", gemma_like_model(), "--messages", conversation});
  REQUIRE(r.exit_code == 0);
  CHECK(r.out ==
        "<s><start_of_turn>user\nHi \"there\" é<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
  r = run({"chat-template", "--model", gemma_like_model(), "--messages", conversation, "--no-generation-prompt"});
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.ends_with("<start_of_turn>user\nBye<end_of_turn>\n"));
}

TEST_CASE("chat-template exits non-zero with the template's own message when it raises", "[template][cli]") {
  const auto r = run({"chat-template", "--model", gemma_like_model(), "--messages",
                      R"([{"role": "system", "content": "x"}, {"role": "user", "content": "y"}])"});
  CHECK(r.exit_code == 1);
  CHECK(r.out.empty());
  CHECK(r.err.find("System role not supported") != std::string::npos);
}

TEST_CASE("chat-template: --chat-template NAME overrides, ChatML is the default", "[template][cli]") {
  auto r = run({"chat-template", "--model", gemma_like_model(), "--messages", R"([{"role": "user", "content": "Q"}])",
                "--chat-template", "llama3"});
  REQUIRE(r.exit_code == 0);
  CHECK(r.out == "<s><|start_header_id|>user<|end_header_id|>\n\nQ<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  r = run({"chat-template", "--model", plain_model(), "--messages", R"([{"role": "user", "content": "Q"}])"});
  REQUIRE(r.exit_code == 0);
  CHECK(r.out == "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n");
  r = run({"chat-template", "--model", plain_model(), "--messages", "[]", "--chat-template", "no-such-template"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("neither a built-in") != std::string::npos);
}

TEST_CASE("chat-template refuses malformed messages with a reason", "[template][cli]") {
  auto r = run({"chat-template", "--model", plain_model(), "--messages", "[{\"role\": "});
  CHECK(r.exit_code != 0);
  CHECK(r.err.find("--messages is not JSON") != std::string::npos);
  r = run({"chat-template", "--model", plain_model(), "--messages", R"({"role": "user"})"});
  CHECK(r.exit_code != 0);
  CHECK(r.err.find("must be a JSON array") != std::string::npos);
  r = run({"chat-template", "--model", plain_model()});
  CHECK(r.exit_code != 0);
  CHECK(r.err.find("--messages JSON is required") != std::string::npos);
}

TEST_CASE("serve refuses a --chat-template that names nothing usable, before starting", "[template][cli]") {
  auto r = run({"serve", "--chat-template", "no-such-template", "--http-port", "0", "--rpc-port", "0"});
  CHECK(r.exit_code != 0);
  CHECK(r.err.find("chat template 'no-such-template' is neither a built-in") != std::string::npos);
  const std::string broken = tmp("broken.jinja");
  std::ofstream(broken) << "{% for m in messages %}";
  r = run({"serve", "--chat-template", broken, "--http-port", "0", "--rpc-port", "0"});
  CHECK(r.exit_code != 0);
  CHECK(r.err.find("missing 'endfor'") != std::string::npos);
}
