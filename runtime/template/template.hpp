#pragma once
// A compiled jinja2 template and its renderer: parse once (per model), render
// per request. Everything a hostile template could grow is bounded: source
// size, tokens, nesting, statements executed, output and string sizes, list
// lengths, value nesting. Hitting a bound is an error naming it, never a
// crash or a hang.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "template/value.hpp"

namespace exa::jinja {

struct stmt;

struct template_limits {
  std::size_t source_bytes_max = 1 << 20;
  std::size_t tokens_max = 1 << 18;
  /// Nesting of blocks and of expressions in the source.
  std::size_t depth_max = 128;
  std::size_t output_bytes_max = 1 << 22;
  /// Statements executed plus loop iterations, over one render.
  std::size_t steps_max = 1 << 20;
  /// Length of a list a template builds (range(), +, *).
  std::size_t items_max = 1 << 16;
  /// How deeply values a template builds may nest.
  std::uint32_t value_depth_max = 32;
  /// namespace() calls per render (namespaces are the only mutable values).
  std::size_t namespaces_max = 1024;
};

class compiled_template {
 public:
  /// Lexes and parses. Errors: invalid_argument (syntax, with the line),
  /// unsupported (a jinja2 construct we do not run, named with its line).
  static expected<compiled_template> compile(std::string_view source, const template_limits& limits = {});

  /// Renders with `variables` as the template's globals; `now_unix_s` is
  /// strftime_now's clock. Errors: invalid_argument for runtime errors
  /// ("chat template line N: ...") and raise_exception ("chat template:
  /// <message>"), unsupported for unknown filters/tests.
  expected<std::string> render(const dict& variables, std::int64_t now_unix_s) const;

 private:
  std::shared_ptr<const std::vector<stmt>> body_;
  template_limits limits_;
};

}  // namespace exa::jinja
