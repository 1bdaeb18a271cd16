#pragma once
// The pre-tokenizer of byte-level BPE vocabularies: the regular expressions
// that cut text into pieces before BPE merges run inside each piece, chosen by
// the file's `tokenizer.ggml.pre` exactly as llama.cpp chooses them
// (src/llama-vocab.cpp, llm_tokenizer_bpe), and applied as llama.cpp's
// unicode_regex_split applies them: each expression splits every piece the
// previous one produced, and text between two matches is a piece of its own.
//
// The expressions run on PCRE2 with UTF and Unicode properties (PCRE2_UCP).
// llama.cpp runs the GPT-2 and Llama 3 expressions through hand-written code
// and the others through std::regex over a text whose non-ASCII code points
// are "collapsed" to one byte per Unicode category; both come down to the same
// Unicode categories PCRE2 uses, with one difference we remove here: `\s` is
// rewritten to llama.cpp's whitespace set (the Unicode White_Space property),
// since PCRE2's `\s` also matches U+180E. What still differs is confined to
// code points whose category changed between PCRE2's Unicode tables and
// llama.cpp's (characters assigned in recent Unicode versions).
//
// Invalid UTF-8 is handled as llama.cpp handles it: every byte that does not
// start a well-formed sequence by llama.cpp's decoder becomes U+FFFD, and
// over-long encodings are decoded (C0 80 is NUL). Where llama.cpp would keep a
// UTF-16 surrogate or throw (a code point above U+10FFFF), we write U+FFFD.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"

namespace exa::model {

/// What llama.cpp derives from a `tokenizer.ggml.pre` name besides the
/// expressions (defaults the file's own keys may override).
struct pre_tokenizer_traits {
  /// A piece that is itself a token is emitted whole, without merges.
  bool ignore_merges = false;
  /// BOS is added unless tokenizer.ggml.add_bos_token says otherwise.
  bool add_bos = false;
  /// Decoding cleans up spaces before punctuation (clean_up_tokenization_spaces).
  bool clean_spaces = true;
};

class pre_tokenizer {
 public:
  /// The pre-tokenizer llama.cpp uses for `pre_name` (`tokenizer.ggml.pre`;
  /// empty when the file has none, which llama.cpp treats as "default").
  /// Errors: unsupported naming a pre-tokenizer llama.cpp knows but we do not
  /// run, or one llama.cpp does not know either.
  static expected<pre_tokenizer> create(std::string_view pre_name);

  /// A pre-tokenizer from explicit expressions (tests; vocabularies we build).
  /// Errors: invalid_argument with PCRE2's message and offset.
  static expected<pre_tokenizer> from_regexes(std::vector<std::string> regexes,
                                              pre_tokenizer_traits traits = {});

  pre_tokenizer(pre_tokenizer&&) noexcept;
  pre_tokenizer& operator=(pre_tokenizer&&) noexcept;
  ~pre_tokenizer();

  /// Splits `text` into pieces (raw bytes, not yet byte-mapped), in order;
  /// they concatenate to `text`, or to its repaired form when `text` is not
  /// valid UTF-8: then the pieces view `scratch`, which holds the repair.
  /// Safe to call from several threads at once (each call has its own match
  /// data). Errors: overloaded when a piece is beyond the matcher's bounds
  /// (pre_tokenizer.cpp): of the shipped expressions only tekken's and
  /// gpt-4o's reach them, on a single word of 8 MiB (4 MiB still splits).
  expected<std::vector<std::string_view>> split(std::string_view text, std::string& scratch) const;

  /// The same, as owned strings (tests, tools).
  expected<std::vector<std::string>> split_copy(std::string_view text) const;

  const pre_tokenizer_traits& traits() const noexcept { return traits_; }
  /// The expressions as llama.cpp writes them (before our `\s` rewrite).
  const std::vector<std::string>& regexes() const noexcept { return regexes_; }

 private:
  struct compiled;
  pre_tokenizer() = default;

  std::vector<std::string> regexes_;
  std::vector<std::unique_ptr<compiled>> compiled_;
  pre_tokenizer_traits traits_;
};

/// Repairs `text` the way llama.cpp's decoder reads it (see the file comment).
/// Returns false and leaves `out` untouched when `text` was already valid and
/// needs no repair.
bool repair_utf8_like_llama(std::string_view text, std::string& out);

}  // namespace exa::model
