#pragma once
// Tokenizers. ExaServe runs the byte-level vocabulary that `gen-model` writes;
// for any other vocabulary the model still loads and generates from token ids,
// and encoding text fails with an error naming the tokenizer type.
//
// The byte-level vocabulary is stored as a standard `llama` (SentencePiece)
// GGUF vocabulary so other tools load it too: id 0 `<unk>`, 1 `<s>` (BOS),
// 2 `</s>` (EOS), 3..258 the byte tokens `<0x00>`..`<0xFF>`, 259 `▁` (U+2581,
// SentencePiece's space), then unused padding tokens up to the model's vocab.
// Every UTF-8 byte of a text is one token, a space being `▁`; llama.cpp's
// SentencePiece tokenizer produces the same ids for this vocabulary (with
// add_space_prefix = false) because no multi-character piece exists to merge.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "model/vocab.hpp"

namespace exa::model {

class gguf_file;
class gguf_writer;

class tokenizer {
 public:
  /// Reads tokenizer.ggml.* metadata. A file with no tokenizer metadata, or one
  /// of a type we do not run, gives a tokenizer that decodes what it can and
  /// refuses encode(). `vocab_size` is the model's (from token_embd).
  static expected<tokenizer> from_gguf(const gguf_file& file, std::uint32_t vocab_size);

  /// The byte-level vocabulary of `vocab_size` tokens (>= 260).
  static tokenizer byte_level(std::uint32_t vocab_size);

  /// Writes this tokenizer's metadata (model, tokens, scores, token types,
  /// bos/eos/unk ids, add_bos_token, add_space_prefix).
  void write_gguf(gguf_writer& w) const;

  /// The GGUF tokenizer.ggml.model string ("llama", "gpt2", ... or "none").
  const std::string& type_name() const noexcept { return type_name_; }
  /// True when encode() works for this vocabulary.
  bool can_encode() const noexcept { return byte_level_; }

  /// Text to ids, BOS first when `add_bos`. Errors: unsupported naming the
  /// tokenizer type when this vocabulary cannot encode.
  expected<std::vector<token_id>> encode(std::string_view text, bool add_bos) const;

  /// One token's bytes: byte tokens give their byte, `▁` a space, normal
  /// tokens their text with `▁` as spaces, control/unused tokens nothing.
  std::string decode_token(token_id id) const;
  std::string decode(const std::vector<token_id>& ids) const;

  std::uint32_t vocab_size() const noexcept { return static_cast<std::uint32_t>(tokens_.size()); }
  std::optional<token_id> bos() const noexcept { return bos_; }
  std::optional<token_id> eos() const noexcept { return eos_; }

 private:
  expected<void> read_vocab(const gguf_file& file);
  /// Sets byte_level_ (and the byte map) iff the vocabulary is exactly ours.
  void detect_byte_level();

  std::string type_name_ = "none";
  bool byte_level_ = false;
  std::vector<std::string> tokens_;
  std::vector<float> scores_;
  std::vector<token_kind> kinds_;
  std::optional<token_id> bos_, eos_, unk_;
  token_id byte_token_[256] = {};  // byte value -> id, when byte_level_
  token_id space_token_ = -1;
};

}  // namespace exa::model
