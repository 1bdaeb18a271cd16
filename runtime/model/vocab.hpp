#pragma once
// A vocabulary as a GGUF file stores it: the tokenizer.ggml.* and
// tokenizer.chat_template metadata, read and written without interpretation.
// What the values mean at run time (llama.cpp's defaults for absent keys, the
// end-of-generation set, which tokens are special) is the tokenizer's business;
// keeping the stored form apart lets gen-model write exactly what a JSON file
// says and lets tests build vocabularies by hand.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace exa::model {

class gguf_file;
class gguf_writer;

using token_id = std::int32_t;

/// GGUF token types (tokenizer.ggml.token_type).
enum class token_kind : std::int32_t {
  normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6,
};

/// The special token ids a file may name (tokenizer.ggml.<name>_token_id).
struct special_token_ids {
  std::optional<token_id> bos, eos, eot, eom, unk, sep, pad;
  std::optional<token_id> fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep;
};

/// A GGUF key naming a special token id, and where it goes.
struct special_id_key {
  const char* key;
  std::optional<token_id> special_token_ids::*member;
};

/// Every id key llama.cpp reads (llama-arch.cpp's LLM_KV_TOKENIZER_*_ID;
/// "seperator" is spelled as llama.cpp and gguf-py spell it).
inline constexpr special_id_key special_id_keys[] = {
    {"tokenizer.ggml.bos_token_id", &special_token_ids::bos},
    {"tokenizer.ggml.eos_token_id", &special_token_ids::eos},
    {"tokenizer.ggml.eot_token_id", &special_token_ids::eot},
    {"tokenizer.ggml.eom_token_id", &special_token_ids::eom},
    {"tokenizer.ggml.unknown_token_id", &special_token_ids::unk},
    {"tokenizer.ggml.seperator_token_id", &special_token_ids::sep},
    {"tokenizer.ggml.padding_token_id", &special_token_ids::pad},
    {"tokenizer.ggml.fim_pre_token_id", &special_token_ids::fim_pre},
    {"tokenizer.ggml.fim_suf_token_id", &special_token_ids::fim_suf},
    {"tokenizer.ggml.fim_mid_token_id", &special_token_ids::fim_mid},
    {"tokenizer.ggml.fim_pad_token_id", &special_token_ids::fim_pad},
    {"tokenizer.ggml.fim_rep_token_id", &special_token_ids::fim_rep},
    {"tokenizer.ggml.fim_sep_token_id", &special_token_ids::fim_sep},
};

/// Bounds on what a vocabulary may hold: far above any real model (the largest
/// common vocabularies are ~260k tokens), small enough to refuse garbage early.
inline constexpr std::size_t vocab_max_tokens = std::size_t{1} << 20;
inline constexpr std::size_t vocab_max_token_bytes = 4096;
inline constexpr std::size_t vocab_max_merges = std::size_t{1} << 21;
inline constexpr std::size_t vocab_max_template_bytes = std::size_t{1} << 20;

struct vocab {
  std::string model = "none";          ///< tokenizer.ggml.model: "llama", "gpt2", ...
  std::string pre;                     ///< tokenizer.ggml.pre; empty when absent
  std::vector<std::string> tokens;     ///< tokenizer.ggml.tokens
  std::vector<float> scores;           ///< empty, or one per token
  std::vector<token_kind> kinds;       ///< empty, or one per token
  std::vector<std::string> merges;     ///< tokenizer.ggml.merges ("a b"), BPE only
  special_token_ids ids;
  std::optional<bool> add_bos, add_eos, add_space_prefix;
  std::optional<std::string> chat_template;  ///< tokenizer.chat_template

  /// Reads the metadata. Absent keys stay absent (empty / nullopt). Errors:
  /// invalid_argument naming the key whose type or size is wrong.
  static expected<vocab> from_gguf(const gguf_file& file);

  /// Checks sizes and ranges: arrays as long as tokens, ids inside the
  /// vocabulary, tokens non-empty and unique, everything within the bounds.
  expected<void> validate() const;

  /// Writes every present field under its GGUF key.
  void write_gguf(gguf_writer& w) const;
};

}  // namespace exa::model
