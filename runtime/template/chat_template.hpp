#pragma once
// Chat rendering: a model's chat template (its GGUF tokenizer.chat_template,
// a named built-in, or a file) turned into the prompt text for a
// conversation, exactly as Hugging Face transformers' apply_chat_template
// renders it: variables `messages`, `tools` (None), `documents` (None),
// `add_generation_prompt`, `bos_token`, `eos_token`.
//
// With no template in the file, ExaServe uses ChatML (`chatml`), as
// llama.cpp does.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "template/template.hpp"
#include "template/value.hpp"

namespace exa::jinja {

struct builtin_template {
  std::string_view name;     // what --chat-template NAME selects
  std::string_view fixture;  // tests/fixtures/templates/<fixture>: the same bytes
  std::string_view source;
};

/// llama3, llama3.1, chatml, qwen2.5, mistral, mistral-v3, gemma, phi3,
/// zephyr, smollm2.
const std::vector<builtin_template>& builtin_templates();
std::optional<std::string_view> find_builtin_template(std::string_view name);

/// The built-in used when a model file carries no chat template.
inline constexpr std::string_view default_template_name = "chatml";

/// Where a template came from, for logs and errors.
struct template_source {
  std::string text;
  std::string origin;  // "model file", "built-in 'chatml'", "file /path"
};

/// Picks the template: `override_spec` (a built-in's name, else a file path)
/// when non-empty, else the file's own `file_template`, else the default.
/// Errors: not_found/io_error for an unreadable override file,
/// invalid_argument when it is larger than `bytes_max`.
expected<template_source> select_template(std::string_view override_spec,
                                          const std::optional<std::string>& file_template,
                                          std::size_t bytes_max = 1 << 20);

/// Checks an operator's --chat-template at startup: it names a built-in or a
/// readable file whose template compiles. Errors as select_template and
/// compiled_template::compile.
expected<void> check_template_override(std::string_view override_spec);

/// A deployment's own chat template travels as its text (resolved where the
/// deploy is issued: a FILE path means nothing on the controller or another
/// gateway), through the RPC, the controller's journal and every router's
/// announce; this bounds what each of them holds. The largest templates of
/// popular families are about 20 KiB; 128 KiB stays inside one journal
/// record (1 MiB) even if JSON escapes every byte as \u00XX.
inline constexpr std::size_t deployment_template_bytes_max = 128 << 10;

/// Resolves a deployment's `chat_template = NAME|FILE` to the template's
/// text, checked to compile and to be non-empty and at most `bytes_max`
/// bytes. Errors as select_template, compile errors with their construct
/// and line.
expected<template_source> resolve_template_override(std::string_view override_spec,
                                                    std::size_t bytes_max = deployment_template_bytes_max);

/// Checks a deployment's template text as it arrives (deploy RPC, journal):
/// at most deployment_template_bytes_max bytes and compiles. "" (none) is
/// valid.
expected<void> check_template_text(std::string_view text);

/// One message as the OpenAI API carries it: {"role": ..., "content": ...}.
value make_message(std::string role, std::string content);

struct chat_inputs {
  value messages;  // a list of message dicts
  bool add_generation_prompt = true;
  value tools = value(none_t{});
};

/// A compiled template with the model's special-token texts: built once per
/// model, used for every chat request.
class chat_renderer {
 public:
  /// Compiles `source`. Errors: as compiled_template::compile, prefixed with
  /// the origin.
  static expected<chat_renderer> create(const template_source& source, std::string bos_token,
                                        std::string eos_token, const template_limits& limits = {});

  /// Renders; `now_unix_s` is strftime_now's clock. Errors: the template's
  /// raise_exception message ("chat template: ..."), runtime errors with
  /// their line, unsupported constructs.
  expected<std::string> render(const chat_inputs& in, std::int64_t now_unix_s) const;

  const std::string& origin() const noexcept { return origin_; }
  const std::string& bos_token() const noexcept { return bos_; }
  const std::string& eos_token() const noexcept { return eos_; }

 private:
  compiled_template tpl_;
  std::string origin_, bos_, eos_;
};

/// What llama.cpp does before tokenizing a rendered chat (common/chat.cpp):
/// when the tokenizer adds BOS itself, a leading bos_token text is dropped
/// so the prompt does not start with two BOS; likewise a trailing eos_token
/// text when it adds EOS.
std::string strip_special_affixes(std::string rendered, std::string_view bos_token, bool add_bos,
                                  std::string_view eos_token, bool add_eos);

}  // namespace exa::jinja
