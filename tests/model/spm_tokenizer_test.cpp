// SentencePiece tokenization and llama.cpp's special-token rules on small
// hand-made vocabularies, where the expected ids follow from the algorithm
// by hand: merge order by score, leftmost on ties, byte fallback, the
// leading-space rule, special tokens parsed or not, detokenization.

#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "model/special_tokens.hpp"
#include "model/spm_tokenizer.hpp"
#include "model/tokenizer.hpp"

using namespace exa;
using namespace exa::model;

namespace {

const std::string sp = "\xE2\x96\x81";  // ▁

struct entry {
  std::string text;
  float score = 0.0f;
  token_kind kind = token_kind::normal;
};

// <unk> <s> </s>, the 256 byte tokens, then `pieces` from id 259.
vocab spm_vocab(const std::vector<entry>& pieces, bool add_space_prefix = true) {
  vocab v;
  v.model = "llama";
  auto add = [&v](const entry& e) {
    v.tokens.push_back(e.text);
    v.scores.push_back(e.score);
    v.kinds.push_back(e.kind);
  };
  add({"<unk>", 0, token_kind::unknown});
  add({"<s>", 0, token_kind::control});
  add({"</s>", 0, token_kind::control});
  for (unsigned b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    add({buf, 0, token_kind::byte});
  }
  for (const entry& e : pieces) add(e);
  v.add_space_prefix = add_space_prefix;
  return v;
}

tokenizer make(vocab v, std::string_view name = {}) {
  const auto n = static_cast<std::uint32_t>(v.tokens.size());
  auto t = tokenizer::from_vocab(std::move(v), n, name);
  REQUIRE(t.has_value());
  return std::move(*t);
}

std::vector<token_id> enc(const tokenizer& t, std::string_view text, bool add_special = false,
                          bool parse_special = false) {
  auto ids = t.encode(text, add_special, parse_special);
  REQUIRE(ids.has_value());
  return *ids;
}

constexpr token_id byte_id(unsigned char b) { return 3 + b; }
constexpr token_id first_piece = 259;

}  // namespace

TEST_CASE("spm merges the highest-scoring pair first", "[model][spm]") {
  // "ab" (-2) and "bc" (-1): bc wins, so "abc" is a + bc, not ab + c.
  const tokenizer t = make(spm_vocab({{"a", -5}, {"b", -5}, {"c", -5}, {"ab", -2}, {"bc", -1}}, false));
  CHECK(enc(t, "abc") == std::vector<token_id>{first_piece + 0, first_piece + 4});
  // Scores swapped: ab wins.
  const tokenizer u = make(spm_vocab({{"a", -5}, {"b", -5}, {"c", -5}, {"ab", -1}, {"bc", -2}}, false));
  CHECK(enc(u, "abc") == std::vector<token_id>{first_piece + 3, first_piece + 2});
}

TEST_CASE("spm breaks score ties by the leftmost pair", "[model][spm]") {
  const tokenizer t = make(spm_vocab({{"a", -5}, {"ab", -1}, {"ba", -1}}, false));
  // "aba": ab (left 0) and ba (left 1) tie; ab is merged, then "a" stays.
  CHECK(enc(t, "aba") == std::vector<token_id>{first_piece + 1, first_piece + 0});
  CHECK(enc(t, "bab") == std::vector<token_id>{first_piece + 2, byte_id('b')});
}

TEST_CASE("spm merges grow pieces step by step through intermediate tokens", "[model][spm]") {
  // "hello" needs he, ll, hell, hello: each merge forms a token, the last
  // one covers the word. Without "hell" the word stops at he + ll + o.
  const std::vector<entry> full = {{"h"}, {"e"}, {"l"}, {"o"}, {"he", -1}, {"ll", -2}, {"hell", -3}, {"hello", -4}};
  CHECK(enc(make(spm_vocab(full, false)), "hello") == std::vector<token_id>{first_piece + 7});
  const std::vector<entry> partial = {{"h"}, {"e"}, {"l"}, {"o"}, {"he", -1}, {"ll", -2}, {"hello", -4}};
  CHECK(enc(make(spm_vocab(partial, false)), "hello") ==
        std::vector<token_id>{first_piece + 4, first_piece + 5, first_piece + 3});
}

