#pragma once
// Byte-level BPE (tokenizer.ggml.model = "gpt2") as llama.cpp's
// llm_tokenizer_bpe_session runs it on one pre-tokenizer piece:
//   1. every byte of the piece becomes its GPT-2 code point ("byte mapping":
//      printable Latin-1 bytes map to themselves, the other 68 bytes to
//      U+0100.. in byte order), one symbol per byte;
//   2. while some adjacent pair "left right" is in tokenizer.ggml.merges, the
//      pair with the lowest merge rank (its index in the list; the first entry
//      wins when a pair is listed twice) is merged, the leftmost on ties;
//   3. each final symbol is looked up as a token; one that is not a token
//      falls back to the tokens of its single bytes (of the byte-mapped text,
//      as llama.cpp does), and bytes without a token are dropped silently.
// With `ignore_merges` (Llama 3 style pre-tokenizers) a piece whose whole
// mapped text is a token is that token, without merging.
//
// Token lookup covers every token whatever its type, as llama.cpp's
// text_to_token does; which tokens are parsed as specials in raw text is the
// caller's concern (runtime/model/tokenizer.cpp).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/error.hpp"

namespace exa::model {

using token_id = std::int32_t;

/// The GPT-2 byte mapping of `bytes` (UTF-8 of the mapped code points).
std::string gpt2_byte_encode(std::string_view bytes);
/// The inverse: mapped text back to bytes; nullopt when `text` holds a code
/// point that is not the image of a byte (such tokens are not byte-mapped).
std::optional<std::string> gpt2_byte_decode(std::string_view text);

/// Remembers the ids of pieces already encoded, for one caller at a time
/// (typically one encode() call of a long text, where words repeat). Bounded:
/// pieces longer than `max_piece_bytes` are not kept, and the cache starts
/// over when it holds `max_entries`.
class bpe_piece_cache {
 public:
  static constexpr std::size_t max_entries = 16384;
  static constexpr std::size_t max_piece_bytes = 64;

  const std::vector<std::int32_t>* find(std::string_view piece) const;
  void insert(std::string_view piece, const std::int32_t* ids, std::size_t n);
  std::size_t size() const noexcept { return map_.size(); }

 private:
  struct string_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, std::vector<std::int32_t>, string_hash, std::equal_to<>> map_;
};

class bpe {
 public:
  /// `tokens` are tokenizer.ggml.tokens (byte-mapped texts), `merges` are
  /// tokenizer.ggml.merges ("left right", split at the first space after the
  /// first character, as llama.cpp splits them). An empty token text stands
  /// for "[EMPTY_<id>]", as in llama.cpp. Errors: corrupt_data for a token text
  /// that appears twice (llama.cpp refuses such a vocabulary too).
  static expected<bpe> create(const std::vector<std::string>& tokens,
                              const std::vector<std::string>& merges, bool ignore_merges);

  /// Appends the ids of one pre-tokenizer piece (raw bytes, not mapped).
  /// Thread-safe for concurrent calls: it only reads this object (a cache,
  /// when given, belongs to the calling thread).
  void encode_piece(std::string_view piece, std::vector<token_id>& out,
                    bpe_piece_cache* cache = nullptr) const;

  /// The id of a token text (byte-mapped), if any.
  std::optional<token_id> find_token(std::string_view text) const;
  /// The rank of the merge "left right", if listed.
  std::optional<std::int32_t> merge_rank(std::string_view left, std::string_view right) const;

  std::size_t token_count() const noexcept { return token_ids_.size(); }
  bool ignore_merges() const noexcept { return ignore_merges_; }

 private:
  struct string_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  template <class V>
  using string_map = std::unordered_map<std::string, V, string_hash, std::equal_to<>>;

  void merge_piece(std::string_view piece, std::vector<token_id>& out) const;

  struct merge_result {
    std::int32_t rank;
    token_id merged;  // -1 when the merged text is no token
  };

  string_map<token_id> token_ids_;
  string_map<std::int32_t> merge_ranks_;  // key: the merge string "left right"
  std::unordered_map<std::uint64_t, merge_result> merge_ids_;  // key: left id << 32 | right id
  token_id byte_ids_[256] = {};  // the token of each byte's mapped text, -1 if none
  bool ignore_merges_ = false;
};

}  // namespace exa::model
