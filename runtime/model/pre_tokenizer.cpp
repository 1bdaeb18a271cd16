#include "model/pre_tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <utility>

#include <fmt/format.h>

#include "common/assert.hpp"

namespace exa::model {

namespace {

// The expressions, as llama.cpp's llm_tokenizer_bpe writes them.
constexpr const char* gpt2_re =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
constexpr const char* llama3_re =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* qwen2_re =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* qwen35_re =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* tekken_re =
    R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* gpt4o_re =
    R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

enum class family { deflt, gpt2, llama3, qwen2, qwen35, starcoder, tekken, gpt4o };

std::vector<std::string> family_regexes(family f) {
  switch (f) {
    case family::deflt:
      return {R"([\p{P}\$\+<=>\^~\|]+)", gpt2_re, R"(\p{N}+)", "[0-9][0-9][0-9]"};
    case family::gpt2: return {gpt2_re};
    case family::llama3: return {llama3_re};
    case family::qwen2: return {qwen2_re};
    case family::qwen35: return {qwen35_re};
    case family::starcoder: return {R"(\p{N})", gpt2_re};
    case family::tekken: return {tekken_re};
    case family::gpt4o: return {gpt4o_re};
  }
  EXA_ASSERT(false);
  return {};
}

struct name_entry {
  std::string_view name;
  family fam;
  pre_tokenizer_traits traits;
};

constexpr pre_tokenizer_traits plain{false, false, true};
constexpr pre_tokenizer_traits no_clean{false, false, false};
constexpr pre_tokenizer_traits llama3_traits{true, true, true};
constexpr pre_tokenizer_traits tekken_traits{true, true, false};

// llama.cpp's tokenizer.ggml.pre names (llama_vocab::impl::load) for the
// expression sets above, with the flags its branches set.
constexpr std::array<name_entry, 50> known_names{{
    {"default", family::deflt, plain},
    {"llama3", family::llama3, llama3_traits},
    {"llama-v3", family::llama3, llama3_traits},
    {"llama-bpe", family::llama3, llama3_traits},
    {"falcon3", family::llama3, llama3_traits},
    {"falcon-h1", family::llama3, llama3_traits},
    {"pixtral", family::llama3, llama3_traits},
    {"midm-2.0", family::llama3, llama3_traits},
    {"lfm2", family::llama3, llama3_traits},
    {"jina-v5-nano", family::llama3, llama3_traits},
    {"dbrx", family::llama3, plain},
    {"smaug-bpe", family::llama3, plain},
    {"qwen2", family::qwen2, no_clean},
    {"deepseek-r1-qwen", family::qwen2, no_clean},
    {"kormo", family::qwen2, no_clean},
    {"f2llmv2", family::qwen2, no_clean},
    {"megrez", family::qwen2, plain},
    {"stablelm2", family::qwen2, plain},
    {"hunyuan", family::qwen2, no_clean},
    {"solar-open", family::qwen2, no_clean},
    {"grok-2", family::qwen2, no_clean},
    {"qwen35", family::qwen35, no_clean},
    {"starcoder", family::starcoder, plain},
    {"refact", family::starcoder, plain},
    {"command-r", family::starcoder, no_clean},
    {"smollm", family::starcoder, no_clean},
    {"codeshell", family::starcoder, plain},
    {"exaone", family::starcoder, plain},
    {"minerva-7b", family::starcoder, plain},
    {"mellum2", family::starcoder, plain},
    {"gpt-2", family::gpt2, plain},
    {"phi-2", family::gpt2, plain},
    {"jina-es", family::gpt2, plain},
    {"jina-de", family::gpt2, plain},
    {"gigachat", family::gpt2, plain},
    {"jina-v2-es", family::gpt2, plain},
    {"jina-v2-de", family::gpt2, plain},
    {"a.x-4.0", family::gpt2, plain},
    {"mellum", family::gpt2, plain},
    {"modern-bert", family::gpt2, plain},
    {"exaone4", family::gpt2, plain},
    {"mpt", family::gpt2, plain},
    {"olmo", family::gpt2, plain},
    {"jais", family::gpt2, plain},
    {"trillion", family::gpt2, no_clean},
    {"granite-docling", family::gpt2, no_clean},
    {"tekken", family::tekken, tekken_traits},
    {"gpt-4o", family::gpt4o, no_clean},
    {"llama4", family::gpt4o, no_clean},
    {"minimax-m2", family::gpt4o, no_clean},
}};

// Names llama.cpp knows whose expressions or rules we do not run (yet), so the
// error can say which of the two cases a file is in.
constexpr std::array<std::string_view, 34> llama_only_names{
    "deepseek-llm", "deepseek-coder", "deepseek-v3", "spark2_5", "youtu", "falcon",
    "jais-2", "gemma4", "granite-embed-multi-311m", "sarvam-moe", "jina-v1-en",
    "jina-v2-code", "roberta-bpe", "whitespace", "poro-chat", "glm4", "chatglm-bpe",
    "viking", "bloom", "gpt3-finnish", "exaone-moe", "chameleon", "kanana2", "talkie",
    "granite-embed-multi-97m", "tiny_aya", "cohere2moe", "superbpe", "bailingmoe",
    "bailingmoe2", "llada-moe", "seed-coder", "kimi-k2", "afmoe"};

// llama.cpp's whitespace (Unicode White_Space), as class members. PCRE2's own
// `\s` under UCP adds U+180E, which llama.cpp does not count as whitespace.
constexpr std::string_view ws_members =
    R"(\x{9}-\x{D}\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// Rewrites `\s` and `\S` to llama.cpp's whitespace set. Errors on `\S`
// inside a character class, which no llama.cpp expression uses.
expected<std::string> rewrite_whitespace(std::string_view re) {
  std::string out;
  bool in_class = false;
  std::size_t class_start = 0;  // index just after '[' or "[^"
  for (std::size_t i = 0; i < re.size(); ++i) {
    const char c = re[i];
    if (c == '\\' && i + 1 < re.size()) {
      const char n = re[++i];
      if (n == 's') {
        out += in_class ? std::string(ws_members) : fmt::format("[{}]", ws_members);
      } else if (n == 'S') {
        if (in_class) return make_error(errc::invalid_argument, fmt::format("pre-tokenizer regex '{}': \\S inside a class", re));
        out += fmt::format("[^{}]", ws_members);
      } else {
        out += c;
        out += n;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < re.size() && re[i + 1] == '^') out += re[++i];
      class_start = i + 1;
      continue;
    }
    // A ']' first in a class is a member, not its end.
    if (in_class && c == ']' && i != class_start) in_class = false;
    out += c;
  }
  return out;
}

void append_utf8(std::string& out, std::uint32_t cpt) {
  if (cpt < 0x80) {
    out += static_cast<char>(cpt);
  } else if (cpt < 0x800) {
    out += static_cast<char>(0xC0 | (cpt >> 6));
    out += static_cast<char>(0x80 | (cpt & 0x3F));
  } else if (cpt < 0x10000) {
    out += static_cast<char>(0xE0 | (cpt >> 12));
    out += static_cast<char>(0x80 | ((cpt >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cpt & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cpt >> 18));
    out += static_cast<char>(0x80 | ((cpt >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cpt >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cpt & 0x3F));
  }
}

constexpr std::uint32_t replacement_cpt = 0xFFFD;

// llama.cpp's unicode_cpt_from_utf8 as unicode_cpts_from_utf8 calls it: a
// lead byte with its continuation bytes present gives a code point (no check
// for over-long forms, surrogates or range); anything else consumes one byte
// and gives U+FFFD. Returns the code point and advances `i`.
std::uint32_t llama_decode(std::string_view s, std::size_t& i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const auto cont = [&](std::size_t k) { return k < s.size() && (b(k) & 0xC0) == 0x80; };
  const unsigned char b0 = b(i);
  if (!(b0 & 0x80)) { i += 1; return b0; }
  if ((b0 & 0x40) && !(b0 & 0x20) && cont(i + 1)) {
    const std::uint32_t c = ((b0 & 0x1Fu) << 6) | (b(i + 1) & 0x3Fu);
    i += 2;
    return c;
  }
  if ((b0 & 0x60) == 0x60 && !(b0 & 0x10) && cont(i + 1) && cont(i + 2)) {
    const std::uint32_t c = ((b0 & 0x0Fu) << 12) | ((b(i + 1) & 0x3Fu) << 6) | (b(i + 2) & 0x3Fu);
    i += 3;
    return c;
  }
  if ((b0 & 0x70) == 0x70 && !(b0 & 0x08) && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
    const std::uint32_t c = ((b0 & 0x07u) << 18) | ((b(i + 1) & 0x3Fu) << 12) |
                            ((b(i + 2) & 0x3Fu) << 6) | (b(i + 3) & 0x3Fu);
    i += 4;
    return c;
  }
  i += 1;
  return replacement_cpt;
}

// What we write for a decoded code point: itself, or U+FFFD for what PCRE2
// cannot hold (surrogates, beyond U+10FFFF).
std::uint32_t representable(std::uint32_t c) {
  return (c >= 0xD800 && c <= 0xDFFF) || c > 0x10FFFF ? replacement_cpt : c;
}

}  // namespace

bool repair_utf8_like_llama(std::string_view text, std::string& out) {
  std::string enc;
  std::size_t i = 0;
  // First pass: find the first byte where the repaired text would differ.
  while (i < text.size()) {
    if (static_cast<unsigned char>(text[i]) < 0x80) { ++i; continue; }
    const std::size_t start = i;
    const std::uint32_t c = representable(llama_decode(text, i));
    enc.clear();
    append_utf8(enc, c);
    if (text.substr(start, i - start) != enc) { i = start; break; }
  }
  if (i == text.size()) return false;
  out.assign(text.substr(0, i));
  while (i < text.size()) append_utf8(out, representable(llama_decode(text, i)));
  return true;
}

struct pre_tokenizer::compiled {
  pcre2_code* code = nullptr;
  ~compiled() { pcre2_code_free(code); }
};

pre_tokenizer::pre_tokenizer(pre_tokenizer&&) noexcept = default;
pre_tokenizer& pre_tokenizer::operator=(pre_tokenizer&&) noexcept = default;
pre_tokenizer::~pre_tokenizer() = default;

expected<pre_tokenizer> pre_tokenizer::create(std::string_view pre_name) {
  const std::string_view name = pre_name.empty() ? std::string_view("default") : pre_name;
  for (const auto& e : known_names) {
    if (e.name == name) return from_regexes(family_regexes(e.fam), e.traits);
  }
  if (std::find(llama_only_names.begin(), llama_only_names.end(), name) != llama_only_names.end()) {
    return make_error(errc::unsupported,
                      fmt::format("BPE pre-tokenizer '{}' (tokenizer.ggml.pre) is not supported yet", name));
  }
  return make_error(errc::unsupported,
                    fmt::format("unknown BPE pre-tokenizer '{}' (tokenizer.ggml.pre); llama.cpp refuses it too", name));
}

expected<pre_tokenizer> pre_tokenizer::from_regexes(std::vector<std::string> regexes,
                                                    pre_tokenizer_traits traits) {
  pre_tokenizer p;
  p.traits_ = traits;
  for (const auto& re : regexes) {
    auto rewritten = rewrite_whitespace(re);
    if (!rewritten) return std::unexpected(rewritten.error());
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    // No captures are needed (only the whole match's span), and NO_AUTO_CAPTURE
    // spares the matcher the frames of llama.cpp's capturing groups.
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten->data()), rewritten->size(),
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_NO_AUTO_CAPTURE, &err, &err_offset, nullptr);
    if (code == nullptr) {
      std::array<PCRE2_UCHAR, 256> msg{};
      pcre2_get_error_message(err, msg.data(), msg.size());
      return make_error(errc::invalid_argument,
                        fmt::format("pre-tokenizer regex '{}': {} at offset {}", re,
                                    reinterpret_cast<const char*>(msg.data()), err_offset));
    }
    auto c = std::make_unique<compiled>();
    c->code = code;
    // JIT is a speed-up only: without it (or when it fails) the interpreter runs.
    (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    p.compiled_.push_back(std::move(c));
  }
  p.regexes_ = std::move(regexes);
  return p;
}

namespace {

using span = std::pair<std::size_t, std::size_t>;  // offset, length

// Bounds on what one split() may use when a long piece (a megabyte-long
// run of spaces or letters) outgrows PCRE2's defaults: a JIT stack of up to
// 64 MiB, up to 1 GiB of interpreter frames, and a match limit that grows with
// the text (backtracking over a whitespace run is linear in its length). They
// are set up only when a default is hit, so ordinary texts pay nothing.
constexpr std::size_t jit_stack_max_bytes = std::size_t{64} << 20;
constexpr std::uint32_t heap_limit_kib = 1u << 20;
constexpr std::uint64_t match_limit_base = 10'000'000;
constexpr std::uint64_t match_limit_per_byte = 64;

// Per-call matching resources, created lazily (see above).
struct match_resources {
  std::size_t text_bytes = 0;
  pcre2_match_data* md = nullptr;
  pcre2_match_context* big = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;