TEST_CASE("spm falls back to byte tokens for characters outside the vocabulary", "[model][spm]") {
  const tokenizer t = make(spm_vocab({{"a", -1}}, false));
  // é is C3 A9; 😀 is F0 9F 98 80.
  CHECK(enc(t, "a\xC3\xA9") == std::vector<token_id>{first_piece, byte_id(0xC3), byte_id(0xA9)});
  CHECK(enc(t, "\xF0\x9F\x98\x80") ==
        std::vector<token_id>{byte_id(0xF0), byte_id(0x9F), byte_id(0x98), byte_id(0x80)});
  // A truncated character at the end is still bytes.
  CHECK(enc(t, "a\xE2\x96") == std::vector<token_id>{first_piece, byte_id(0xE2), byte_id(0x96)});
}

TEST_CASE("spm without byte tokens falls back to <unk>", "[model][spm]") {
  spm_tokenizer s({"<unk>", "a", "ab"}, {0, -1, -2}, token_id{0});
  std::vector<token_id> out;
  REQUIRE(s.encode("abz", out).has_value());
  CHECK(out == std::vector<token_id>{2, 0});
  spm_tokenizer no_unk({"a"}, {0}, std::nullopt);
  out.clear();
  auto r = no_unk.encode("az", out);
  REQUIRE_FALSE(r.has_value());
  CHECK_THAT(r.error().message, Catch::Contains("0x7A"));
}

TEST_CASE("spm escapes spaces and adds the space prefix at the start and after specials", "[model][spm]") {
  const std::vector<entry> pieces = {{sp, -1}, {"h", -9}, {"i", -9}, {sp + "h", -2}, {sp + "hi", -3},
                                     {"<tool>", 0, token_kind::user_defined}};
  const tokenizer t = make(spm_vocab(pieces, true));
  const token_id sp_id = first_piece, hi = first_piece + 4, tool = first_piece + 5;
  CHECK(t.add_space_prefix());
  CHECK(enc(t, "hi") == std::vector<token_id>{hi});
  CHECK(enc(t, "hi hi") == std::vector<token_id>{hi, hi});
  CHECK(enc(t, "  hi") == std::vector<token_id>{sp_id, sp_id, hi});
  // A user-defined token is always cut out, and the text after it starts a
  // new fragment with its own prefix space.
  CHECK(enc(t, "hi<tool>hi") == std::vector<token_id>{hi, tool, hi});
  // Tabs and newlines are not spaces: bytes.
  CHECK(enc(t, "\thi") == std::vector<token_id>{sp_id, byte_id('\t'), first_piece + 1, first_piece + 2});
  // add_special adds BOS (the llama default) and no EOS.
  CHECK(enc(t, "hi", true) == std::vector<token_id>{1, hi});
  CHECK(enc(t, "", true) == std::vector<token_id>{1});
  CHECK(enc(t, "").empty());

  const tokenizer no_prefix = make(spm_vocab(pieces, false));
  CHECK(enc(no_prefix, "hi") == std::vector<token_id>{first_piece + 1, first_piece + 2});
}

TEST_CASE("control tokens in text are plain text unless specials are parsed", "[model][spm]") {
  const std::vector<entry> pieces = {{sp, -1}, {"x", -2}, {"<|eot_id|>", 0, token_kind::control}};
  const tokenizer t = make(spm_vocab(pieces, false));
  const token_id eot = first_piece + 2;
  const auto plain = enc(t, "x<|eot_id|>x");
  CHECK(plain.size() == 12);  // x, the 10 bytes of the marker, x
  CHECK(std::find(plain.begin(), plain.end(), eot) == plain.end());
  CHECK(enc(t, "x<|eot_id|>x", false, true) == std::vector<token_id>{first_piece + 1, eot, first_piece + 1});
  // <s> is control too.
  CHECK(enc(t, "<s>x", false, true) == std::vector<token_id>{1, first_piece + 1});
}

