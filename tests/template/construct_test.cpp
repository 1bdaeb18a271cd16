// Each jinja2 construct chat templates use, rendered by our interpreter and
// compared byte for byte with Python jinja2's output under transformers'
// settings (tests/fixtures/templates/constructs.json, written by
// scripts/make_template_fixtures.py).
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "render_helper.hpp"

using namespace exa::jinja;

namespace {

nlohmann::ordered_json load_fixture(const std::string& name) {
  std::ifstream in(std::string(EXA_TEMPLATE_FIXTURES) + "/" + name, std::ios::binary);
  REQUIRE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::ordered_json::parse(ss.str());
}

}  // namespace

TEST_CASE("template: every construct renders byte-identical to jinja2", "[template]") {
  const auto doc = load_fixture("constructs.json");
  REQUIRE(doc["now_unix_s"].get<std::int64_t>() == test::fixed_now_unix_s);
  std::size_t checked = 0;
  for (const auto& c : doc["cases"]) {
    const std::string label = c["section"].get<std::string>() + ": " + c["name"].get<std::string>();
    const std::string got = test::render(c["source"].get<std::string>(), c["variables"].dump());
    INFO(label << "\nsource: " << c["source"].get<std::string>());
    CHECK(got == c["expected"].get<std::string>());
    ++checked;
  }
  CHECK(checked >= 100);
}

TEST_CASE("template: undefined fails where jinja2's Undefined does", "[template]") {
  // Printing, truthiness, iteration, length and default are fine...
  CHECK(test::render("{{ x }}{% if x %}t{% endif %}{% for i in x %}i{% endfor %}{{ x | length }}{{ x | default('d') }}") ==
        "0d");
  // ...attribute access, arithmetic and calls are errors naming the name.
  CHECK(test::render("{{ x.y }}") == "ERROR: chat template line 1: 'x' is undefined");
  CHECK(test::render("\n{{ x + 1 }}") == "ERROR: chat template line 2: 'x' is undefined");
  CHECK(test::render("{{ x() }}") == "ERROR: chat template line 1: 'x' is undefined");
  CHECK(test::render("{{ d.a.b }}", R"({"d": {}})") ==
        "ERROR: chat template line 1: 'dict object' has no attribute 'a'");
  CHECK(test::render("{{ x | tojson }}").starts_with("ERROR: chat template line 1: Object of type Undefined"));
}

TEST_CASE("template: runtime type errors name the line", "[template]") {
  CHECK(test::render("a\nb\n{{ 'a' + 1 }}") ==
        "ERROR: chat template line 3: can only concatenate str (not \"int\") to str");
  CHECK(test::render("{{ 1 // 0 }}") == "ERROR: chat template line 1: integer division or modulo by zero");
  CHECK(test::render("{{ 'a' < 1 }}") ==
        "ERROR: chat template line 1: '<' not supported between instances of 'str' and 'int'");
  CHECK(test::render("{% for a, b in [[1, 2, 3]] %}{% endfor %}") ==
        "ERROR: chat template line 1: too many values to unpack (expected 2, got 3)");
  CHECK(test::render("{% set x = 1 %}{% set x.a = 2 %}") ==
        "ERROR: chat template line 1: cannot assign attribute on non-namespace object");
  CHECK(test::render("{{ 1 in 5 }}") == "ERROR: chat template line 1: argument of type 'int' is not iterable");
  CHECK(test::render("{{ 5() }}") == "ERROR: chat template line 1: 'int' object is not callable");
}

TEST_CASE("template: raise_exception stops rendering with the template's message", "[template]") {
  const auto e = test::render_error("ok{{ raise_exception('Only user and assistant roles are supported!') }}");
  CHECK(e.code == exa::errc::invalid_argument);
  CHECK(e.message == "chat template: Only user and assistant roles are supported!");
}

TEST_CASE("template: unsupported constructs are named with their line", "[template]") {
  auto e = test::render_error("a\n\n{% macro m() %}x{% endmacro %}");
  CHECK(e.code == exa::errc::unsupported);
  CHECK(e.message == "chat template line 3: unsupported statement 'macro'");
  e = test::render_error("{% include 'x' %}");
  CHECK(e.message == "chat template line 1: unsupported statement 'include'");
  e = test::render_error("{% for x in xs recursive %}{% endfor %}");
  CHECK(e.message == "chat template line 1: unsupported loop modifier 'recursive'");
  e = test::render_error("\n{{ x | wordwrap }}");
  CHECK(e.code == exa::errc::unsupported);
  CHECK(e.message == "chat template line 2: unsupported filter 'wordwrap'");
  e = test::render_error("{{ x is escaped }}");
  CHECK(e.message == "chat template line 1: unsupported test 'escaped'");
  e = test::render_error("{{ '%s' % 1 }}");
  CHECK(e.message == "chat template line 1: unsupported: printf-style string formatting with '%'");
}

TEST_CASE("template: syntax errors name the line and what was found", "[template]") {
  CHECK(test::render("{% if x %}never closed") == "ERROR: chat template line 1: missing 'endif'");
  CHECK(test::render("\n{{ 'open }}") == "ERROR: chat template line 2: unclosed string literal");
  CHECK(test::render("{{ x") == "ERROR: chat template line 1: unclosed tag '{{'");
  CHECK(test::render("{# no end") == "ERROR: chat template line 1: unclosed comment");
  CHECK(test::render("{{ 1 + }}") == "ERROR: chat template line 1: unexpected '}}' in an expression");
  CHECK(test::render("{% endfor %}") == "ERROR: chat template line 1: unknown statement 'endfor'");
  CHECK(test::render("{% break %}") == "ERROR: chat template line 1: 'break' outside a loop");
  CHECK(test::render("{{ a ; b }}") == "ERROR: chat template line 1: unexpected character ';' in a tag");
  CHECK(test::render("{{ f(a=1, 2) }}") == "ERROR: chat template line 1: positional argument after a keyword argument");
}

TEST_CASE("template: a namespace is shared by every reference to it", "[template]") {
  CHECK(test::render("{% set ns = namespace(v=1) %}{% set alias = ns %}{% set alias.v = 2 %}{{ ns.v }}") == "2");
}

TEST_CASE("template: huge numbers in format fields and attribute paths are errors, not crashes", "[template]") {
  CHECK(test::render("{{ '{99999999999999999999}'.format(1) }}") ==
        "ERROR: chat template line 1: format(): no argument for '{99999999999999999999}'");
  CHECK(test::render("{{ [[1]] | map(attribute='99999999999999999999999') | list }}|{{ [nope, 1] }}") ==
        "[Undefined]|[Undefined, 1]");
  CHECK(test::render("{{ 99999999999999999999 }}") == "ERROR: chat template line 1: integer literal 99999999999999999999 is out of range");
}
