// Pre-tokenizers: llama.cpp's names, each expression set on hand-picked
// inputs (digits, contractions, whitespace runs, marks), llama.cpp's repair of
// invalid UTF-8, long inputs and concurrent use.

#include <catch2/catch.hpp>

#include <string>
#include <thread>
#include <vector>

#include "model/pre_tokenizer.hpp"

using namespace exa;
using namespace exa::model;
using Catch::Matchers::Contains;
using pieces = std::vector<std::string>;

namespace {

pieces split(const pre_tokenizer& p, std::string_view text) {
  auto r = p.split_copy(text);
  REQUIRE(r.has_value());
  return *r;
}

pre_tokenizer named(std::string_view name) {
  auto p = pre_tokenizer::create(name);
  REQUIRE(p.has_value());
  return std::move(*p);
}

std::string joined(const pieces& ps) {
  std::string s;
  for (const auto& p : ps) s += p;
  return s;
}

}  // namespace

TEST_CASE("llama-bpe splits digits in threes and contractions in any case", "[pre_tokenizer]") {
  const auto p = named("llama-bpe");
  CHECK(p.traits().ignore_merges);
  CHECK(p.traits().add_bos);
  CHECK(split(p, "1234567") == pieces{"123", "456", "7"});
  CHECK(split(p, "I'm DON'T we'VE") == pieces{"I", "'m", " DON", "'T", " we", "'VE"});
  CHECK(split(p, "  hello") == pieces{" ", " hello"});
  CHECK(split(p, "a\n\n b") == pieces{"a", "\n\n", " b"});
  CHECK(split(p, "hello   ") == pieces{"hello", "   "});
  CHECK(split(p, "x?!\n\ny") == pieces{"x", "?!\n\n", "y"});
  CHECK(split(p, "") == pieces{});
}

TEST_CASE("gpt-2 keeps digit runs and is case-sensitive on contractions", "[pre_tokenizer]") {
  const auto p = named("gpt-2");
  CHECK_FALSE(p.traits().ignore_merges);
  CHECK(split(p, "1234567") == pieces{"1234567"});
  CHECK(split(p, "I'M it's") == pieces{"I", "'", "M", " it", "'s"});
  CHECK(split(p, " 42") == pieces{" 42"});
  CHECK(split(p, "a  b") == pieces{"a", " ", " b"});
  // A lone newline before a letter matches nothing: it is the text between matches.
  CHECK(split(p, "a\nb") == pieces{"a", "\n", "b"});
}

TEST_CASE("qwen2 splits every digit, qwen35 keeps marks with their letters", "[pre_tokenizer]") {
  CHECK(split(named("qwen2"), "x1234") == pieces{"x", "1", "2", "3", "4"});
  // The mark is no letter: it becomes the optional prefix of the next word.
  CHECK(split(named("qwen2"), "e\u0301t\u00e9") == pieces{"e", "\u0301t\u00e9"});
  CHECK(split(named("qwen35"), "e\u0301t\u00e9") == pieces{"e\u0301t\u00e9"});
  CHECK_FALSE(named("qwen2").traits().clean_spaces);
}

TEST_CASE("starcoder and smollm cut digits out before the GPT-2 expression", "[pre_tokenizer]") {
  for (const char* name : {"starcoder", "smollm"}) {
    CHECK(split(named(name), " 1234 x") == pieces{" ", "1", "2", "3", "4", " x"});
  }
}

TEST_CASE("default cuts punctuation runs, then words, then digits in threes", "[pre_tokenizer]") {
  const auto p = named("default");
  CHECK(split(p, "Hello, world!!") == pieces{"Hello", ",", " world", "!!"});
  CHECK(split(p, "12345") == pieces{"123", "45"});
  // A file without tokenizer.ggml.pre gets the same expressions, as in llama.cpp.
  CHECK(named("").regexes() == p.regexes());
}

TEST_CASE("tekken and gpt-4o split words at case changes", "[pre_tokenizer]") {
  CHECK(split(named("tekken"), "camelCaseWord") == pieces{"camel", "Case", "Word"});
  CHECK(split(named("gpt-4o"), "XMLHttpRequest's") == pieces{"XMLHttp", "Request's"});
}

TEST_CASE("names llama.cpp maps to one expression set share it", "[pre_tokenizer]") {
  CHECK(named("llama3").regexes() == named("llama-bpe").regexes());
  CHECK(named("dbrx").regexes() == named("llama-bpe").regexes());
  CHECK_FALSE(named("dbrx").traits().ignore_merges);
  CHECK(named("deepseek-r1-qwen").regexes() == named("qwen2").regexes());
  CHECK(named("olmo").regexes() == named("gpt-2").regexes());
}

