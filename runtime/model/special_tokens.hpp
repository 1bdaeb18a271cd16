#pragma once
// Special tokens as llama.cpp treats them (src/llama-vocab.cpp, load() and
// tokenizer_st_partition()):
//   - token attributes start from the file's token types and are then
//     adjusted by text: tokens llama.cpp recognises as end-of-turn, FIM or
//     end-of-generation markers become control tokens, control tokens whose
//     text contains "unused" become unused, gpt-oss's channel markers become
//     user-defined, and Phi-3 models strip spaces to the right of specials;
//   - the end-of-generation set is every such marker plus eos, eot and eom
//     (with llama.cpp's two exceptions for <|end|> and </s>);
//   - control, user-defined and unknown tokens are cut out of raw text,
//     longest text first, before the tokenizer proper runs; control and
//     unknown ones only when the caller asks to parse specials.
// Where llama.cpp picks "the first" token by iterating its text-to-id hash
// map (eot, eom and FIM tokens found by text when the file names none), we
// iterate an identically built std::unordered_map, which gives the same
// order under the same standard library (libstdc++).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/vocab.hpp"

namespace exa::model {

/// llama.cpp's llama_token_attr bits.
enum token_attr : std::uint32_t {
  attr_undefined = 0,
  attr_unknown = 1u << 0,
  attr_unused = 1u << 1,
  attr_normal = 1u << 2,
  attr_control = 1u << 3,
  attr_user_defined = 1u << 4,
  attr_byte = 1u << 5,
  attr_normalized = 1u << 6,
  attr_lstrip = 1u << 7,
  attr_rstrip = 1u << 8,
  attr_single_word = 1u << 9,
};

/// The attribute llama.cpp gives a GGUF token type.
std::uint32_t attr_of(token_kind kind) noexcept;

/// What load-time resolution produces.
struct special_tokens {
  special_token_ids ids;               ///< after detection by text
  std::vector<token_id> eog;           ///< end-of-generation ids, ascending
  std::vector<token_id> partition_order;  ///< specials, longest text first
};

/// Resolves special tokens and adjusts `attrs` (one per text) in place, as
/// llama.cpp's load() does. `ids` are the file's ids after llama.cpp's
/// per-type defaults; `model_name` is general.name (Phi-3's rule keys on it).
special_tokens resolve_special_tokens(const std::vector<std::string>& texts, std::vector<std::uint32_t>& attrs,
                                      special_token_ids ids, std::string_view model_name);

/// One piece of a partitioned text: a special token, or raw text (token < 0).
struct text_fragment {
  token_id token = -1;
  std::string_view text;
};

/// Cuts the special tokens out of `text` in `order`, each special splitting
/// every raw piece at all of its non-overlapping occurrences (leftmost
/// first); LSTRIP/RSTRIP specials also eat the whitespace beside them.
/// Control and unknown tokens are cut only when `parse_special`.
std::vector<text_fragment> partition_special(std::string_view text, const std::vector<token_id>& order,
                                             const std::vector<std::string>& texts,
                                             const std::vector<std::uint32_t>& attrs, bool parse_special);

}  // namespace exa::model
