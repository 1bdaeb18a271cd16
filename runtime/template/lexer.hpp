#pragma once
// Template source to tokens, with jinja2's whitespace rules applied the way
// transformers configures them: trim_blocks (the newline after a block or
// comment tag is dropped), lstrip_blocks (spaces and tabs before a block or
// comment tag on its own line are dropped), `-` on a tag strips all
// whitespace on that side, `+` turns the block rules off for that tag, and
// one trailing newline of the source is dropped (keep_trailing_newline off).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"

namespace exa::jinja {

struct token {
  enum class kind {
    text,         // literal output between tags
    var_begin,    // {{
    var_end,      // }}
    block_begin,  // {%
    block_end,    // %}
    name,
    string,
    integer,
    floating,
    op,  // operators and punctuation: + - * / // % ** ~ == != < <= > >= = ( ) [ ] { } , . : |
    eof,
  };
  kind type = kind::eof;
  std::string text;  // text/name/op; a string literal's decoded value
  std::int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

/// Splits `source` into tokens. Errors (invalid_argument, naming the line):
/// an unclosed tag, comment or string, a character no expression may hold.
expected<std::vector<token>> tokenize(std::string_view source, std::size_t tokens_max);

}  // namespace exa::jinja