  ~match_resources() {
    pcre2_match_data_free(md);
    pcre2_match_context_free(big);
    pcre2_jit_stack_free(jit_stack);
  }
  pcre2_match_context* big_context() {
    if (big == nullptr) {
      big = pcre2_match_context_create(nullptr);
      jit_stack = pcre2_jit_stack_create(32 * 1024, jit_stack_max_bytes, nullptr);
      EXA_ASSERT(big != nullptr && jit_stack != nullptr);
      pcre2_jit_stack_assign(big, nullptr, jit_stack);
      pcre2_set_heap_limit(big, heap_limit_kib);
      const std::uint64_t limit = match_limit_base + match_limit_per_byte * text_bytes;
      pcre2_set_match_limit(big, static_cast<std::uint32_t>(std::min<std::uint64_t>(limit, UINT32_MAX)));
    }
    return big;
  }
};

// One match of `code` in subject[0, len) from `start`.
int match_once(const pcre2_code* code, const char* subject, std::size_t len, std::size_t start,
               match_resources& res) {
  const auto s = reinterpret_cast<PCRE2_SPTR>(subject);
  // pcre2_jit_match skips pcre2_match's checks, which cost on the short
  // pieces that dominate. It fails with PCRE2_ERROR_JIT_BADOPTION when the
  // expression has no JIT code, and the interpreter runs instead.
  int rc = pcre2_jit_match(code, s, len, start, 0, res.md, res.big);
  if ((rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_MATCHLIMIT) && res.big == nullptr) {
    rc = pcre2_jit_match(code, s, len, start, 0, res.md, res.big_context());
  }
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_JIT_BADOPTION) {
    rc = pcre2_match(code, s, len, start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, res.md, res.big_context());
  }
  return rc;
}

// Splits one piece: matches and the text between them, in order, as
// llama.cpp's unicode_regex_split_stl does. The piece is the whole subject,
// so look-arounds do not see past it.
expected<void> split_piece(const pcre2_code* code, std::string_view text, span piece,
                           match_resources& res, std::vector<span>& out) {
  const char* subject = text.data() + piece.first;
  const std::size_t len = piece.second;
  std::size_t pos = 0;
  std::size_t emitted = 0;
  while (pos < len) {
    const int rc = match_once(code, subject, len, pos, res);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      std::array<PCRE2_UCHAR, 256> msg{};
      pcre2_get_error_message(rc, msg.data(), msg.size());
      return make_error(errc::overloaded, fmt::format("pre-tokenizer: a piece of {} bytes is beyond the regex matcher's limits ({})",
                                                      len, reinterpret_cast<const char*>(msg.data())));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(res.md);
    const std::size_t ms = ov[0], me = ov[1];
    if (me == ms) {  // An empty match splits nothing; step over one character.
      pos = ms + 1;
      while (pos < len && (static_cast<unsigned char>(subject[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (ms > emitted) out.emplace_back(piece.first + emitted, ms - emitted);
    out.emplace_back(piece.first + ms, me - ms);
    emitted = pos = me;
  }
  if (emitted < len) out.emplace_back(piece.first + emitted, len - emitted);
  return {};
}

}  // namespace

expected<std::vector<std::string_view>> pre_tokenizer::split(std::string_view text, std::string& scratch) const {
  if (repair_utf8_like_llama(text, scratch)) text = scratch;
  std::vector<span> spans;
  if (!text.empty()) spans.emplace_back(0, text.size());
  std::vector<span> next;
  for (const auto& c : compiled_) {
    match_resources res;
    res.text_bytes = text.size();
    res.md = pcre2_match_data_create_from_pattern(c->code, nullptr);
    EXA_ASSERT(res.md != nullptr);
    next.clear();
    next.reserve(spans.size() + text.size() / 4);
    for (const span& s : spans) {
      if (auto r = split_piece(c->code, text, s, res, next); !r) return std::unexpected(r.error());
    }
    spans.swap(next);
  }
  std::vector<std::string_view> pieces;
  pieces.reserve(spans.size());
  for (const span& s : spans) pieces.push_back(text.substr(s.first, s.second));
  return pieces;
}

expected<std::vector<std::string>> pre_tokenizer::split_copy(std::string_view text) const {
  std::string scratch;
  auto views = split(text, scratch);
  if (!views) return std::unexpected(views.error());
  return std::vector<std::string>(views->begin(), views->end());
}

}  // namespace exa::model