TEST_CASE("unknown and unsupported pre-tokenizer names are errors naming them", "[pre_tokenizer]") {
  auto a = pre_tokenizer::create("deepseek-llm");
  REQUIRE_FALSE(a.has_value());
  CHECK(a.error().code == errc::unsupported);
  CHECK_THAT(a.error().message, Contains("'deepseek-llm'") && Contains("not supported"));
  auto b = pre_tokenizer::create("no-such-pre");
  REQUIRE_FALSE(b.has_value());
  CHECK(b.error().code == errc::unsupported);
  CHECK_THAT(b.error().message, Contains("unknown") && Contains("'no-such-pre'"));
  // gpt2 is a tokenizer model name, not a pre-tokenizer name, in llama.cpp too.
  CHECK_FALSE(pre_tokenizer::create("gpt2").has_value());
}

TEST_CASE("whitespace in expressions is llama.cpp's set, not PCRE2's", "[pre_tokenizer]") {
  auto p = pre_tokenizer::from_regexes({R"(\s+)"});
  REQUIRE(p.has_value());
  // U+180E is whitespace to PCRE2 but not to llama.cpp; U+3000 and U+0085 are to both.
  CHECK(split(*p, "a\u180eb\u3000c\u0085d") == pieces{"a\u180eb", "\u3000", "c", "\u0085", "d"});
  auto bad = pre_tokenizer::from_regexes({"(unclosed"});
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().code == errc::invalid_argument);
}

TEST_CASE("invalid UTF-8 is repaired as llama.cpp reads it, without crashing", "[pre_tokenizer]") {
  const std::string fffd = "\xEF\xBF\xBD";
  std::string out;
  CHECK_FALSE(repair_utf8_like_llama("plain \xC3\xA9 text", out));
  REQUIRE(repair_utf8_like_llama("a\xFF" "b", out));
  CHECK(out == "a" + fffd + "b");
  REQUIRE(repair_utf8_like_llama("\xC0\x80", out));  // over-long NUL decodes to NUL
  CHECK(out == std::string(1, '\0'));
  REQUIRE(repair_utf8_like_llama("x\xE2\x82", out));  // truncated: one U+FFFD per byte
  CHECK(out == "x" + fffd + fffd);
  REQUIRE(repair_utf8_like_llama("\xED\xA0\x80", out));  // a surrogate: U+FFFD (see header)
  CHECK(out == fffd);
  REQUIRE(repair_utf8_like_llama("\xF4\x90\x80\x80", out));  // above U+10FFFF
  CHECK(out == fffd);

  const auto p = named("llama-bpe");
  for (std::string_view bad : {"a\xFF" "b", "\x80\x80\x80", "\xF8\x88\x80\x80\x80z", "end\xE2"}) {
    std::string repaired;
    if (!repair_utf8_like_llama(bad, repaired)) repaired = bad;
    CHECK(joined(split(p, bad)) == repaired);
  }
  CHECK(split(p, "a\xFF" "b") == pieces{"a", fffd + "b"});
}

TEST_CASE("long inputs split completely", "[pre_tokenizer]") {
  const std::string spaces(1 << 20, ' ');
  const std::string letters(1 << 20, 'x');
  const std::string cjk = [] {
    std::string c;
    for (int i = 0; i < 100000; ++i) c += "\xE4\xB8\xAD";  // 中
    return c;
  }();
  const std::string mixed = [] {
    std::string m;
    for (int i = 0; i < 20000; ++i) m += "Word 123 \n\t";
    return m;
  }();
  for (const char* name : {"llama-bpe", "qwen2", "gpt-2", "default", "starcoder", "qwen35", "tekken", "gpt-4o"}) {
    const auto p = named(name);
    for (const std::string* s : {&spaces, &letters, &cjk, &mixed}) {
      INFO(name << " on " << s->size() << " bytes");
      CHECK(joined(split(p, *s)) == *s);
    }
  }
  CHECK(split(named("gpt-2"), letters).size() == 1);
  CHECK(split(named("llama-bpe"), spaces).size() == 1);
}

TEST_CASE("a whitespace run beyond PCRE2's default match limit still splits", "[pre_tokenizer]") {
  // Backtracking over the run costs one step per byte at its start: past
  // 10 million bytes the default limit stops it, the grown limit does not.
  const std::string spaces(12 << 20, ' ');
  const auto ps = split(named("llama-bpe"), spaces + "x");
  CHECK(ps.size() == 2);
  CHECK(ps.back() == " x");
}

TEST_CASE("one pre-tokenizer serves several threads at once", "[pre_tokenizer]") {
  const auto p = named("llama-bpe");
  const std::string text = "Hello, world! 1234567 I'm here.\n\n  你好 👋🏽";
  const pieces want = split(p, text);
  std::vector<int> ok(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        auto r = p.split_copy(text);
        ok[t] += r.has_value() && *r == want;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int v : ok) CHECK(v == 500);
}
