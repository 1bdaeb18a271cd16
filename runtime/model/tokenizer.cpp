#include "model/tokenizer.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "common/assert.hpp"
#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"

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

// "<0xHH>" -> the byte; nullopt for anything else.
std::optional<char> parse_byte_token(std::string_view s) noexcept {
  if (s.size() != 6 || !s.starts_with("<0x") || s[5] != '>') return std::nullopt;
  const int hi = hex_value(s[3]);
  const int lo = hex_value(s[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<char>(hi * 16 + lo);
}

std::string replace_spm_spaces(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    if (s.substr(i).starts_with(spm_space)) {
      out += ' ';
      i += spm_space.size();
    } else {
      out += s[i++];
    }
  }
  return out;
}

// GPT-2's byte-level BPE stores each byte as a printable code point: bytes
// that are printable Latin-1 map to themselves, the other 68 to U+0100.. in
// byte order. This is the inverse: code point -> byte, -1 where none.
constexpr std::array<std::int16_t, 324> make_gpt2_decode_table() {
  std::array<std::int16_t, 324> t{};
  for (auto& x : t) x = -1;
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    t[static_cast<std::size_t>(printable ? b : next++)] = static_cast<std::int16_t>(b);
  }
  return t;
}
constexpr auto gpt2_decode_table = make_gpt2_decode_table();

// Decodes one GPT-2 token text into bytes; nullopt when it is not valid
// byte-level text (then the caller shows the text as it is).
std::optional<std::string> gpt2_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const auto c0 = static_cast<unsigned char>(s[i]);
    unsigned cp = 0;
    if (c0 < 0x80) {
      cp = c0;
      i += 1;
    } else if ((c0 & 0xE0) == 0xC0 && i + 1 < s.size()) {
      // Every code point of the table is below U+0800: two bytes at most.
      cp = (c0 & 0x1Fu) << 6 | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return std::nullopt;
    }
    if (cp >= gpt2_decode_table.size() || gpt2_decode_table[cp] < 0) return std::nullopt;
    out += static_cast<char>(gpt2_decode_table[cp]);
  }
  return out;
}

token_kind kind_from_int(std::int64_t v) noexcept {
  // 0 is llama.cpp's "undefined"; anything unknown is shown as plain text.
  if (v >= 1 && v <= 6) return static_cast<token_kind>(v);
  return token_kind::normal;
}

std::unexpected<error> invalid(std::string message) {
  return make_error(errc::invalid_argument, std::move(message));
}

// An optional array key; nullptr when absent.
expected<const gguf_array*> optional_array(const gguf_file& f, std::string_view key) {
  if (f.find(key) == nullptr) return nullptr;
  return f.get_array(key);
}

expected<std::optional<token_id>> read_special_id(const gguf_file& f, std::string_view key,
                                                  std::uint32_t vocab_size) {
  if (f.find(key) == nullptr) return std::nullopt;
  auto v = f.get_int(key);
  if (!v) return std::unexpected(v.error());
  if (*v < 0 || *v >= static_cast<std::int64_t>(vocab_size)) {
    return invalid(fmt::format("{} = {} is out of range for vocabulary size {}", key, *v,
                               vocab_size));
  }
  return static_cast<token_id>(*v);
}

}  // namespace

expected<tokenizer> tokenizer::from_gguf(const gguf_file& file, std::uint32_t vocab_size) {
  tokenizer t;
  if (file.find("tokenizer.ggml.model") != nullptr) {
    auto m = file.get_string("tokenizer.ggml.model");
    if (!m) return std::unexpected(m.error());
    t.type_name_ = std::move(*m);
  }
  // Sized by the model's vocabulary whatever the file's arrays hold, so every
  // id the model can produce indexes in range; ids without a token are unused.
  t.tokens_.assign(vocab_size, std::string{});
  t.scores_.assign(vocab_size, 0.0f);
  t.kinds_.assign(vocab_size, token_kind::unused);
  if (auto r = t.read_vocab(file); !r) return std::unexpected(r.error());
  auto bos = read_special_id(file, "tokenizer.ggml.bos_token_id", vocab_size);
  if (!bos) return std::unexpected(bos.error());
  auto eos = read_special_id(file, "tokenizer.ggml.eos_token_id", vocab_size);
  if (!eos) return std::unexpected(eos.error());
  auto unk = read_special_id(file, "tokenizer.ggml.unknown_token_id", vocab_size);
  if (!unk) return std::unexpected(unk.error());
  t.bos_ = *bos;
  t.eos_ = *eos;
  t.unk_ = *unk;
  t.detect_byte_level();
  return t;
}

expected<void> tokenizer::read_vocab(const gguf_file& file) {
  const std::size_t n = tokens_.size();
  auto tokens = optional_array(file, "tokenizer.ggml.tokens");
  if (!tokens) return std::unexpected(tokens.error());
  if (*tokens != nullptr) {
    if ((*tokens)->elem_type != gguf_value_type::string) {
      return invalid("tokenizer.ggml.tokens must be an array of strings");
    }
    const auto& s = (*tokens)->strings;
    for (std::size_t i = 0; i < std::min(n, s.size()); ++i) {
      tokens_[i] = s[i];
      kinds_[i] = token_kind::normal;
    }
  }
  auto scores = optional_array(file, "tokenizer.ggml.scores");
  if (!scores) return std::unexpected(scores.error());
  if (*scores != nullptr) {
    const auto& f = (*scores)->floats;
    if (f.size() != (*scores)->size()) {
      return invalid("tokenizer.ggml.scores must be an array of floats");
    }
    for (std::size_t i = 0; i < std::min(n, f.size()); ++i) scores_[i] = static_cast<float>(f[i]);
  }
  auto types = optional_array(file, "tokenizer.ggml.token_type");
  if (!types) return std::unexpected(types.error());
  if (*types != nullptr) {
    const auto& v = (*types)->ints;
    if (v.size() != (*types)->size()) {
      return invalid("tokenizer.ggml.token_type must be an array of integers");
    }
    for (std::size_t i = 0; i < std::min(n, v.size()); ++i) kinds_[i] = kind_from_int(v[i]);
  }
  return {};
}

