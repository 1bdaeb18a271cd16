#pragma once
// Tokens to statements: jinja2's grammar for the constructs chat templates
// use (if/elif/else, for with `if` filter and else, set incl. tuple targets,
// namespace attributes and block set, break/continue, transformers'
// {% generation %}), and its expression precedence. Anything else is an
// error naming the construct and its line.

#include <cstddef>
#include <vector>

#include "common/error.hpp"
#include "template/ast.hpp"
#include "template/lexer.hpp"

namespace exa::jinja {

/// Parses a token stream from tokenize(). `depth_max` bounds nesting (of
/// blocks and of expressions) so a hostile template cannot exhaust the stack.
/// Errors: invalid_argument for syntax errors, unsupported for jinja2
/// statements we do not run, both "chat template line N: ...".
expected<body> parse(const std::vector<token>& tokens, std::size_t depth_max);

}  // namespace exa::jinja
