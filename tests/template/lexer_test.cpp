// The lexer alone: tokens, lines and jinja2's whitespace rules.
#include <catch2/catch.hpp>

#include "template/lexer.hpp"

using namespace exa::jinja;
using tk = token::kind;

namespace {
std::vector<token> lex(std::string_view s) {
  auto t = tokenize(s, 1 << 16);
  REQUIRE(t);
  return *t;
}
}  // namespace

TEST_CASE("lexer: text, tags and expression tokens", "[template]") {
  const auto t = lex("a{{ x.y[0] | f(1.5, 'q') }}b");
  REQUIRE(t.size() == 18);
  CHECK(t[0].type == tk::text);
  CHECK(t[0].text == "a");
  CHECK(t[1].type == tk::var_begin);
  CHECK((t[2].type == tk::name && t[2].text == "x"));
  CHECK((t[3].type == tk::op && t[3].text == "."));
  CHECK((t[6].type == tk::integer && t[6].int_value == 0));
  CHECK((t[11].type == tk::floating && t[11].float_value == 1.5));
  CHECK((t[13].type == tk::string && t[13].text == "q"));
  CHECK(t[15].type == tk::var_end);
  CHECK(t[16].type == tk::text);
}

TEST_CASE("lexer: a '}}' inside brackets is two braces", "[template]") {
  const auto t = lex("{{ {'a': {'b': 1}} }}");
  CHECK(t.back().type == tk::eof);
  CHECK(t[t.size() - 2].type == tk::var_end);
}

TEST_CASE("lexer: lines are counted across text and tags", "[template]") {
  const auto t = lex("a\nb\n{% if x %}\n{{ y\n }}");
  CHECK(t[1].line == 3);  // {%
  bool found_y = false;
  for (const auto& k : t)
    if (k.type == tk::name && k.text == "y") {
      CHECK(k.line == 4);
      found_y = true;
    }
  CHECK(found_y);
}

TEST_CASE("lexer: a token bound stops hostile sources", "[template]") {
  std::string s;
  for (int i = 0; i < 1000; ++i) s += "{{ x }}";
  auto t = tokenize(s, 100);
  REQUIRE_FALSE(t);
  CHECK(t.error().message.find("more than 100 tokens") != std::string::npos);
}
