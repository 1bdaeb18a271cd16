// The evaluator: walks the statements, keeps jinja2's scoping (a for loop's
// body gets a fresh scope each iteration, `if` does not open one), and
// computes expressions with Python's semantics.
#include "template/template.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "template/ast.hpp"
#include "template/builtins.hpp"
#include "template/lexer.hpp"
#include "template/parser.hpp"
#include "template/pystr.hpp"

namespace exa::jinja {
namespace {

enum class flow { normal, break_, continue_ };

// Propagates an error out of the enclosing function returning expected<...>.
#define EXA_TRY(var, expr)                                   \
  auto var##_r = (expr);                                     \
  if (!var##_r) return std::unexpected(var##_r.error());     \
  auto var = std::move(*var##_r)

class evaluator {
 public:
  evaluator(const template_limits& lim, const dict& vars, std::int64_t now) : lim_(lim) {
    ctx_.string_bytes_max = lim.output_bytes_max;
    ctx_.items_max = lim.items_max;
    ctx_.now_unix_s = now;
    scopes_.emplace_back();
    for (const auto& [k, v] : vars.items()) scopes_.back()[k] = v;
  }

  // Namespaces are the only values that can refer to themselves (ns.me = ns)
  // and so keep each other alive; none outlives a render, so emptying them
  // all at the end breaks every such cycle.
  ~evaluator() {
    for (auto& ns : namespaces_made_) ns.ns_attrs() = dict{};
  }
  evaluator(const evaluator&) = delete;
  evaluator& operator=(const evaluator&) = delete;

  expected<std::string> run(const body& b) {
    auto f = exec_body(b);
    if (!f) return std::unexpected(f.error());
    return std::move(out_);
  }

 private:
  std::unexpected<error> fail(int line, const std::string& what) {
    return make_error(errc::invalid_argument, "chat template line " + std::to_string(line) + ": " + what);
  }

  expected<void> step(int line) {
    if (++steps_ > lim_.steps_max)
      return fail(line, "template ran more than " + std::to_string(lim_.steps_max) + " steps");
    return {};
  }

  // ---- statements ----
  expected<flow> exec_body(const body& b) {
    for (const auto& s : b) {
      EXA_TRY(f, exec(s));
      if (f != flow::normal) return f;
    }
    return flow::normal;
  }

  expected<flow> exec(const stmt& s) {
    if (auto ok = step(s.line); !ok) return std::unexpected(ok.error());
    ctx_.line = s.line;
    switch (s.type) {
      case stmt::kind::text: return emit(s.text, s.line);
      case stmt::kind::output: {
        EXA_TRY(v, eval(*s.e));
        return emit(to_str(v, lim_.output_bytes_max), s.line);
      }
      case stmt::kind::if_:
        for (const auto& [cond, b] : s.branches) {
          EXA_TRY(c, eval(*cond));
          if (c.truthy()) return exec_body(b);
        }
        return exec_body(s.else_body);
      case stmt::kind::for_: return exec_for(s);
      case stmt::kind::set: return exec_set(s);
      case stmt::kind::break_: return flow::break_;
      case stmt::kind::continue_: return flow::continue_;
      case stmt::kind::scope: return exec_body(s.inner);
    }
    return flow::normal;
  }

  expected<flow> emit(const std::string& text, int line) {
    if (out_.size() + text.size() > lim_.output_bytes_max)
      return fail(line, "output exceeds " + std::to_string(lim_.output_bytes_max) + " bytes");
    out_ += text;
    return flow::normal;
  }

  expected<void> bind(const std::vector<std::string>& targets, const value& v, int line) {
    auto& scope = scopes_.back();
    if (targets.size() == 1) {
      scope[targets[0]] = v;
      return {};
    }
    auto items = iterate(v, ctx_);
    if (!items) return std::unexpected(items.error());
    if (items->size() != targets.size())
      return fail(line, (items->size() > targets.size() ? "too many" : "not enough") + std::string(" values to unpack (expected ") +
                            std::to_string(targets.size()) + ", got " + std::to_string(items->size()) + ")");
    for (std::size_t i = 0; i < targets.size(); ++i) scope[targets[i]] = (*items)[i];
    return {};
  }

  expected<flow> exec_for(const stmt& s) {
    EXA_TRY(seq, eval(*s.e));
    EXA_TRY(all, iterate(seq, ctx_));
    list items;
    if (s.e2) {  // `for x in xs if cond`: filtered before the loop, so loop.length counts kept items
      for (const auto& item : all) {
        if (auto ok = step(s.line); !ok) return std::unexpected(ok.error());
        scopes_.emplace_back();
        auto b = bind(s.targets, item, s.line);
        auto keep = b ? eval(*s.e2) : expected<value>(std::unexpected(b.error()));
        scopes_.pop_back();
        if (!keep) return std::unexpected(keep.error());
        if (keep->truthy()) items.push_back(item);
      }
    } else {
      items = std::move(all);
    }
    if (items.empty()) return exec_body(s.else_body);
    const auto n = static_cast<std::int64_t>(items.size());
    for (std::int64_t i = 0; i < n; ++i) {
      if (auto ok = step(s.line); !ok) return std::unexpected(ok.error());
      scopes_.emplace_back();
      auto f = run_iteration(s, items, i);
      scopes_.pop_back();
      if (!f) return f;
      if (*f == flow::break_) break;
    }
    return flow::normal;
  }

  expected<flow> run_iteration(const stmt& s, const list& items, std::int64_t i) {
    const auto n = static_cast<std::int64_t>(items.size());
    const auto at = static_cast<std::size_t>(i);
    if (auto b = bind(s.targets, items[at], s.line); !b) return std::unexpected(b.error());
    dict loop;
    loop.set("index", value(i + 1));
    loop.set("index0", value(i));
    loop.set("revindex", value(n - i));
    loop.set("revindex0", value(n - i - 1));
    loop.set("first", value(i == 0));
    loop.set("last", value(i == n - 1));
    loop.set("length", value(n));
    loop.set("depth", value(std::int64_t{1}));
    loop.set("depth0", value(std::int64_t{0}));
    loop.set("previtem", i > 0 ? items[at - 1] : value::make_undefined("there is no previous item"));
    loop.set("nextitem", i + 1 < n ? items[at + 1] : value::make_undefined("there is no next item"));
    scopes_.back()["loop"] = value(std::move(loop));
    return exec_body(s.inner);
  }

  expected<flow> exec_set(const stmt& s) {
    value v;
    if (s.e) {
      EXA_TRY(x, eval(*s.e));
      v = std::move(x);
    } else {  // block set: the body's output
      std::string saved;
      saved.swap(out_);
      auto f = exec_body(s.inner);
      saved.swap(out_);
      if (!f) return f;
      v = value(std::move(saved));
    }
    if (s.attr.empty()) {
      if (auto b = bind(s.targets, v, s.line); !b) return std::unexpected(b.error());
      return flow::normal;
    }
    const value target = lookup(s.targets[0]);
    if (!target.is_namespace()) return fail(s.line, "cannot assign attribute on non-namespace object");
    if (v.depth() + 1 > lim_.value_depth_max) return fail(s.line, "value nests deeper than " + std::to_string(lim_.value_depth_max));
    target.ns_attrs().set(s.attr, std::move(v));
    return flow::normal;
  }

  value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
      if (auto f = it->find(name); f != it->end()) return f->second;
    return global_value(name);
  }

  // ---- expressions ----
  expected<value> eval(const expr& e) {
    ctx_.line = e.line;
    switch (e.type) {
      case expr::kind::literal: return e.lit;
      case expr::kind::name: return lookup(e.name);
      case expr::kind::list: {
        list l;
        for (const auto& a : e.args) {
          EXA_TRY(v, eval(*a));
          l.push_back(std::move(v));
        }
        return checked(e.name == "tuple" ? value::make_tuple(std::move(l)) : value(std::move(l)), e.line);
      }
      case expr::kind::dict: {
        dict d;
        for (std::size_t i = 0; i + 1 < e.args.size(); i += 2) {
          EXA_TRY(k, eval(*e.args[i]));
          EXA_TRY(v, eval(*e.args[i + 1]));
          if (!k.is_string()) return fail(e.line, "unsupported: dict keys other than strings");
          d.set(k.as_string(), std::move(v));
        }
        return checked(value(std::move(d)), e.line);
      }
      case expr::kind::attr: {
        EXA_TRY(obj, eval(*e.args[0]));
        ctx_.line = e.line;
        return get_attr(obj, e.name, ctx_);
      }
      case expr::kind::item: {
        EXA_TRY(obj, eval(*e.args[0]));
        EXA_TRY(key, eval(*e.args[1]));
        ctx_.line = e.line;
        return get_item(obj, key, ctx_);
      }
      case expr::kind::slice: return eval_slice(e);
      case expr::kind::call: return eval_call(e);
      case expr::kind::filter: {
        EXA_TRY(subject, eval(*e.args[0]));
        EXA_TRY(args, eval_args(e));
        ctx_.line = e.line;
        EXA_TRY(r, apply_filter(e.name, subject, args, ctx_));
        return checked(std::move(r), e.line);
      }
      case expr::kind::test: {
        EXA_TRY(subject, eval(*e.args[0]));
        EXA_TRY(args, eval_args(e));
        ctx_.line = e.line;
        EXA_TRY(r, apply_test(e.name, subject, args, ctx_));
        return value(r != e.negated);
      }
      case expr::kind::unary: return eval_unary(e);
      case expr::kind::binary: return eval_binary(e);
      case expr::kind::compare: return eval_compare(e);
      case expr::kind::cond: {
        EXA_TRY(c, eval(*e.args[0]));
        if (c.truthy()) return eval(*e.args[1]);
        if (e.args[2]) return eval(*e.args[2]);
        return value::make_undefined("the inline if-expression evaluated to false and no else section was defined");
      }
    }
    return fail(e.line, "internal: unknown expression");
  }

  /// Applies the size bounds to a value just built.
  expected<value> checked(value v, int line) {
    if (v.is_string() && v.as_string().size() > lim_.output_bytes_max)
      return fail(line, "string exceeds " + std::to_string(lim_.output_bytes_max) + " bytes");
    if (v.is_list() && v.as_list().size() > lim_.items_max)
      return fail(line, "list exceeds " + std::to_string(lim_.items_max) + " items");
    if (v.depth() > lim_.value_depth_max) return fail(line, "value nests deeper than " + std::to_string(lim_.value_depth_max));
    return v;
  }

  expected<call_args> eval_args(const expr& e) {
    call_args a;
    const std::size_t n_kw = e.kwarg_names.size();
    const std::size_t n_pos = e.args.size() - 1 - n_kw;
    for (std::size_t i = 0; i < n_pos; ++i) {
      EXA_TRY(v, eval(*e.args[1 + i]));
      a.pos.push_back(std::move(v));
    }
    for (std::size_t i = 0; i < n_kw; ++i) {
      EXA_TRY(v, eval(*e.args[1 + n_pos + i]));
      a.kw.emplace_back(e.kwarg_names[i], std::move(v));
    }
    return a;
  }

  expected<value> eval_call(const expr& e) {
    EXA_TRY(callee, eval(*e.args[0]));
    EXA_TRY(args, eval_args(e));
    ctx_.line = e.line;
    if (callee.is_undefined()) return fail(e.line, callee.undefined_hint());
    if (!callee.is_function()) return fail(e.line, "'" + std::string(callee.type_name()) + "' object is not callable");
    if (callee.as_function().name == "namespace" && !callee.as_function().self && ++namespaces_ > lim_.namespaces_max)
      return fail(e.line, "more than " + std::to_string(lim_.namespaces_max) + " namespace() calls");
    EXA_TRY(r, call_function(callee.as_function(), args, ctx_));
    if (r.is_namespace()) namespaces_made_.push_back(r);
    return checked(std::move(r), e.line);
  }

  expected<value> eval_slice(const expr& e) {
    EXA_TRY(obj, eval(*e.args[0]));
    std::optional<std::int64_t> part[3];
    for (int i = 0; i < 3; ++i) {
      if (!e.args[1 + i]) continue;
      EXA_TRY(v, eval(*e.args[1 + i]));
      if (v.is_none()) continue;
      if (!v.is_int()) return fail(e.line, "slice indices must be integers or None");
      part[i] = v.as_int();
    }
    const std::int64_t step = part[2].value_or(1);
    if (step == 0) return fail(e.line, "slice step cannot be zero");
    if (obj.is_undefined()) return fail(e.line, obj.undefined_hint());
    if (!obj.is_list() && !obj.is_string()) return fail(e.line, "'" + std::string(obj.type_name()) + "' object is not subscriptable");
    const auto cps = obj.is_string() ? pystr::decode(obj.as_string()) : std::vector<std::uint32_t>{};
    const auto n = static_cast<std::int64_t>(obj.is_string() ? cps.size() : obj.as_list().size());
    // Python's slice.indices(): clamp, with the defaults depending on the step's sign.
    auto clamp = [&](std::optional<std::int64_t> x, std::int64_t def) {
      if (!x) return def;
      std::int64_t v = *x < 0 ? *x + n : *x;
      if (step > 0) return std::clamp<std::int64_t>(v, 0, n);
      return std::clamp<std::int64_t>(v, -1, n - 1);
    };
    const std::int64_t start = clamp(part[0], step > 0 ? 0 : n - 1);
    const std::int64_t stop = clamp(part[1], step > 0 ? n : -1);
    std::vector<std::int64_t> picks;
    for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) picks.push_back(i);
    if (obj.is_string()) {
      std::vector<std::uint32_t> out;
      for (auto i : picks) out.push_back(cps[static_cast<std::size_t>(i)]);
      return value(pystr::encode(out));
    }
    list out;
    for (auto i : picks) out.push_back(obj.as_list()[static_cast<std::size_t>(i)]);
    return obj.is_tuple() ? value::make_tuple(std::move(out)) : value(std::move(out));
  }

  expected<value> eval_unary(const expr& e) {
    EXA_TRY(v, eval(*e.args[0]));
    if (e.name == "not") return value(!v.truthy());
    if (v.is_undefined()) return fail(e.line, v.undefined_hint());
    if (!v.is_number()) return fail(e.line, "bad operand type for unary " + e.name + ": '" + std::string(v.type_name()) + "'");
    if (e.name == "+") return v.is_bool() ? value(v.as_int()) : v;
    if (v.type() == value::kind::floating) return value(-v.as_double());
    if (v.as_int() == std::numeric_limits<std::int64_t>::min()) return fail(e.line, "integer overflow");
    return value(-v.as_int());
  }

  expected<value> eval_binary(const expr& e) {
    EXA_TRY(a, eval(*e.args[0]));
    if (e.name == "and") return a.truthy() ? eval(*e.args[1]) : expected<value>(a);
    if (e.name == "or") return a.truthy() ? expected<value>(a) : eval(*e.args[1]);
    EXA_TRY(b, eval(*e.args[1]));
    ctx_.line = e.line;
    if (e.name == "~") {
      std::string s = to_str(a, lim_.output_bytes_max);
      s += to_str(b, lim_.output_bytes_max);
      return checked(value(std::move(s)), e.line);
    }
    if (a.is_undefined()) return fail(e.line, a.undefined_hint());
    if (b.is_undefined()) return fail(e.line, b.undefined_hint());
    EXA_TRY(r, arithmetic(e.name, a, b, e.line));
    return checked(std::move(r), e.line);
  }

  expected<value> arithmetic(const std::string& op, const value& a, const value& b, int line) {
    if (a.is_number() && b.is_number()) return numeric(op, a, b, line);
    if (op == "+") {
      if (a.is_string() && b.is_string()) {
        if (a.as_string().size() + b.as_string().size() > lim_.output_bytes_max) return fail(line, "string too long");
        return value(a.as_string() + b.as_string());
      }
      if (a.is_list() && b.is_list()) {
        if (a.as_list().size() + b.as_list().size() > lim_.items_max) return fail(line, "list too long");
        list l = a.as_list();
        l.insert(l.end(), b.as_list().begin(), b.as_list().end());
        return value(std::move(l));
      }
      if (a.is_string())
        return fail(line, "can only concatenate str (not \"" + std::string(b.type_name()) + "\") to str");
      if (a.is_list())
        return fail(line, "can only concatenate list (not \"" + std::string(b.type_name()) + "\") to list");
    }
    if (op == "*" && (a.is_string() || a.is_list() || b.is_string() || b.is_list())) {
      const value& seq = (a.is_string() || a.is_list()) ? a : b;
      const value& times = (a.is_string() || a.is_list()) ? b : a;
      if (times.is_int() && !times.is_bool()) return repeat(seq, times.as_int(), line);
      if (times.is_bool()) return repeat(seq, times.as_int(), line);
    }
    if (op == "%" && a.is_string()) return fail(line, "unsupported: printf-style string formatting with '%'");
    return fail(line, "unsupported operand type(s) for " + op + ": '" + std::string(a.type_name()) + "' and '" +
                          std::string(b.type_name()) + "'");
  }

  expected<value> repeat(const value& seq, std::int64_t n, int line) {
    if (n <= 0) return seq.is_string() ? value(std::string()) : value(list{});
    const std::size_t unit = seq.is_string() ? seq.as_string().size() : seq.as_list().size();
    const std::size_t bound = seq.is_string() ? lim_.output_bytes_max : lim_.items_max;
    if (unit != 0 && static_cast<std::uint64_t>(n) > bound / unit) return fail(line, "repetition result too large");
    if (seq.is_string()) {
      std::string s;
      for (std::int64_t i = 0; i < n; ++i) s += seq.as_string();
      return value(std::move(s));
    }
    list l;
    for (std::int64_t i = 0; i < n; ++i) l.insert(l.end(), seq.as_list().begin(), seq.as_list().end());
    return value(std::move(l));
  }

  expected<value> numeric(const std::string& op, const value& a, const value& b, int line) {
    const bool ints = a.type() != value::kind::floating && b.type() != value::kind::floating;
    if (op == "/") {
      if (b.as_double() == 0) return fail(line, "division by zero");
      return value(a.as_double() / b.as_double());
    }
    if (ints) {
      const std::int64_t x = a.as_int(), y = b.as_int();
      std::int64_t r = 0;
      if (op == "+" && !__builtin_add_overflow(x, y, &r)) return value(r);
      if (op == "-" && !__builtin_sub_overflow(x, y, &r)) return value(r);
      if (op == "*" && !__builtin_mul_overflow(x, y, &r)) return value(r);
      if (op == "//" || op == "%") {
        if (y == 0) return fail(line, "integer division or modulo by zero");
        if (x == std::numeric_limits<std::int64_t>::min() && y == -1) return fail(line, "integer overflow");
        std::int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) { q -= 1; m += y; }  // Python floors
        return value(op == "//" ? q : m);
      }
      if (op == "**") {
        if (y < 0) return value(std::pow(static_cast<double>(x), static_cast<double>(y)));
        std::int64_t acc = 1;
        for (std::int64_t i = 0; i < y; ++i)
          if (__builtin_mul_overflow(acc, x, &acc)) return fail(line, "integer overflow");
          else if (acc == 0 || acc == 1) break;
        return value(acc);
      }
      if (op == "+" || op == "-" || op == "*") return fail(line, "integer overflow");
    }
    const double x = a.as_double(), y = b.as_double();
    if (op == "+") return value(x + y);
    if (op == "-") return value(x - y);
    if (op == "*") return value(x * y);
    if (op == "**") return value(std::pow(x, y));
    if (y == 0) return fail(line, "float division by zero");
    if (op == "//") return value(std::floor(x / y));
    if (op == "%") {
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return value(m);
    }
    return fail(line, "unsupported operator " + op);
  }

