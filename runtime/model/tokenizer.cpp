#include "model/tokenizer.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "common/assert.hpp"
#include "model/bpe.hpp"
#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"
#include "model/pre_tokenizer.hpp"
#include "model/special_tokens.hpp"
#include "model/spm_tokenizer.hpp"
#include "model/utf8.hpp"

namespace exa::model {

namespace {

constexpr std::string_view spm_space = "\xE2\x96\x81";  // U+2581, SentencePiece's space
constexpr token_id unk_id = 0;
constexpr token_id bos_id = 1;
constexpr token_id eos_id = 2;
constexpr token_id first_byte_id = 3;
constexpr token_id space_id = 259;
constexpr std::uint32_t byte_level_min_vocab = 260;

std::string byte_token_name(unsigned b) { return fmt::format("<0x{:02X}>", b); }

int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The byte of a byte token: llama.cpp reads the two characters after "<0x"
// as hex (strtol); anything else gives nothing here.
std::optional<char> parse_byte_token(std::string_view s) noexcept {
  if (s.size() < 5 || !s.starts_with("<0x")) return std::nullopt;
  const int hi = hex_value(s[3]);
  const int lo = hex_value(s[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<char>(hi * 16 + lo);
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  std::size_t pos = 0;
  for (std::size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(s, pos, hit - pos);
    out += to;
  }
  out.append(s, pos);
  s.swap(out);
}

// llama_decode_text: every code point of a byte-level token back to its
// byte; one that maps to no byte is shown as llama.cpp shows it.
std::string decode_byte_level_text(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto c0 = static_cast<unsigned char>(text[i]);
    const std::size_t n = c0 < 0x80 ? 1 : (c0 >> 5) == 0x6 ? 2 : (c0 >> 4) == 0xE ? 3 : (c0 >> 3) == 0x1E ? 4 : 1;
    const std::string_view cp = std::string_view(text).substr(i, n);
    i += cp.size();
    if (auto b = gpt2_byte_decode(cp); b && b->size() == 1) {
      out += *b;
      continue;
    }
    out += "[UNK_BYTE_0x";
    for (char c : cp) out += fmt::format("{:02x}", static_cast<unsigned char>(c));
    out += text + "]";
  }
  return out;
}

// llama.cpp's clean_up_tokenization_spaces for BPE vocabularies, three
// passes over the text in place, the first character always kept:
//   1. no space before ? ! . ,
//   2. " ' " becomes "'" (the space after it is overwritten with NUL, which
//      the next character's look-back then sees, as in llama.cpp);
//   3. " 's", " 'm", " 're", " 've" lose their space (" 't", " 'd", " 'll" keep it).
std::string clean_spaces(std::string text) {
  std::size_t total = text.size();
  const std::size_t total1 = total;
  total = total ? 1 : 0;
  for (std::size_t i = 1; i < total1; ++i) {
    const char x = text[i];
    if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) --total;
    text[total++] = x;
  }
  const std::size_t total2 = total;
  total = total ? 1 : 0;
  for (std::size_t i = 1; i < total2; ++i) {
    const char x = text[i];
    if (x == '\'' && i + 1 < total2 && text[i - 1] == ' ' && text[i + 1] == ' ') {
      --total;
      text[++i] = '\0';
    }
    text[total++] = x;
  }
  const std::size_t total3 = total;
  total = total ? 1 : 0;
  for (std::size_t i = 1; i < total3; ++i) {
    const char x = text[i];
    if (text[i - 1] == ' ' && x == '\'' && i + 1 < total3) {
      const char x1 = text[i + 1];
      if (x1 == 's' || x1 == 'm') {
        --total;
      } else if (x1 != 't' && x1 != 'd' && i + 2 < total3) {
        const char x2 = text[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) --total;
      }
    }
    text[total++] = x;
  }
  text.resize(total);
  return text;
}

std::unexpected<error> invalid(std::string message) {
  return make_error(errc::invalid_argument, std::move(message));
}


}  // namespace

tokenizer::tokenizer() = default;
tokenizer::tokenizer(const tokenizer&) = default;
tokenizer& tokenizer::operator=(const tokenizer&) = default;
tokenizer::tokenizer(tokenizer&&) noexcept = default;
tokenizer& tokenizer::operator=(tokenizer&&) noexcept = default;
tokenizer::~tokenizer() = default;

expected<tokenizer> tokenizer::from_gguf(const gguf_file& file, std::uint32_t vocab_size) {
  auto v = vocab::from_gguf(file);
  if (!v) return std::unexpected(v.error());
  std::string name;
  if (file.find("general.name") != nullptr) {
    if (auto n = file.get_string("general.name")) name = std::move(*n);
  }
  return from_vocab(std::move(*v), vocab_size, name);
}

expected<tokenizer> tokenizer::from_vocab(vocab v, std::uint32_t vocab_size, std::string_view model_name) {
  for (const special_id_key& k : special_id_keys) {
    const auto& id = v.ids.*k.member;
    if (id && (*id < 0 || static_cast<std::uint32_t>(*id) >= vocab_size)) {
      return invalid(fmt::format("{} = {} is out of range for vocabulary size {}", k.key, *id, vocab_size));
    }
  }
  // Sized by the model's vocabulary whatever the file's arrays hold, so every
  // id the model can produce indexes in range; ids without a token are unused.
  const std::size_t listed = std::min<std::size_t>(v.tokens.size(), vocab_size);
  const bool typed = !v.kinds.empty();
  v.tokens.resize(vocab_size);
  v.scores.resize(vocab_size, 0.0f);
  v.kinds.resize(vocab_size, token_kind::unused);
  for (std::size_t i = 0; i < listed; ++i) {
    if (!typed) v.kinds[i] = token_kind::normal;
    // llama.cpp renames an empty token rather than map "" to it.
    if (v.tokens[i].empty()) v.tokens[i] = fmt::format("[EMPTY_{}]", i);
  }
  tokenizer t;
  t.vocab_ = std::move(v);
  if (auto r = t.init(model_name); !r) return std::unexpected(r.error());
  return t;
}

// llama.cpp's defaults for what the file does not say (load(): per type,
// then per pre-tokenizer for BPE), before the file's own keys.
void tokenizer::apply_type_defaults() {
  const auto n = static_cast<token_id>(vocab_.tokens.size());
  auto default_id = [n](token_id id) -> std::optional<token_id> {
    return id < n ? std::optional<token_id>(id) : std::nullopt;
  };
  special_ = {};
  if (vocab_.model == "llama") {
    special_.bos = default_id(1);
    special_.eos = default_id(2);
    special_.unk = default_id(0);
    add_space_prefix_ = true;
    add_bos_ = true;
  } else if (vocab_.model == "gpt2") {
    special_.bos = default_id(11);
    special_.eos = default_id(11);
    if (vocab_.pre == "glm4" || vocab_.pre == "chatglm-bpe") special_.bos.reset();
    clean_spaces_ = true;
  }
  for (const special_id_key& k : special_id_keys) {
    if (const auto& id = vocab_.ids.*k.member) special_.*k.member = *id;
  }
}

expected<void> tokenizer::init(std::string_view model_name) {
  attrs_.resize(vocab_.kinds.size());
  for (std::size_t i = 0; i < attrs_.size(); ++i) attrs_[i] = attr_of(vocab_.kinds[i]);
  apply_type_defaults();
  can_encode_ = false;
  unsupported_reason_.clear();
  if (vocab_.model == "llama") {
    spm_ = std::make_shared<const spm_tokenizer>(vocab_.tokens, vocab_.scores, special_.unk);
    can_encode_ = true;
  } else if (vocab_.model == "gpt2") {
    auto pre = pre_tokenizer::create(vocab_.pre);
    if (pre) {
      add_bos_ = pre->traits().add_bos;
      clean_spaces_ = pre->traits().clean_spaces;
      auto b = bpe::create(vocab_.tokens, vocab_.merges, pre->traits().ignore_merges);
      if (!b) return std::unexpected(b.error());
      bpe_ = std::make_shared<const bpe>(std::move(*b));
      pre_tokenizer_ = std::make_shared<const pre_tokenizer>(std::move(*pre));
      can_encode_ = true;
    } else {
      unsupported_reason_ = pre.error().message;
    }
  }
  if (!can_encode_ && unsupported_reason_.empty()) {
    unsupported_reason_ = fmt::format("tokenizer type '{}' is not supported for text prompts; "
                                      "pass token ids (--prompt-ids)",
                                      vocab_.model);
  }
  if (vocab_.add_space_prefix) add_space_prefix_ = *vocab_.add_space_prefix;
  if (vocab_.add_bos) add_bos_ = *vocab_.add_bos;
  if (vocab_.add_eos) add_eos_ = *vocab_.add_eos;
  special_tokens s = resolve_special_tokens(vocab_.tokens, attrs_, special_, model_name);
  special_ = s.ids;
  eog_ = std::move(s.eog);
  partition_order_ = std::move(s.partition_order);
  detect_byte_level();
  return {};
}

void tokenizer::detect_byte_level() {
  byte_level_ = false;
  const auto& tokens = vocab_.tokens;
  const auto& kinds = vocab_.kinds;
  if (vocab_.model != "llama" || add_space_prefix_ || tokens.size() < byte_level_min_vocab) return;
  if (tokens[unk_id] != "<unk>" || tokens[bos_id] != "<s>" || tokens[eos_id] != "</s>") return;
  for (unsigned b = 0; b < 256; ++b) {
    const auto id = static_cast<std::size_t>(first_byte_id) + b;
    if (kinds[id] != token_kind::byte || tokens[id] != byte_token_name(b)) return;
  }
  if (tokens[space_id] != spm_space || kinds[space_id] != token_kind::normal) return;
  for (std::size_t id = byte_level_min_vocab; id < kinds.size(); ++id) {
    if (kinds[id] != token_kind::unused) return;
  }
  byte_level_ = true;
}

tokenizer tokenizer::byte_level(std::uint32_t vocab_size) {
  EXA_ASSERT_MSG(vocab_size >= byte_level_min_vocab, "byte-level vocabulary needs 260 tokens");
  vocab v;
  v.model = "llama";
  v.tokens.reserve(vocab_size);
  v.kinds.reserve(vocab_size);
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.kinds = {token_kind::unknown, token_kind::control, token_kind::control};
  for (unsigned b = 0; b < 256; ++b) {
    v.tokens.push_back(byte_token_name(b));
    v.kinds.push_back(token_kind::byte);
  }
  v.tokens.emplace_back(spm_space);
  v.kinds.push_back(token_kind::normal);
  for (std::uint32_t id = byte_level_min_vocab; id < vocab_size; ++id) {
    v.tokens.push_back(fmt::format("<extra_{}>", id));
    v.kinds.push_back(token_kind::unused);
  }
  v.scores.assign(vocab_size, 0.0f);
  v.ids.unk = unk_id;
  v.ids.bos = bos_id;
  v.ids.eos = eos_id;
  v.add_bos = true;
  // Off so that llama.cpp tokenizes a prompt exactly as encode() does.
  v.add_space_prefix = false;
  auto t = from_vocab(std::move(v), vocab_size);
  EXA_ASSERT(t.has_value() && t->byte_level_);
  return std::move(*t);
}

void tokenizer::write_gguf(gguf_writer& w) const { vocab_.write_gguf(w); }

expected<void> tokenizer::encode_fragment(std::string_view text, bool prefix_space,
                                          std::vector<token_id>& out) const {
  // Only for valid UTF-8: SentencePiece cuts text at the lengths lead bytes
  // announce, so a stray lead byte before a space swallows part of the `▁`
  // and llama.cpp then emits its bytes, not the `▁` token.
  if (byte_level_ && is_valid_utf8(text)) {
    for (char c : text) {
      const auto b = static_cast<unsigned char>(c);
      out.push_back(b == ' ' ? space_id : first_byte_id + static_cast<token_id>(b));
    }
    return {};
  }
  if (spm_) {
    std::string escaped;
    escaped.reserve(text.size() + 1);
    if (prefix_space) escaped += ' ';
    escaped += text;
    replace_all(escaped, " ", spm_space);
    return spm_->encode(escaped, out);
  }
  EXA_ASSERT(bpe_ && pre_tokenizer_);
  std::string scratch;
  auto pieces = pre_tokenizer_->split(text, scratch);
  if (!pieces) return std::unexpected(pieces.error());
  // Long texts repeat their words: a cache for this call makes the merges
  // 2-5x cheaper there, and short prompts skip its allocation.
  constexpr std::size_t cache_min_text_bytes = 4096;
  std::optional<bpe_piece_cache> cache;
  if (text.size() >= cache_min_text_bytes) cache.emplace();
  for (std::string_view piece : *pieces) bpe_->encode_piece(piece, out, cache ? &*cache : nullptr);
  return {};
}

expected<std::vector<token_id>> tokenizer::encode(std::string_view text, bool add_special,
                                                  bool parse_special) const {
  if (!can_encode_) return make_error(errc::unsupported, unsupported_reason_);
  if (text.size() > tokenizer_max_text_bytes) {
    return invalid(fmt::format("text of {} bytes is above the tokenizer's limit of {} bytes", text.size(),
                               tokenizer_max_text_bytes));
  }
  std::vector<token_id> ids;
  ids.reserve(text.size() / 2 + 2);
  if (add_special && add_bos_ && special_.bos) ids.push_back(*special_.bos);
  // SentencePiece puts a space before text that starts the prompt or follows
  // a special token, when add_space_prefix says so.
  bool prev_special = true;
  for (const text_fragment& f : partition_special(text, partition_order_, vocab_.tokens, attrs_, parse_special)) {
    if (f.token >= 0) {
      ids.push_back(f.token);
      prev_special = true;
      continue;
    }
    if (auto r = encode_fragment(f.text, spm_ && add_space_prefix_ && prev_special, ids); !r) {
      return std::unexpected(r.error());
    }
    prev_special = false;
  }
  if (add_special && add_eos_ && special_.eos) ids.push_back(*special_.eos);
  return ids;
}

std::string tokenizer::piece(token_id id, bool special) const {
  if (id < 0 || static_cast<std::size_t>(id) >= vocab_.tokens.size()) return {};
  const auto i = static_cast<std::size_t>(id);
  const std::uint32_t attr = attrs_[i];
  const std::string& text = vocab_.tokens[i];
  constexpr std::uint32_t hidden = attr_unknown | attr_control;
  if (attr & hidden) return special ? text : std::string{};
  if (attr & attr_user_defined) return text;
  if (attr & attr_normal) {
    if (vocab_.model == "gpt2") return decode_byte_level_text(text);
    std::string s = text;
    replace_all(s, spm_space, " ");
    return s;
  }
  if (attr & attr_byte) {
    auto b = parse_byte_token(text);
    return b ? std::string(1, *b) : std::string{};
  }
  return {};
}

std::string tokenizer::decode_token(token_id id, bool special) const { return piece(id, special); }

std::string tokenizer::decode(const std::vector<token_id>& ids, bool special) const {
  std::string out;
  bool strip_space = add_space_prefix_;
  for (token_id id : ids) {
    std::string p = piece(id, special);
    // llama.cpp strips one leading space of the first token only, even when
    // that token decodes to nothing (a hidden BOS ends the stripping).
    if (strip_space && !p.empty() && p.front() == ' ') p.erase(0, 1);
    strip_space = false;
    out += p;
  }
  if (clean_spaces_) out = clean_spaces(std::move(out));
  return out;
}

const std::string& tokenizer::token_text(token_id id) const noexcept {
  static const std::string none;
  if (id < 0 || static_cast<std::size_t>(id) >= vocab_.tokens.size()) return none;
  return vocab_.tokens[static_cast<std::size_t>(id)];
}

token_kind tokenizer::kind(token_id id) const noexcept {
  if (id < 0 || static_cast<std::size_t>(id) >= vocab_.kinds.size()) return token_kind::unused;
  return vocab_.kinds[static_cast<std::size_t>(id)];
}

bool tokenizer::is_eog(token_id id) const noexcept {
  return std::binary_search(eog_.begin(), eog_.end(), id);
}

}  // namespace exa::model
