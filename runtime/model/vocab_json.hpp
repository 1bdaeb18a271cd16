#pragma once
// A vocabulary described in JSON, for `gen-model --vocab FILE.json`: tests and
// fixtures build GGUF files with realistic tokenizers without needing a real
// model download. The format (only "tokens" is required):
//
//   {"model": "llama" | "gpt2", "pre": "llama-bpe",
//    "tokens": ["<unk>", "<s>", ...], "scores": [0.0, ...], "token_type": [2, 3, ...],
//    "merges": ["a b", ...],
//    "bos_token_id": 1, "eos_token_id": 2, "eot_token_id": 7, "eom_token_id": 8,
//    "unknown_token_id": 0, "padding_token_id": 3,
//    "add_bos_token": true, "add_eos_token": false, "add_space_prefix": true,
//    "chat_template": "{% for m in messages %}..."}
//
// token_type uses GGUF's numbers (1 normal, 2 unknown, 3 control,
// 4 user-defined, 5 unused, 6 byte). "model" defaults to "llama". The keys
// "learned_from", "generator" and "comment" are notes for readers and are
// ignored; any other unknown key is an error (a typo should not pass).

#include <string>
#include <string_view>

#include "common/error.hpp"
#include "model/vocab.hpp"

namespace exa::model {

/// Parses and validates a JSON vocabulary. Errors: invalid_argument naming
/// the field (or the JSON syntax error's position).
expected<vocab> vocab_from_json(std::string_view json_text);

/// Reads `path` (at most 256 MiB) and parses it. Errors: io_error naming the
/// path, or vocab_from_json's errors prefixed with the path.
expected<vocab> vocab_from_json_file(const std::string& path);

}  // namespace exa::model