  expected<value> eval_compare(const expr& e) {
    EXA_TRY(left, eval(*e.args[0]));
    for (std::size_t i = 0; i < e.ops.size(); ++i) {
      EXA_TRY(right, eval(*e.args[i + 1]));
      EXA_TRY(ok, compare(e.ops[i], left, right, e.line));
      if (!ok) return value(false);
      left = std::move(right);
    }
    return value(true);
  }

  expected<bool> compare(const std::string& op, const value& a, const value& b, int line) {
    if (op == "==") return equals(a, b);
    if (op == "!=") return !equals(a, b);
    if (op == "in" || op == "notin") {
      EXA_TRY(r, contains(b, a, line));
      return op == "in" ? r : !r;
    }
    if (a.is_undefined() || b.is_undefined()) return fail(line, (a.is_undefined() ? a : b).undefined_hint());
    int c = 0;
    if (a.is_number() && b.is_number()) c = a.as_double() < b.as_double() ? -1 : a.as_double() > b.as_double() ? 1 : 0;
    else if (a.is_string() && b.is_string()) c = a.as_string().compare(b.as_string());
    else
      return fail(line, "'" + op + "' not supported between instances of '" + std::string(a.type_name()) + "' and '" +
                            std::string(b.type_name()) + "'");
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
  }

