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

#include "common/splitmix64.hpp"
#include "template/chat_template.hpp"

TEST_CASE("limits: mutated real templates never crash or hang", "[template]") {
  // Random cuts, copies and stray syntax in every built-in template: each
  // compiles and renders to a value or an error, never an exception, a
  // crash or a hang. The seed reproduces a failure.
  const std::uint64_t seed = 20261202;
  INFO("seed " << seed);
  exa::splitmix64_stream rng(seed);
  static constexpr std::string_view pieces[] = {"{{", "}}", "{%", "%}", "{#", "#}", "(", ")", "[", "]", "'", "\"", "|",
                                                "-", " is ", " not ", " in ", "{% for x in messages %}", "{% endfor %}",
                                                "{% if true %}", "{% endif %}", "loop.", ".items()", "*", "~", "\\"};
  const std::string vars = R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                                             {"role": "assistant", "content": "a"}], "add_generation_prompt": true,
                               "bos_token": "<s>", "eos_token": "</s>"})";
  template_limits lim;
  lim.steps_max = 20000;
  std::size_t rendered = 0, failed = 0;
  for (const auto& t : builtin_templates()) {
    for (int i = 0; i < 150; ++i) {
      std::string src(t.source);
      for (int k = 0; k < 3; ++k) {
        const std::size_t at = rng.next() % (src.size() + 1);
        switch (rng.next() % 3) {
          case 0: src.erase(at, rng.next() % 16); break;
          case 1: src.insert(at, src.substr(rng.next() % (src.size() + 1), rng.next() % 32)); break;
          default: src.insert(at, pieces[rng.next() % std::size(pieces)]); break;
        }
      }
      const std::string out = test::render(src, vars, lim);
      (out.starts_with("ERROR: ") ? failed : rendered) += 1;
    }
  }
  CHECK(rendered + failed == builtin_templates().size() * 150);
  CHECK(rendered > 0);  // some mutations are harmless
  CHECK(failed > 0);    // and many are not: the error paths ran
}