TEST_CASE("longer special tokens are cut out before shorter ones", "[model][spm]") {
  const std::vector<entry> pieces = {{"<a>", 0, token_kind::user_defined},
                                     {"<a><b>", 0, token_kind::user_defined},
                                     {"<b>", 0, token_kind::user_defined}};
  const tokenizer t = make(spm_vocab(pieces, false));
  CHECK(enc(t, "<a><b><b>") == std::vector<token_id>{first_piece + 1, first_piece + 2});
}

TEST_CASE("partition_special strips whitespace beside rstrip/lstrip tokens", "[model][spm]") {
  const std::vector<std::string> texts = {"<x>", "<y>"};
  const std::vector<std::uint32_t> attrs = {attr_control | attr_rstrip, attr_control | attr_lstrip};
  const auto f = partition_special("a <x>  b  <y> c", {0, 1}, texts, attrs, true);
  REQUIRE(f.size() == 5);
  CHECK(f[0].text == "a ");
  CHECK(f[1].token == 0);
  CHECK(f[2].text == "b");
  CHECK(f[3].token == 1);
  CHECK(f[4].text == " c");
  CHECK(partition_special("a <x>", {0, 1}, texts, attrs, false).size() == 1);
}

TEST_CASE("Phi-3 model names make specials strip the spaces after them", "[model][spm]") {
  const std::vector<entry> pieces = {{sp, -1}, {"x", -2}, {"<|user|>", 0, token_kind::control}};
  const tokenizer phi = make(spm_vocab(pieces, false), "Phi-3 mini");
  CHECK(enc(phi, "<|user|>  x", false, true) == std::vector<token_id>{first_piece + 2, first_piece + 1});
  const tokenizer other = make(spm_vocab(pieces, false), "mistral");
  CHECK(enc(other, "<|user|> x", false, true) == std::vector<token_id>{first_piece + 2, first_piece, first_piece + 1});
}

TEST_CASE("detokenize follows llama.cpp's token_to_piece and leading-space rule", "[model][spm]") {
  const std::vector<entry> pieces = {{sp, -1}, {sp + "hi", -2}, {"<tool>", 0, token_kind::user_defined},
                                     {"<|im_end|>", 0, token_kind::control}, {"gone", 0, token_kind::unused}};
  const tokenizer t = make(spm_vocab(pieces, true));
  const token_id hi = first_piece + 1, tool = first_piece + 2, im_end = first_piece + 3, gone = first_piece + 4;
  CHECK(t.decode({hi, hi}) == "hi hi");                   // first leading space removed
  CHECK(t.decode({1, hi}) == " hi");                      // a hidden BOS uses up the removal
  CHECK(t.decode({1, hi}, true) == "<s> hi");
  CHECK(t.decode({hi, tool, im_end, 2}) == "hi<tool>");  // control hidden, user-defined shown
  CHECK(t.decode({hi, im_end}, true) == "hi<|im_end|>");
  CHECK(t.decode({byte_id(0xC3), byte_id(0xA9)}) == "\xC3\xA9");
  CHECK(t.decode({gone, 0}).empty());
  CHECK(t.decode_token(hi) == " hi");
  CHECK(t.decode_token(-1).empty());
  CHECK(t.decode_token(100000).empty());
  CHECK(t.token_text(1) == "<s>");
  CHECK(t.kind(tool) == token_kind::user_defined);
}

