// exaserve chat-template: a conversation rendered with a model's chat
// template, exactly as Hugging Face transformers' apply_chat_template
// renders it (our jinja2 interpreter, runtime/template/). Prints the prompt
// text with no newline added. Exit status 1 when the template raises (its
// message on stderr), 2 for bad flags or messages.

#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "args.hpp"
#include "cli_util.hpp"
#include "commands.hpp"
#include "common/json_syntax.hpp"
#include "template/model_chat.hpp"
#include "template/value_json.hpp"

namespace exa::app {
namespace {

const std::vector<flag_spec> flags = {
    {"model", true, "GGUF file whose tokenizer.chat_template, BOS and EOS are used (default: the generated tiny model)"},
    {"messages", true, "the conversation as JSON: [{\"role\": \"user\", \"content\": \"...\"}, ...]; @FILE reads a file"},
    {"no-generation-prompt", false, "render with add_generation_prompt = false (default true)"},
    {"chat-template", true, "use this template instead of the file's: a built-in name (llama3, llama3.1, chatml, "
                            "qwen2.5, mistral, mistral-v3, gemma, phi3, zephyr, smollm2) or a template file"},
    {"help", false, "show this help"},
};

constexpr std::size_t messages_bytes_max = std::size_t{16} << 20;

expected<std::string> read_messages_arg(const std::string& arg) {
  if (!arg.starts_with("@")) return arg;
  std::ifstream in(arg.substr(1), std::ios::binary);
  if (!in) return make_error(errc::not_found, "cannot read messages file '" + arg.substr(1) + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  if (ss.str().size() > messages_bytes_max)
    return make_error(errc::invalid_argument, "messages file is larger than " + std::to_string(messages_bytes_max) + " bytes");
  return ss.str();
}

expected<jinja::value> parse_messages(const std::string& text) {
  auto j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return make_error(errc::invalid_argument, "--messages is not JSON: " + json_syntax_error(text));
  if (!j.is_array()) return make_error(errc::invalid_argument, "--messages must be a JSON array of messages");
  for (std::size_t i = 0; i < j.size(); ++i)
    if (!j[i].is_object() || !j[i].contains("role") || !j[i]["role"].is_string())
      return make_error(errc::invalid_argument,
                        "--messages[" + std::to_string(i) + "] must be an object with a string 'role'");
  return jinja::from_json(j);
}

}  // namespace

int cmd_chat_template(int argc, char** argv) {
  auto a = args::parse(argc, argv, 2, flags);
  if (!a) return fail("chat-template", a.error());
  if (a->has("help")) {
    std::printf("usage: exaserve chat-template --model FILE --messages JSON [--no-generation-prompt] "
                "[--chat-template NAME|FILE]\n%s"
                "Without a template in the file (and no --chat-template), the ChatML built-in is used.\n",
                describe_flags(flags).c_str());
    return 0;
  }
  const auto messages_arg = a->get("messages");
  if (!messages_arg) return fail("chat-template", error{errc::invalid_argument, "--messages JSON is required"});
  std::string model_path;
  if (auto m = a->get("model")) {
    model_path = *m;
  } else {
    auto def = default_model_path();
    if (!def) return fail("chat-template", def.error());
    model_path = *def;
  }
  auto text = read_messages_arg(*messages_arg);
  if (!text) return fail("chat-template", text.error());
  auto messages = parse_messages(*text);
  if (!messages) return fail("chat-template", messages.error());
  auto renderer = jinja::chat_renderer_for_file(model_path, a->get_or("chat-template", ""));
  if (!renderer) return fail("chat-template", renderer.error());
  jinja::chat_inputs in;
  in.messages = std::move(*messages);
  in.add_generation_prompt = !a->has("no-generation-prompt");
  auto out = renderer->render(in, static_cast<std::int64_t>(std::time(nullptr)));
  if (!out) {
    // The template refused this conversation (raise_exception) or failed
    // running: status 1, not the usage-error status 2.
    fail("chat-template", out.error());
    return 1;
  }
  std::fwrite(out->data(), 1, out->size(), stdout);
  return 0;
}

}  // namespace exa::app
