#include "template/parser.hpp"

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <string_view>

namespace exa::jinja {
namespace {

using tk = token::kind;

class parser {
 public:
  parser(const std::vector<token>& t, std::size_t depth_max) : t_(t), depth_max_(depth_max) {}

  expected<body> run() {
    std::string end;
    body b = parse_until({}, end);
    if (err_) return std::unexpected(*err_);
    return b;
  }

 private:
  // ---- helpers ----
  const token& peek(std::size_t ahead = 0) const { return t_[std::min(pos_ + ahead, t_.size() - 1)]; }
  const token& next() { const token& t = peek(); if (pos_ < t_.size() - 1) ++pos_; return t; }
  bool at_op(std::string_view op, std::size_t ahead = 0) const { return peek(ahead).type == tk::op && peek(ahead).text == op; }
  bool at_name(std::string_view n, std::size_t ahead = 0) const { return peek(ahead).type == tk::name && peek(ahead).text == n; }
  bool skip_op(std::string_view op) { if (!at_op(op)) return false; next(); return true; }
  bool skip_name(std::string_view n) { if (!at_name(n)) return false; next(); return true; }

  std::nullptr_t fail(int line, const std::string& what, errc code = errc::invalid_argument) {
    if (!err_) err_ = error{code, "chat template line " + std::to_string(line) + ": " + what};
    return nullptr;
  }
  static std::string describe(const token& t) {
    switch (t.type) {
      case tk::eof: return "end of template";
      case tk::var_end: return "'}}'";
      case tk::block_end: return "'%}'";
      case tk::text: return "text";
      case tk::string: return "a string";
      default: return "'" + t.text + "'";
    }
  }
  bool expect_op(std::string_view op) {
    if (skip_op(op)) return true;
    fail(peek().line, "expected '" + std::string(op) + "', found " + describe(peek()));
    return false;
  }
  bool expect(tk kind, std::string_view what) {
    if (peek().type == kind) { next(); return true; }
    fail(peek().line, "expected " + std::string(what) + ", found " + describe(peek()));
    return false;
  }
  std::optional<std::string> expect_name() {
    if (peek().type == tk::name) return next().text;
    fail(peek().line, "expected a name, found " + describe(peek()));
    return std::nullopt;
  }

  static expr_ptr node(expr::kind k, int line) {
    auto e = std::make_unique<expr>();
    e->type = k;
    e->line = line;
    return e;
  }

  // ---- statements ----
  body parse_until(std::initializer_list<std::string_view> ends, std::string& which) {
    body out;
    while (!err_) {
      const token& t = peek();
      if (t.type == tk::eof) {
        if (ends.size() != 0) fail(t.line, "missing '" + std::string(*(ends.end() - 1)) + "'");
        return out;
      }
      if (t.type == tk::text) {
        stmt s;
        s.type = stmt::kind::text;
        s.line = t.line;
        s.text = next().text;
        out.push_back(std::move(s));
      } else if (t.type == tk::var_begin) {
        next();
        stmt s;
        s.type = stmt::kind::output;
        s.line = t.line;
        s.e = parse_expression(true);
        if (!err_) expect(tk::var_end, "'}}'");
        out.push_back(std::move(s));
      } else if (t.type == tk::block_begin) {
        next();
        const token& kw = peek();
        if (kw.type != tk::name) {
          fail(kw.line, "expected a statement name, found " + describe(kw));
          return out;
        }
        if (std::find(ends.begin(), ends.end(), kw.text) != ends.end()) {
          which = next().text;
          return out;
        }
        if (++depth_ > depth_max_) {
          fail(kw.line, "blocks nested deeper than " + std::to_string(depth_max_));
          return out;
        }
        out.push_back(parse_statement());
        --depth_;
      } else {
        fail(t.line, "unexpected " + describe(t));
      }
    }
    return out;
  }

  stmt parse_statement() {
    const token& kw = next();
    stmt s;
    s.line = kw.line;
    const std::string& k = kw.text;
    if (k == "if") return parse_if(std::move(s));
    if (k == "for") return parse_for(std::move(s));
    if (k == "set") return parse_set(std::move(s));
    if (k == "break" || k == "continue") {
      s.type = k == "break" ? stmt::kind::break_ : stmt::kind::continue_;
      if (loop_depth_ == 0) fail(kw.line, "'" + k + "' outside a loop");
      expect(tk::block_end, "'%}'");
      return s;
    }
    if (k == "generation") {  // transformers' AssistantTracker marks; renders its body as is
      s.type = stmt::kind::scope;
      std::string end;
      if (expect(tk::block_end, "'%}'")) s.inner = parse_until({"endgeneration"}, end);
      if (!err_) expect(tk::block_end, "'%}'");
      return s;
    }
    static constexpr std::string_view known[] = {"macro", "call", "filter", "raw", "include", "import", "from",
                                                 "extends", "block", "with", "autoescape", "do", "endmacro"};
    if (std::find(std::begin(known), std::end(known), k) != std::end(known))
      fail(kw.line, "unsupported statement '" + k + "'", errc::unsupported);
    else
      fail(kw.line, "unknown statement '" + k + "'");
    return s;
  }