void tokenizer::detect_byte_level() {
  byte_level_ = false;
  if (type_name_ != "llama" || tokens_.size() < byte_level_min_vocab) return;
  for (unsigned b = 0; b < 256; ++b) {
    const auto id = static_cast<std::size_t>(first_byte_id) + b;
    if (kinds_[id] != token_kind::byte || tokens_[id] != byte_token_name(b)) return;
  }
  if (tokens_[space_id] != spm_space || kinds_[space_id] != token_kind::normal) return;
  for (std::size_t id = byte_level_min_vocab; id < kinds_.size(); ++id) {
    if (kinds_[id] != token_kind::unused) return;
  }
  for (unsigned b = 0; b < 256; ++b) byte_token_[b] = first_byte_id + static_cast<token_id>(b);
  space_token_ = space_id;
  byte_level_ = true;
}

tokenizer tokenizer::byte_level(std::uint32_t vocab_size) {
  EXA_ASSERT_MSG(vocab_size >= byte_level_min_vocab, "byte-level vocabulary needs 260 tokens");
  tokenizer t;
  t.type_name_ = "llama";
  t.tokens_.reserve(vocab_size);
  t.kinds_.reserve(vocab_size);
  t.tokens_ = {"<unk>", "<s>", "</s>"};
  t.kinds_ = {token_kind::unknown, token_kind::control, token_kind::control};
  for (unsigned b = 0; b < 256; ++b) {
    t.tokens_.push_back(byte_token_name(b));
    t.kinds_.push_back(token_kind::byte);
  }
  t.tokens_.emplace_back(spm_space);
  t.kinds_.push_back(token_kind::normal);
  for (std::uint32_t id = byte_level_min_vocab; id < vocab_size; ++id) {
    t.tokens_.push_back(fmt::format("<extra_{}>", id));
    t.kinds_.push_back(token_kind::unused);
  }
  t.scores_.assign(vocab_size, 0.0f);
  t.unk_ = unk_id;
  t.bos_ = bos_id;
  t.eos_ = eos_id;
  t.detect_byte_level();
  EXA_ASSERT(t.byte_level_);
  return t;
}

void tokenizer::write_gguf(gguf_writer& w) const {
  std::vector<std::int32_t> kinds;
  kinds.reserve(kinds_.size());
  for (token_kind k : kinds_) kinds.push_back(static_cast<std::int32_t>(k));
  w.add_string("tokenizer.ggml.model", type_name_);
  w.add_string_array("tokenizer.ggml.tokens", tokens_);
  w.add_f32_array("tokenizer.ggml.scores", scores_);
  w.add_i32_array("tokenizer.ggml.token_type", std::move(kinds));
  if (bos_) w.add_u32("tokenizer.ggml.bos_token_id", static_cast<std::uint32_t>(*bos_));
  if (eos_) w.add_u32("tokenizer.ggml.eos_token_id", static_cast<std::uint32_t>(*eos_));
  if (unk_) w.add_u32("tokenizer.ggml.unknown_token_id", static_cast<std::uint32_t>(*unk_));
  w.add_bool("tokenizer.ggml.add_bos_token", true);
  // Off so that llama.cpp tokenizes a prompt exactly as encode() does.
  w.add_bool("tokenizer.ggml.add_space_prefix", false);
}

expected<std::vector<token_id>> tokenizer::encode(std::string_view text, bool add_bos) const {
  if (!byte_level_) {
    return make_error(errc::unsupported,
                      fmt::format("tokenizer type '{}' is not supported for text prompts yet; "
                                  "pass token ids (--prompt-ids)",
                                  type_name_));
  }
  std::vector<token_id> ids;
  ids.reserve(text.size() + 1);
  if (add_bos && bos_) ids.push_back(*bos_);
  for (char c : text) {
    const auto b = static_cast<unsigned char>(c);
    ids.push_back(b == ' ' ? space_token_ : byte_token_[b]);
  }
  return ids;
}

std::string tokenizer::decode_token(token_id id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= tokens_.size()) return {};
  const std::string& text = tokens_[static_cast<std::size_t>(id)];
  switch (kinds_[static_cast<std::size_t>(id)]) {
    case token_kind::byte: {
      auto b = parse_byte_token(text);
      return b ? std::string(1, *b) : std::string{};
    }
    case token_kind::normal:
      if (type_name_ == "gpt2") {
        auto bytes = gpt2_decode(text);
        return bytes ? std::move(*bytes) : text;
      }
      return replace_spm_spaces(text);
    case token_kind::user_defined: return text;  // stored verbatim by convention
    case token_kind::unknown:
    case token_kind::control:
    case token_kind::unused: return {};
  }
  return {};
}

std::string tokenizer::decode(const std::vector<token_id>& ids) const {
  std::string out;
  for (token_id id : ids) out += decode_token(id);
  return out;
}

}  // namespace exa::model
