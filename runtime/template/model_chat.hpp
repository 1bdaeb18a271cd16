#pragma once
// A model file's chat setup: its tokenizer.chat_template (or an override by
// built-in name or file), with the texts of its BOS and EOS tokens as the
// template's bos_token and eos_token. Kept apart from the interpreter so
// exa_template does not depend on the model layer.

#include <string>
#include <string_view>

#include "common/error.hpp"
#include "model/vocab.hpp"
#include "template/chat_template.hpp"

namespace exa::jinja {

/// The renderer for a vocabulary as its GGUF file stores it. `override_spec`
/// (a built-in name or a template file; empty for none) wins over the file's
/// template; with neither, the ChatML default. Errors: the template's
/// compile error or an unreadable override, naming where it came from.
/// `deployment_template` (a deployment's own template text, already
/// resolved; "" for none) wins over both.
expected<chat_renderer> chat_renderer_for(const model::vocab& v, std::string_view override_spec,
                                          std::string_view deployment_template = {});

/// The same, reading the vocabulary from a GGUF file (metadata only).
expected<chat_renderer> chat_renderer_for_file(const std::string& gguf_path, std::string_view override_spec,
                                               std::string_view deployment_template = {});

/// The text of token `id` in `v`, or "" when absent or out of range.
std::string token_text_or_empty(const model::vocab& v, std::optional<model::token_id> id);

}  // namespace exa::jinja
