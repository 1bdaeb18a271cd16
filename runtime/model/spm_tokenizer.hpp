#pragma once
// SentencePiece vocabularies (tokenizer.ggml.model = "llama") tokenized as
// llama.cpp's llm_tokenizer_spm_session does it, on one fragment of text
// whose spaces the caller has already replaced by U+2581 "▁":
//   1. the text is cut into UTF-8 characters (a lead byte's length decides,
//      without checking continuation bytes; a truncated tail is one symbol);
//   2. every adjacent pair whose joined text is a token goes into a queue
//      ordered by that token's score (higher first; leftmost on ties);
//   3. the best pair is merged, stale queue entries are skipped, and the
//      merged symbol's new neighbours are queued, until the queue is empty;
//   4. each final symbol is its token if its text is one; otherwise (a
//      single character that is no token) one token per byte: `<0xHH>`, or
//      the byte's own one-byte token.
// llama.cpp throws when a byte has neither token; we emit the unknown token
// instead, and report an error only when the vocabulary has none.
//
// Token lookup covers every token whatever its type, as llama.cpp's
// text_to_token does (a control token's text can be formed by merges).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/error.hpp"
#include "model/vocab.hpp"

namespace exa::model {

class spm_tokenizer {
 public:
  /// `texts` and `scores` are the vocabulary's token texts and scores (scores
  /// may be shorter: missing ones are 0). Empty texts are not looked up.
  spm_tokenizer(const std::vector<std::string>& texts, const std::vector<float>& scores,
                std::optional<token_id> unk);

  /// Appends the ids of `text` to `out`. Errors: invalid_argument when a byte
  /// has no token and the vocabulary has no unknown token.
  expected<void> encode(std::string_view text, std::vector<token_id>& out) const;

  /// The id of a token text, if any.
  std::optional<token_id> find(std::string_view text) const;
  /// The token a byte falls back to (`<0xHH>`, else the one-byte text), if any.
  std::optional<token_id> byte_token(unsigned char b) const noexcept;

 private:
  struct string_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  using text_map = std::unordered_map<std::string, token_id, string_hash, std::equal_to<>>;

  text_map ids_;
  std::vector<float> scores_;
  std::optional<token_id> unk_;
  token_id byte_tokens_[256] = {};  // -1 where the byte has no token
};

}  // namespace exa::model