  stmt parse_if(stmt s) {
    s.type = stmt::kind::if_;
    std::string which = "elif";
    while (which == "elif" && !err_) {
      expr_ptr cond = parse_expression(true);
      if (!expect(tk::block_end, "'%}'")) return s;
      body b = parse_until({"elif", "else", "endif"}, which);
      s.branches.emplace_back(std::move(cond), std::move(b));
    }
    if (which == "else" && !err_) {
      if (!expect(tk::block_end, "'%}'")) return s;
      s.else_body = parse_until({"endif"}, which);
    }
    if (!err_) expect(tk::block_end, "'%}'");
    return s;
  }

  stmt parse_for(stmt s) {
    s.type = stmt::kind::for_;
    do {
      auto n = expect_name();
      if (!n) return s;
      s.targets.push_back(*n);
    } while (skip_op(","));
    if (!skip_name("in")) {
      fail(peek().line, "expected 'in', found " + describe(peek()));
      return s;
    }
    s.e = parse_expression(false);  // no ternary here: `for x in xs if c` filters
    if (skip_name("if")) s.e2 = parse_expression(true);
    if (at_name("recursive")) {
      fail(peek().line, "unsupported loop modifier 'recursive'", errc::unsupported);
      return s;
    }
    if (!expect(tk::block_end, "'%}'")) return s;
    std::string which;
    ++loop_depth_;
    s.inner = parse_until({"else", "endfor"}, which);
    --loop_depth_;
    if (which == "else" && !err_) {
      if (!expect(tk::block_end, "'%}'")) return s;
      s.else_body = parse_until({"endfor"}, which);
    }
    if (!err_) expect(tk::block_end, "'%}'");
    return s;
  }

  stmt parse_set(stmt s) {
    s.type = stmt::kind::set;
    auto n = expect_name();
    if (!n) return s;
    s.targets.push_back(*n);
    if (skip_op(".")) {
      auto a = expect_name();
      if (!a) return s;
      s.attr = *a;
    } else {
      while (skip_op(",")) {
        auto m = expect_name();
        if (!m) return s;
        s.targets.push_back(*m);
      }
    }
    if (peek().type == tk::block_end && s.targets.size() == 1 && s.attr.empty()) {
      next();  // {% set x %}...{% endset %}
      std::string which;
      s.inner = parse_until({"endset"}, which);
      if (!err_) expect(tk::block_end, "'%}'");
      return s;
    }
    if (!expect_op("=")) return s;
    s.e = parse_tuple_or_expression();
    if (!err_) expect(tk::block_end, "'%}'");
    return s;
  }

  // ---- expressions ----
  expr_ptr parse_tuple_or_expression() {
    const int line = peek().line;
    expr_ptr first = parse_expression(true);
    if (!at_op(",")) return first;
    auto t = node(expr::kind::list, line);
    t->name = "tuple";
    t->args.push_back(std::move(first));
    while (skip_op(",") && !err_) {
      if (peek().type == tk::block_end) break;
      t->args.push_back(parse_expression(true));
    }
    return t;
  }

  struct depth_guard {
    parser& p;
    bool ok;
    explicit depth_guard(parser& pp) : p(pp), ok(++pp.depth_ <= pp.depth_max_) {
      if (!ok) p.fail(p.peek().line, "expression nested deeper than " + std::to_string(p.depth_max_));
    }
    ~depth_guard() { --p.depth_; }
  };

  expr_ptr parse_expression(bool allow_cond) {
    depth_guard g(*this);
    if (!g.ok) return nullptr;
    expr_ptr e = parse_or();
    while (allow_cond && at_name("if") && !err_) {
      const int line = next().line;
      auto c = node(expr::kind::cond, line);
      c->args.push_back(parse_or());
      c->args.push_back(std::move(e));
      c->args.push_back(skip_name("else") ? parse_expression(true) : nullptr);
      e = std::move(c);
    }
    return e;
  }

