// Hostile templates: every way to grow without bound ends in an error that
// names the bound, never a crash or a hang.
#include <catch2/catch.hpp>

#include "render_helper.hpp"

using namespace exa::jinja;

namespace {
bool mentions(const std::string& got, const std::string& what) {
  INFO(got);
  return got.starts_with("ERROR: ") && got.find(what) != std::string::npos;
}
}  // namespace

TEST_CASE("limits: output size", "[template]") {
  template_limits lim;
  lim.output_bytes_max = 1000;
  CHECK(mentions(test::render("{% for i in range(100) %}0123456789abcdef{% endfor %}", "{}", lim), "output exceeds 1000 bytes"));
  CHECK(mentions(test::render("{{ 'x' * 5000 }}", "{}", lim), "repetition result too large"));
  CHECK(mentions(test::render("{% set ns = namespace(s='ab') %}{% for i in range(20) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                              "{}", lim),
                 "string exceeds 1000 bytes"));
}

TEST_CASE("limits: steps stop endless work", "[template]") {
  template_limits lim;
  lim.steps_max = 10000;
  CHECK(mentions(test::render("{% for a in range(1000) %}{% for b in range(1000) %}{% endfor %}{% endfor %}", "{}", lim),
                 "more than 10000 steps"));
}

TEST_CASE("limits: list lengths", "[template]") {
  CHECK(mentions(test::render("{{ range(100000000) | length }}"), "range() longer than"));
  CHECK(mentions(test::render("{{ ([1] * 100000000) | length }}"), "repetition result too large"));
  CHECK(mentions(test::render("{% set ns = namespace(l=[1]) %}{% for i in range(30) %}{% set ns.l = ns.l + ns.l %}{% endfor %}"),
                 "list too long"));
}

TEST_CASE("limits: nesting of source and of values", "[template]") {
  CHECK(mentions(test::render("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"), "nested deeper than"));
  std::string blocks;
  for (int i = 0; i < 500; ++i) blocks += "{% if true %}";
  CHECK(mentions(test::render(blocks), "nested deeper than"));
  CHECK(mentions(test::render("{% set ns = namespace(l=[]) %}{% for i in range(100) %}{% set ns.l = [ns.l] %}{% endfor %}"),
                 "value nests deeper than"));
  // A namespace holding itself prints without recursing forever.
  const std::string self = test::render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}");
  CHECK(self.starts_with("<Namespace {'me': <Namespace {'me': "));
  CHECK(self.size() < 10000);
}

TEST_CASE("limits: namespace() calls", "[template]") {
  template_limits lim;
  lim.namespaces_max = 5;
  CHECK(mentions(test::render("{% for i in range(10) %}{% set n = namespace() %}{% endfor %}", "{}", lim),
                 "more than 5 namespace() calls"));
}

TEST_CASE("limits: source size", "[template]") {
  template_limits lim;
  lim.source_bytes_max = 10;
  CHECK(mentions(test::render("0123456789abc", "{}", lim), "larger than 10 bytes"));
}