  expected<bool> contains(const value& hay, const value& needle, int line) {
    if (hay.is_string()) {
      if (!needle.is_string()) return fail(line, "'in <string>' requires string as left operand, not " + std::string(needle.type_name()));
      return hay.as_string().find(needle.as_string()) != std::string::npos;
    }
    if (hay.is_dict()) return needle.is_string() && hay.as_dict().find(needle.as_string()) != nullptr;
    if (hay.is_list()) {
      for (const auto& x : hay.as_list())
        if (equals(x, needle)) return true;
      return false;
    }
    if (hay.is_undefined()) return false;
    return fail(line, "argument of type '" + std::string(hay.type_name()) + "' is not iterable");
  }

  const template_limits& lim_;
  builtin_context ctx_;
  std::vector<std::unordered_map<std::string, value>> scopes_;
  std::string out_;
  std::size_t steps_ = 0;
  std::size_t namespaces_ = 0;
  std::vector<value> namespaces_made_;
};

#undef EXA_TRY

}  // namespace

expected<compiled_template> compiled_template::compile(std::string_view source, const template_limits& limits) {
  if (source.size() > limits.source_bytes_max)
    return make_error(errc::invalid_argument, "chat template is larger than " + std::to_string(limits.source_bytes_max) + " bytes");
  auto tokens = tokenize(source, limits.tokens_max);
  if (!tokens) return std::unexpected(tokens.error());
  auto b = parse(*tokens, limits.depth_max);
  if (!b) return std::unexpected(b.error());
  compiled_template t;
  t.body_ = std::make_shared<const body>(std::move(*b));
  t.limits_ = limits;
  return t;
}

expected<std::string> compiled_template::render(const dict& variables, std::int64_t now_unix_s) const {
  if (!body_) return make_error(errc::internal, "render() on a template that was never compiled");
  return evaluator(limits_, variables, now_unix_s).run(*body_);
}

}  // namespace exa::jinja
