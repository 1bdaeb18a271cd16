#pragma once
// The parsed form of a template: expressions and statements. One node type
// each, tagged by kind, so the parser and evaluator stay small switch
// statements instead of a class hierarchy.

#include <memory>
#include <string>
#include <vector>

#include "template/value.hpp"

namespace exa::jinja {

struct expr;
using expr_ptr = std::unique_ptr<expr>;

struct expr {
  enum class kind {
    literal,    // lit
    name,       // name
    list,       // args: elements; name "tuple" for (a, b) and bare a, b
    dict,       // args: key, value, key, value, ...
    attr,       // args[0].name
    item,       // args[0][args[1]]
    slice,      // args[0][args[1]:args[2]:args[3]] (null parts absent)
    call,       // args[0](args[1..], kwargs)
    filter,     // args[0] | name(args[1..], kwargs)
    test,       // args[0] is [not] name(args[1..])
    unary,      // name in {"-", "+", "not"} applied to args[0]
    binary,     // args[0] name args[1]: + - * / // % ** ~ and or
    compare,    // args[0] ops[0] args[1] ops[1] args[2] ...
    cond,       // args[1] if args[0] else args[2] (args[2] may be null)
  };
  kind type = kind::literal;
  int line = 1;
  value lit;
  std::string name;
  bool negated = false;            // `is not`
  std::vector<expr_ptr> args;
  std::vector<std::string> ops;    // compare operators: == != < <= > >= in notin
  std::vector<std::string> kwarg_names;  // call/filter keyword args: the last kwarg_names.size() args
};

struct stmt;
using body = std::vector<stmt>;

struct stmt {
  enum class kind {
    text,        // text
    output,      // {{ e }}
    if_,         // branches: (cond, body)...; else_body
    for_,        // targets in e [if e2]: body; else_body
    set,         // targets = e, or ns.attr = e (attr non-empty), or block set (e null, body)
    break_,
    continue_,
    scope,       // a block rendered as is (transformers' {% generation %})
  };
  kind type = kind::text;
  int line = 1;
  std::string text;
  std::vector<std::string> targets;
  std::string attr;
  expr_ptr e, e2;
  std::vector<std::pair<expr_ptr, body>> branches;
  body inner, else_body;
};

}  // namespace exa::jinja