  expr_ptr binary(std::string op, expr_ptr a, expr_ptr b, int line) {
    auto n = node(expr::kind::binary, line);
    n->name = std::move(op);
    n->args.push_back(std::move(a));
    n->args.push_back(std::move(b));
    return n;
  }

  expr_ptr parse_or() {
    expr_ptr e = parse_and();
    while (at_name("or") && !err_) { const int l = next().line; e = binary("or", std::move(e), parse_and(), l); }
    return e;
  }
  expr_ptr parse_and() {
    expr_ptr e = parse_not();
    while (at_name("and") && !err_) { const int l = next().line; e = binary("and", std::move(e), parse_not(), l); }
    return e;
  }
  expr_ptr parse_not() {
    if (at_name("not")) {
      depth_guard g(*this);
      if (!g.ok) return nullptr;
      auto n = node(expr::kind::unary, next().line);
      n->name = "not";
      n->args.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }
  expr_ptr parse_compare() {
    const int line = peek().line;
    expr_ptr first = parse_math1();
    expr_ptr cmp;
    while (!err_) {
      std::string op;
      if (peek().type == tk::op && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                    peek().text == "<=" || peek().text == ">" || peek().text == ">=")) {
        op = next().text;
      } else if (at_name("in")) {
        next();
        op = "in";
      } else if (at_name("not") && at_name("in", 1)) {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(expr::kind::compare, line);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  expr_ptr parse_math1() {
    expr_ptr e = parse_concat();
    while ((at_op("+") || at_op("-")) && !err_) {
      const token& t = next();
      e = binary(t.text, std::move(e), parse_concat(), t.line);
    }
    return e;
  }
  expr_ptr parse_concat() {
    expr_ptr e = parse_math2();
    while (at_op("~") && !err_) { const int l = next().line; e = binary("~", std::move(e), parse_math2(), l); }
    return e;
  }
  expr_ptr parse_math2() {
    expr_ptr e = parse_pow();
    while ((at_op("*") || at_op("/") || at_op("//") || at_op("%")) && !err_) {
      const token& t = next();
      e = binary(t.text, std::move(e), parse_pow(), t.line);
    }
    return e;
  }
  expr_ptr parse_pow() {
    expr_ptr e = parse_unary(true);
    while (at_op("**") && !err_) { const int l = next().line; e = binary("**", std::move(e), parse_unary(true), l); }
    return e;
  }
  expr_ptr parse_unary(bool with_filter) {
    depth_guard g(*this);
    if (!g.ok) return nullptr;
    expr_ptr e;
    if (at_op("-") || at_op("+")) {
      const token& t = next();
      e = node(expr::kind::unary, t.line);
      e->name = t.text;
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_postfix(parse_primary());
    }
    return with_filter ? parse_filter_expr(std::move(e)) : std::move(e);
  }

  expr_ptr parse_primary() {
    const token& t = peek();
    switch (t.type) {
      case tk::name: {
        next();
        if (t.text == "true" || t.text == "True") return literal(value(true), t.line);
        if (t.text == "false" || t.text == "False") return literal(value(false), t.line);
        if (t.text == "none" || t.text == "None") return literal(value(none_t{}), t.line);
        auto n = node(expr::kind::name, t.line);
        n->name = t.text;
        return n;
      }
      case tk::string: {
        std::string s;
        while (peek().type == tk::string) s += next().text;  // adjacent literals join, as in Python
        return literal(value(std::move(s)), t.line);
      }
      case tk::integer: next(); return literal(value(t.int_value), t.line);
      case tk::floating: next(); return literal(value(t.float_value), t.line);
      case tk::op:
        if (t.text == "(") return parse_paren();
        if (t.text == "[") return parse_list();
        if (t.text == "{") return parse_dict();
        [[fallthrough]];
      default: return fail(t.line, "unexpected " + describe(t) + " in an expression");
    }
  }
  expr_ptr literal(value v, int line) {
    auto n = node(expr::kind::literal, line);
    n->lit = std::move(v);
    return n;
  }
  expr_ptr parse_paren() {
    const int line = next().line;
    if (skip_op(")")) {  // ()
      auto t = node(expr::kind::list, line);
      t->name = "tuple";
      return t;
    }
    expr_ptr e = parse_expression(true);
    if (at_op(",")) {
      auto t = node(expr::kind::list, line);
      t->name = "tuple";
      t->args.push_back(std::move(e));
      while (skip_op(",") && !at_op(")") && !err_) t->args.push_back(parse_expression(true));
      e = std::move(t);
    }
    expect_op(")");
    return e;
  }
  expr_ptr parse_list() {
    auto l = node(expr::kind::list, next().line);
    while (!at_op("]") && !err_) {
      l->args.push_back(parse_expression(true));
      if (!skip_op(",")) break;
    }
    expect_op("]");
    return l;
  }
  expr_ptr parse_dict() {
    auto d = node(expr::kind::dict, next().line);
    while (!at_op("}") && !err_) {
      d->args.push_back(parse_expression(true));
      if (!expect_op(":")) return nullptr;
      d->args.push_back(parse_expression(true));
      if (!skip_op(",")) break;
    }
    expect_op("}");
    return d;
  }

  expr_ptr parse_postfix(expr_ptr e) {
    while (!err_) {
      if (at_op(".")) {
        const int line = next().line;
        const token& t = next();
        if (t.type == tk::name) {
          auto a = node(expr::kind::attr, line);
          a->name = t.text;
          a->args.push_back(std::move(e));
          e = std::move(a);
        } else if (t.type == tk::integer) {
          auto i = node(expr::kind::item, line);
          i->args.push_back(std::move(e));
          i->args.push_back(literal(value(t.int_value), line));
          e = std::move(i);
        } else {
          return fail(t.line, "expected an attribute name after '.', found " + describe(t));
        }
      } else if (at_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (at_op("(")) {
        e = parse_call(std::move(e), expr::kind::call, "");
      } else {
        break;
      }
    }
    return e;
  }
  expr_ptr parse_subscript(expr_ptr obj) {
    const int line = next().line;
    expr_ptr parts[3];
    bool is_slice = false;
    if (!at_op(":")) parts[0] = parse_expression(true);
    if (skip_op(":")) {
      is_slice = true;
      if (!at_op("]") && !at_op(":")) parts[1] = parse_expression(true);
      if (skip_op(":") && !at_op("]")) parts[2] = parse_expression(true);
    }
    if (!expect_op("]")) return nullptr;
    auto n = node(is_slice ? expr::kind::slice : expr::kind::item, line);
    n->args.push_back(std::move(obj));
    n->args.push_back(std::move(parts[0]));
    if (is_slice) {
      n->args.push_back(std::move(parts[1]));
      n->args.push_back(std::move(parts[2]));
    }
    return n;
  }
  /// `(a, b, k=v)` after a callee, filter or test; `args[0]` is the subject.
  expr_ptr parse_call(expr_ptr subject, expr::kind k, std::string name) {
    auto c = node(k, peek().line);
    c->name = std::move(name);
    c->args.push_back(std::move(subject));
    if (!skip_op("(")) return c;
    while (!at_op(")") && !err_) {
      if (peek().type == tk::name && at_op("=", 1)) {
        c->kwarg_names.push_back(next().text);
        next();
        c->args.push_back(parse_expression(true));
      } else {
        if (!c->kwarg_names.empty()) return fail(peek().line, "positional argument after a keyword argument");
        c->args.push_back(parse_expression(true));
      }
      if (!skip_op(",")) break;
    }
    expect_op(")");
    return c;
  }
  expr_ptr parse_filter_expr(expr_ptr e) {
    while (!err_) {
      if (at_op("|")) {
        next();
        auto n = expect_name();
        if (!n) return nullptr;
        e = parse_call(std::move(e), expr::kind::filter, *n);
      } else if (at_name("is")) {
        next();
        const bool negated = skip_name("not");
        auto n = expect_name();
        if (!n) return nullptr;
        const token& t = peek();
        const bool bare_arg = (t.type == tk::name && t.text != "else" && t.text != "or" && t.text != "and") ||
                              t.type == tk::string || t.type == tk::integer || t.type == tk::floating ||
                              at_op("[") || at_op("{");
        if (bare_arg) {  // `x is divisibleby 3`, `x is sameas false`
          auto c = node(expr::kind::test, t.line);
          c->name = *n;
          c->args.push_back(std::move(e));
          c->args.push_back(parse_postfix(parse_primary()));
          e = std::move(c);
        } else {
          e = parse_call(std::move(e), expr::kind::test, *n);
        }
        e->negated = negated;
      } else if (at_op("(")) {
        e = parse_call(std::move(e), expr::kind::call, "");
      } else {
        break;
      }
    }
    return e;
  }

  const std::vector<token>& t_;
  std::size_t pos_ = 0;
  std::size_t depth_ = 0;
  std::size_t depth_max_;
  int loop_depth_ = 0;
  std::optional<error> err_;
};

}  // namespace

expected<body> parse(const std::vector<token>& tokens, std::size_t depth_max) {
  if (tokens.empty()) return body{};
  return parser(tokens, depth_max).run();
}

}  // namespace exa::jinja