TEST_CASE("the end-of-generation set follows llama.cpp's rules", "[model][spm]") {
  // <|eot_id|> stored as a normal token becomes control and end of turn;
  // <|return|> ends generation by its text alone.
  vocab v = spm_vocab({{"<|eot_id|>"}, {"<|return|>", 0, token_kind::control}, {"<|eom_id|>"}, {"hello"}}, false);
  const tokenizer t = make(v);
  const token_id eot = first_piece, end = first_piece + 1, eom = first_piece + 2;
  CHECK(t.eot() == eot);
  CHECK(t.eom() == eom);
  CHECK(t.eog_ids() == std::vector<token_id>{2, eot, end, eom});
  CHECK(t.is_eog(2));
  CHECK(t.is_eog(eot));
  CHECK_FALSE(t.is_eog(first_piece + 3));
  CHECK(t.decode({eot}).empty());  // now control: hidden
  CHECK(enc(t, "<|eot_id|>", false, true) == std::vector<token_id>{eot});

  vocab harmony = spm_vocab({{"<|end|>", 0, token_kind::control}, {"<|return|>", 0, token_kind::control},
                             {"<|call|>", 0, token_kind::control}}, false);
  const tokenizer h = make(harmony);
  CHECK_FALSE(h.is_eog(first_piece));
  CHECK(h.is_eog(first_piece + 1));
  CHECK(h.decode({first_piece}) == "<|end|>");  // now user-defined: shown

  // An explicit eot id wins over detection by text.
  vocab explicit_eot = spm_vocab({{"<|eot_id|>"}, {"<|im_end|>", 0, token_kind::control}}, false);
  explicit_eot.ids.eot = first_piece + 1;
  CHECK(make(explicit_eot).eot() == first_piece + 1);
}

TEST_CASE("add_bos/add_eos flags and llama defaults", "[model][spm]") {
  vocab v = spm_vocab({{"x"}}, false);
  CHECK(make(v).add_bos());
  CHECK_FALSE(make(v).add_eos());
  v.add_bos = false;
  v.add_eos = true;
  const tokenizer t = make(v);
  CHECK(enc(t, "x", true) == std::vector<token_id>{first_piece, 2});
  CHECK(enc(t, "x", false) == std::vector<token_id>{first_piece});
}

TEST_CASE("the byte-level fast path equals SentencePiece on the same vocabulary", "[model][spm]") {
  const tokenizer fast = tokenizer::byte_level(300);
  // The same vocabulary with one more normal token that nothing can form is
  // not recognised as byte-level, so it takes the general path.
  vocab v = spm_vocab({{sp}}, false);
  v.ids.unk = 0;
  v.ids.bos = 1;
  v.ids.eos = 2;
  v.tokens.push_back("\x01\x02\x03zz");
  v.scores.push_back(0);
  v.kinds.push_back(token_kind::normal);
  const tokenizer general = make(v);
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::string text;
    const int len = static_cast<int>(rng() % 40);
    for (int i = 0; i < len; ++i) {
      const unsigned r = rng() % 10;
      text += r < 3 ? ' ' : r < 5 ? static_cast<char>(0x80 + rng() % 0x80) : static_cast<char>('a' + rng() % 26);
    }
    INFO(round);
    CHECK(enc(fast, text, true) == enc(general, text, true));
  }
}

TEST_CASE("gpt2 vocabularies decode byte-level text and clean up spaces like llama.cpp", "[model][spm]") {
  vocab v;
  v.model = "gpt2";
  v.pre = "gpt-2";
  // U+0120 'Ġ' is a space in GPT-2's byte mapping.
  v.tokens = {"<|endoftext|>", "Hello", "\xC4\xA0world", "\xC4\xA0!", "\xC4\xA0'", "s", "\xC4\xA0'm", "\xC4\xA0't"};
  v.kinds.assign(v.tokens.size(), token_kind::normal);
  v.kinds[0] = token_kind::control;
  const tokenizer t = make(v);
  CHECK(t.decode({1, 2, 3}) == "Hello world!");  // " !" -> "!"
  CHECK(t.decode({1, 4, 5}) == "Hello's");        // " 's" -> "'s"
  CHECK(t.decode({1, 6}) == "Hello'm");
  CHECK(t.decode({1, 7}) == "Hello 't");          // " 't" keeps its space
  CHECK(t.decode({1, 4, 2}) == "Hello'world");    // " ' " -> "'": both spaces go
  CHECK(t.is_eog(0));                             // <|endoftext|> by text
  // qwen2 does not clean up.
  v.pre = "qwen2";
  CHECK(make(v).decode({1, 2, 3}) == "Hello world !");
}
