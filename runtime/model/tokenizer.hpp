#pragma once
// Tokenizers, exactly as llama.cpp tokenizes (src/llama-vocab.cpp): text to
// ids (llama_tokenize) and ids to text (llama_token_to_piece,
// llama_detokenize with remove_special = false).
//
//   - "llama": SentencePiece vocabularies with scores (spm_tokenizer.hpp),
//     byte fallback, add_space_prefix;
//   - "gpt2": byte-level BPE with merges and the pre-tokenizer named by
//     tokenizer.ggml.pre (pre_tokenizer.hpp, bpe.hpp);
//   - any other type (or none) loads and decodes what it can; encode() then
//     fails with an error naming the type.
// Special tokens (special_tokens.hpp) are cut out of the text first: control
// tokens only when the caller parses specials, user-defined ones always.
//
// ExaServe's own byte-level vocabulary (what `gen-model` writes without
// --vocab) is a "llama" vocabulary: id 0 `<unk>`, 1 `<s>` (BOS), 2 `</s>`
// (EOS), 3..258 the byte tokens `<0x00>`..`<0xFF>`, 259 `▁` (U+2581), then
// unused padding tokens up to the model's vocab, add_space_prefix = false.
// SentencePiece gives every byte of valid UTF-8 its own token there (no
// multi-character piece exists to merge), so such text takes a direct path
// with the same result.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "model/vocab.hpp"

namespace exa::model {

class gguf_file;
class gguf_writer;
class spm_tokenizer;
class bpe;
class pre_tokenizer;

/// Texts longer than this are refused by encode() (invalid_argument), so a
/// request cannot make the tokenizer allocate without bound; real prompts
/// are far below it.
inline constexpr std::size_t tokenizer_max_text_bytes = std::size_t{256} << 20;

class tokenizer {
 public:
  /// Reads tokenizer.* metadata (and general.name). A file with no tokenizer
  /// metadata, or one of a type we do not run, gives a tokenizer that decodes
  /// what it can and refuses encode(). `vocab_size` is the model's (from
  /// token_embd): ids beyond the file's tokens are unused, tokens beyond it
  /// are dropped. Errors: invalid_argument naming a malformed key.
  static expected<tokenizer> from_gguf(const gguf_file& file, std::uint32_t vocab_size);

  /// The same from a vocabulary in memory (tests, gen-model).
  static expected<tokenizer> from_vocab(vocab v, std::uint32_t vocab_size, std::string_view model_name = {});

  /// The byte-level vocabulary of `vocab_size` tokens (>= 260).
  static tokenizer byte_level(std::uint32_t vocab_size);

  /// An empty vocabulary (type "none") that decodes nothing and cannot encode.
  tokenizer();
  tokenizer(const tokenizer&);
  tokenizer& operator=(const tokenizer&);
  tokenizer(tokenizer&&) noexcept;
  tokenizer& operator=(tokenizer&&) noexcept;
  ~tokenizer();

  /// Writes this tokenizer's metadata as the file it came from had it.
  void write_gguf(gguf_writer& w) const;

  /// The GGUF tokenizer.ggml.model string ("llama", "gpt2", ... or "none").
  const std::string& type_name() const noexcept { return vocab_.model; }
  /// tokenizer.ggml.pre ("" when absent).
  const std::string& pre() const noexcept { return vocab_.pre; }
  /// True when encode() works for this vocabulary.
  bool can_encode() const noexcept { return can_encode_; }
  /// Why encode() does not work (empty when it does).
  const std::string& encode_unsupported_reason() const noexcept { return unsupported_reason_; }

  /// Text to ids as llama_tokenize(text, add_special, parse_special): with
  /// `add_special`, BOS first when add_bos() and EOS last when add_eos();
  /// with `parse_special`, control tokens' texts in `text` become those
  /// tokens (otherwise they are plain text). Errors: unsupported naming the
  /// tokenizer type when this vocabulary cannot encode; invalid_argument for
  /// a text above tokenizer_max_text_bytes.
  expected<std::vector<token_id>> encode(std::string_view text, bool add_special,
                                         bool parse_special = false) const;

  /// One token's bytes (llama_token_to_piece): byte tokens give their byte,
  /// normal tokens their text with `▁` as spaces (SentencePiece) or their
  /// bytes (byte-level BPE), user-defined tokens their text; control and
  /// unknown tokens nothing unless `special`; unused or out-of-range ids nothing.
  std::string decode_token(token_id id, bool special = false) const;

  /// Ids to text (llama_detokenize, remove_special = false): the pieces
  /// joined, without the first piece's leading space when add_space_prefix,
  /// and BPE's clean-up of spaces before punctuation where the
  /// pre-tokenizer asks for it.
  std::string decode(const std::vector<token_id>& ids, bool special = false) const;

  std::uint32_t vocab_size() const noexcept { return static_cast<std::uint32_t>(vocab_.tokens.size()); }
  /// A token's text as stored (e.g. "<s>" for chat templates' bos_token);
  /// empty for an out-of-range id.
  const std::string& token_text(token_id id) const noexcept;
  token_kind kind(token_id id) const noexcept;

  std::optional<token_id> bos() const noexcept { return special_.bos; }
  std::optional<token_id> eos() const noexcept { return special_.eos; }
  std::optional<token_id> eot() const noexcept { return special_.eot; }
  std::optional<token_id> eom() const noexcept { return special_.eom; }
  std::optional<token_id> unk() const noexcept { return special_.unk; }
  /// Whether add_special adds BOS / EOS (the file's flags, else llama.cpp's
  /// default for the vocabulary type and pre-tokenizer).
  bool add_bos() const noexcept { return add_bos_; }
  bool add_eos() const noexcept { return add_eos_; }
  bool add_space_prefix() const noexcept { return add_space_prefix_; }

  /// True for every token that ends generation in llama.cpp (llama_vocab_is_eog).
  bool is_eog(token_id id) const noexcept;
  /// Those tokens, ascending.
  const std::vector<token_id>& eog_ids() const noexcept { return eog_; }

  /// tokenizer.chat_template, when the file has one.
  const std::optional<std::string>& chat_template() const noexcept { return vocab_.chat_template; }

 private:
  expected<void> init(std::string_view model_name);
  void apply_type_defaults();
  void detect_byte_level();
  expected<void> encode_fragment(std::string_view text, bool prefix_space, std::vector<token_id>& out) const;
  std::string piece(token_id id, bool special) const;

  vocab vocab_;                          // as stored, tokens padded to the model's vocab
  std::vector<std::uint32_t> attrs_;     // llama.cpp token attributes
  special_token_ids special_;            // resolved ids
  std::vector<token_id> eog_;
  std::vector<token_id> partition_order_;
  bool add_bos_ = false, add_eos_ = false, add_space_prefix_ = false, clean_spaces_ = false;
  bool can_encode_ = false;
  bool byte_level_ = false;
  std::string unsupported_reason_ = "tokenizer type 'none' is not supported for text prompts";
  std::shared_ptr<const spm_tokenizer> spm_;  // immutable once built: shared by copies
  std::shared_ptr<const bpe> bpe_;
  std::shared_ptr<const pre_tokenizer> pre_tokenizer_;
};

}  // namespace exa::model
