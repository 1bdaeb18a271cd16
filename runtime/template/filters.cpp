// jinja2's filters and tests, as transformers' environment has them (its
// `tojson` replaced by a json.dumps with ensure_ascii=False).
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "template/builtins.hpp"
#include "template/pystr.hpp"
#include "template/value_json.hpp"

namespace exa::jinja {
namespace {

using filter_fn = expected<value> (*)(const value&, const call_args&, const builtin_context&);

std::string str_of(const value& v, const builtin_context& ctx) { return to_str(v, ctx.string_bytes_max); }

/// Looks up a dotted attribute path ("function.name") the way jinja2's
/// attribute getters do: item first, then attribute, per part.
expected<value> attr_path(const value& obj, const std::string& path, const builtin_context& ctx) {
  value cur = obj;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    value key(part);
    if (!part.empty() && part.size() <= 18 && part.find_first_not_of("0123456789") == std::string::npos)
      key = value(std::int64_t(std::stoll(part)));
    auto next = get_item(cur, key, ctx);
    if (!next) return next;
    cur = std::move(*next);
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

expected<value> f_tojson(const value& v, const call_args& a, const builtin_context& ctx) {
  json_format fmt;
  if (const value* ind = a.get(0, "indent"); ind && !ind->is_none()) {
    if (ind->is_int()) {
      if (ind->as_int() < 0 || ind->as_int() > 64) return ctx.fail("tojson indent out of range");
      fmt.indent = std::string(static_cast<std::size_t>(ind->as_int()), ' ');
    } else if (ind->is_string()) {
      fmt.indent = ind->as_string();
    } else {
      return ctx.fail("tojson indent must be an int or a string");
    }
  }
  if (const value* sep = a.get(SIZE_MAX, "separators"); sep && !sep->is_none()) {
    if (!sep->is_list() || sep->as_list().size() != 2 || !sep->as_list()[0].is_string() || !sep->as_list()[1].is_string())
      return ctx.fail("tojson separators must be a pair of strings");
    fmt.separators = std::pair{sep->as_list()[0].as_string(), sep->as_list()[1].as_string()};
  }
  if (const value* sk = a.get(SIZE_MAX, "sort_keys")) fmt.sort_keys = sk->truthy();
  auto out = to_json(v, fmt, ctx.string_bytes_max);
  if (!out) return ctx.fail(out.error().message);
  return value(std::move(*out));
}

expected<value> f_trim(const value& v, const call_args& a, const builtin_context& ctx) {
  const value* chars = a.get(0, "chars");
  std::optional<std::string> set;
  if (chars && chars->is_string()) set = chars->as_string();
  return value(pystr::strip(str_of(v, ctx), set, true, true));
}

expected<value> f_length(const value& v, const call_args&, const builtin_context& ctx) {
  auto n = length_of(v, ctx);
  if (!n) return std::unexpected(n.error());
  return value(*n);
}

expected<value> f_default(const value& v, const call_args& a, const builtin_context&) {
  const value* def = a.get(0, "default_value");
  const value* boolean = a.get(1, "boolean");
  const bool use_default = v.is_undefined() || (boolean && boolean->truthy() && !v.truthy());
  if (!use_default) return v;
  return def ? *def : value(std::string());
}

expected<value> f_join(const value& v, const call_args& a, const builtin_context& ctx) {
  auto items = iterate(v, ctx);
  if (!items) return std::unexpected(items.error());
  const value* sep = a.get(0, "d");
  const value* attr = a.get(1, "attribute");
  std::string out;
  for (std::size_t i = 0; i < items->size(); ++i) {
    if (i && sep) out += str_of(*sep, ctx);
    value item = (*items)[i];
    if (attr && attr->is_string()) {
      auto x = attr_path(item, attr->as_string(), ctx);
      if (!x) return std::unexpected(x.error());
      item = std::move(*x);
    }
    out += str_of(item, ctx);
    if (out.size() > ctx.string_bytes_max) return ctx.fail("join result exceeds " + std::to_string(ctx.string_bytes_max) + " bytes");
  }
  return value(std::move(out));
}

expected<value> f_first_last(const value& v, bool first, const builtin_context& ctx) {
  auto items = iterate(v, ctx);
  if (!items) return std::unexpected(items.error());
  if (items->empty()) return value::make_undefined("No " + std::string(first ? "first" : "last") + " item, sequence was empty.");
  return first ? items->front() : items->back();
}
expected<value> f_first(const value& v, const call_args&, const builtin_context& c) { return f_first_last(v, true, c); }
expected<value> f_last(const value& v, const call_args&, const builtin_context& c) { return f_first_last(v, false, c); }

expected<value> f_list(const value& v, const call_args&, const builtin_context& ctx) {
  auto items = iterate(v, ctx);
  if (!items) return std::unexpected(items.error());
  return value(std::move(*items));
}

expected<value> f_string(const value& v, const call_args&, const builtin_context& ctx) { return value(str_of(v, ctx)); }
expected<value> f_safe(const value& v, const call_args&, const builtin_context&) { return v; }
expected<value> f_upper(const value& v, const call_args&, const builtin_context& ctx) { return value(pystr::upper(str_of(v, ctx))); }
expected<value> f_lower(const value& v, const call_args&, const builtin_context& ctx) { return value(pystr::lower(str_of(v, ctx))); }
expected<value> f_capitalize(const value& v, const call_args&, const builtin_context& ctx) {
  return value(pystr::capitalize(str_of(v, ctx)));
}

expected<value> f_title(const value& v, const call_args&, const builtin_context& ctx) {
  // jinja2's own title: words begin after '-', whitespace or an opening bracket.
  const std::string s = str_of(v, ctx);
  std::string out;
  bool word_start = true;
  for (char c : s) {
    const bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || pystr::is_space(static_cast<unsigned char>(c));
    if (sep) { out += c; word_start = true; continue; }
    out += word_start ? pystr::upper(std::string(1, c)) : pystr::lower(std::string(1, c));
    word_start = false;
  }
  return value(std::move(out));
}

expected<value> f_int(const value& v, const call_args& a, const builtin_context& ctx) {
  const value* def = a.get(0, "default");
  const value fallback = def ? *def : value(std::int64_t{0});
  if (v.is_int()) return value(v.as_int());
  if (v.type() == value::kind::floating) {
    if (!std::isfinite(v.as_double())) return fallback;
    return value(static_cast<std::int64_t>(v.as_double()));
  }
  if (!v.is_string()) return fallback;
  const std::string s = pystr::strip(v.as_string(), std::nullopt, true, true);
  if (s.empty()) return fallback;
  errno = 0;
  char* end = nullptr;
  const long long i = std::strtoll(s.c_str(), &end, 10);
  if (errno == 0 && end == s.c_str() + s.size()) return value(std::int64_t{i});
  const double d = std::strtod(s.c_str(), &end);
  if (end == s.c_str() + s.size() && std::isfinite(d)) return value(static_cast<std::int64_t>(d));
  (void)ctx;
  return fallback;
}

expected<value> f_float(const value& v, const call_args& a, const builtin_context&) {
  const value* def = a.get(0, "default");
  const value fallback = def ? *def : value(0.0);
  if (v.is_number()) return value(v.as_double());
  if (!v.is_string()) return fallback;
  const std::string s = pystr::strip(v.as_string(), std::nullopt, true, true);
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  return (!s.empty() && end == s.c_str() + s.size()) ? value(d) : fallback;
}

expected<value> f_replace(const value& v, const call_args& a, const builtin_context& ctx) {
  call_args m;
  for (std::size_t i = 0; i < 3; ++i)
    if (const value* x = a.get(i, i == 0 ? "old" : i == 1 ? "new" : "count")) m.pos.push_back(*x);
  auto method = get_attr(value(str_of(v, ctx)), "replace", ctx);
  if (!method) return method;
  return call_function(method->as_function(), m, ctx);
}

expected<value> f_indent(const value& v, const call_args& a, const builtin_context& ctx) {
  std::string ind = "    ";
  if (const value* w = a.get(0, "width")) {
    if (w->is_string()) ind = w->as_string();
    else if (w->is_int() && w->as_int() >= 0 && w->as_int() <= 256) ind = std::string(static_cast<std::size_t>(w->as_int()), ' ');
    else return ctx.fail("indent width must be a string or an int in [0, 256]");
  }
  const value* first = a.get(1, "first");
  const value* blank = a.get(2, "blank");
  // jinja2 appends a newline first so splitlines() keeps a trailing empty line.
  const auto lines = pystr::splitlines(str_of(v, ctx) + "\n");
  std::string out;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (i) out += '\n';
    const bool indent_it = i == 0 ? false : (blank && blank->truthy()) || !lines[i].empty();
    if (indent_it) out += ind;
    out += lines[i];
    if (out.size() > ctx.string_bytes_max) return ctx.fail("indent result too long");
  }
  if (first && first->truthy()) out = ind + out;
  return value(std::move(out));
}

expected<value> f_items(const value& v, const call_args&, const builtin_context& ctx) {
  if (v.is_undefined()) return value(list{});
  if (!v.is_dict()) return ctx.fail("can only get item pairs from a mapping");
  list out;
  for (const auto& [k, x] : v.as_dict().items()) out.push_back(value::make_tuple(list{value(k), x}));
  return value(std::move(out));
}

expected<value> f_escape(const value& v, const call_args&, const builtin_context& ctx) {
  std::string out;
  for (char c : str_of(v, ctx)) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return value(std::move(out));
}

expected<value> f_reverse(const value& v, const call_args&, const builtin_context& ctx) {
  if (v.is_string()) {
    auto cps = pystr::decode(v.as_string());
    std::reverse(cps.begin(), cps.end());
    return value(pystr::encode(cps));
  }
  auto items = iterate(v, ctx);
  if (!items) return std::unexpected(items.error());
  std::reverse(items->begin(), items->end());
  return value(std::move(*items));
}

expected<value> f_abs(const value& v, const call_args&, const builtin_context& ctx) {
  if (v.type() == value::kind::floating) return value(std::fabs(v.as_double()));
  if (v.is_int()) return value(v.as_int() < 0 ? -v.as_int() : v.as_int());
  return ctx.fail("bad operand type for abs(): '" + std::string(v.type_name()) + "'");
}

/// selectattr/rejectattr/select/reject: keep items whose (attribute's) test
/// result equals `keep`; no test name means truthiness.
expected<value> select_items(const value& v, const call_args& a, bool by_attr, bool keep, const builtin_context& ctx) {
  auto items = iterate(v, ctx);
  if (!items) return std::unexpected(items.error());
  std::size_t next_arg = 0;
  std::string attr;
  if (by_attr) {
    if (a.pos.empty() || !a.pos[0].is_string()) return ctx.fail("selectattr/rejectattr need an attribute name");
    attr = a.pos[0].as_string();
    next_arg = 1;
  }
  std::string test;
  if (a.pos.size() > next_arg) {
    if (!a.pos[next_arg].is_string()) return ctx.fail("test name must be a string");
    test = a.pos[next_arg].as_string();
  }
  call_args test_args;
  test_args.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(std::min(a.pos.size(), next_arg + 1)), a.pos.end());
  list out;
  for (const auto& item : *items) {
    value subject = item;
    if (by_attr) {
      auto x = attr_path(item, attr, ctx);
      if (!x) return std::unexpected(x.error());
      subject = std::move(*x);
    }
    bool r = subject.truthy();
    if (!test.empty()) {
      auto t = apply_test(test, subject, test_args, ctx);
      if (!t) return std::unexpected(t.error());
      r = *t;
    }
    if (r == keep) out.push_back(item);
  }
  return value(std::move(out));
}
expected<value> f_selectattr(const value& v, const call_args& a, const builtin_context& c) { return select_items(v, a, true, true, c); }
expected<value> f_rejectattr(const value& v, const call_args& a, const builtin_context& c) { return select_items(v, a, true, false, c); }
expected<value> f_select(const value& v, const call_args& a, const builtin_context& c) { return select_items(v, a, false, true, c); }
expected<value> f_reject(const value& v, const call_args& a, const builtin_context& c) { return select_items(v, a, false, false, c); }

expected<value> f_map(const value& v, const call_args& a, const builtin_context& ctx) {
  auto items = iterate(v, ctx);
  if (!items) return std::unexpected(items.error());
  list out;
  if (const value* attr = a.get(SIZE_MAX, "attribute")) {
    const value* def = a.get(SIZE_MAX, "default");
    for (const auto& item : *items) {
      auto x = attr_path(item, str_of(*attr, ctx), ctx);
      if (!x) return std::unexpected(x.error());
      out.push_back(x->is_undefined() && def ? *def : *x);
    }
    return value(std::move(out));
  }
  if (a.pos.empty() || !a.pos[0].is_string()) return ctx.fail("map() needs a filter name or attribute=");
  call_args rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  for (const auto& item : *items) {
    auto x = apply_filter(a.pos[0].as_string(), item, rest, ctx);
    if (!x) return x;
    out.push_back(std::move(*x));
  }
  return value(std::move(out));
}

struct filter_entry {
  std::string_view name;
  filter_fn fn;
};

constexpr filter_entry filters[] = {
    {"tojson", f_tojson},         {"trim", f_trim},           {"length", f_length},       {"count", f_length},
    {"default", f_default},       {"d", f_default},           {"join", f_join},           {"first", f_first},
    {"last", f_last},             {"list", f_list},           {"string", f_string},       {"safe", f_safe},
    {"upper", f_upper},           {"lower", f_lower},         {"capitalize", f_capitalize}, {"title", f_title},
    {"int", f_int},               {"float", f_float},         {"replace", f_replace},     {"indent", f_indent},
    {"items", f_items},           {"escape", f_escape},       {"e", f_escape},            {"reverse", f_reverse},
    {"abs", f_abs},               {"selectattr", f_selectattr}, {"rejectattr", f_rejectattr}, {"select", f_select},
    {"reject", f_reject},         {"map", f_map},
};

bool compare_test(std::string_view name, const value& v, const value& other, bool& out) {
  if (name == "equalto" || name == "eq" || name == "==") { out = equals(v, other); return true; }
  if (name == "ne" || name == "!=") { out = !equals(v, other); return true; }
  const bool numbers = v.is_number() && other.is_number();
  const bool strings = v.is_string() && other.is_string();
  if (!numbers && !strings) return false;
  const int c = numbers ? (v.as_double() < other.as_double() ? -1 : v.as_double() > other.as_double() ? 1 : 0)
                        : v.as_string().compare(other.as_string());
  if (name == "lt" || name == "<" || name == "lessthan") { out = c < 0; return true; }
  if (name == "le" || name == "<=") { out = c <= 0; return true; }
  if (name == "gt" || name == ">" || name == "greaterthan") { out = c > 0; return true; }
  if (name == "ge" || name == ">=") { out = c >= 0; return true; }
  return false;
}

}  // namespace

expected<value> apply_filter(std::string_view name, const value& v, const call_args& args, const builtin_context& ctx) {
  for (const auto& f : filters)
    if (f.name == name) return f.fn(v, args, ctx);
  return make_error(errc::unsupported, "chat template line " + std::to_string(ctx.line) + ": unsupported filter '" +
                                           std::string(name) + "'");
}

expected<bool> apply_test(std::string_view name, const value& v, const call_args& a, const builtin_context& ctx) {
  using k = value::kind;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.type() == k::integer;
  if (name == "float") return v.type() == k::floating;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  // jinja2's Undefined has __iter__, __len__ and __getitem__, so it passes these two.
  if (name == "iterable") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "sequence") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "callable") return v.is_function();
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    const std::string& s = v.as_string();
    bool cased = false;
    for (char c : s) {
      if (name == "lower" && c >= 'A' && c <= 'Z') return false;
      if (name == "upper" && c >= 'a' && c <= 'z') return false;
      cased = cased || std::isalpha(static_cast<unsigned char>(c));
    }
    return cased;
  }
  if (name == "even" || name == "odd" || name == "divisibleby") {
    if (!v.is_int()) return ctx.fail("test '" + std::string(name) + "' needs an integer");
    if (name == "divisibleby") {
      const value* n = a.get(0, "num");
      if (!n || !n->is_int() || n->as_int() == 0) return ctx.fail("divisibleby needs a non-zero integer");
      return v.as_int() % n->as_int() == 0;
    }
    return (v.as_int() % 2 == 0) == (name == "even");
  }
  const value* other = a.get(0, "other");
  if (name == "in") {
    if (!other) return ctx.fail("test 'in' needs a sequence");
    auto items = iterate(*other, ctx);
    if (!items) return std::unexpected(items.error());
    if (other->is_string() && v.is_string()) return other->as_string().find(v.as_string()) != std::string::npos;
    for (const auto& x : *items)
      if (equals(x, v)) return true;
    return false;
  }
  if (name == "sameas") {
    if (!other) return ctx.fail("test 'sameas' needs a value");
    return v.type() == other->type() && equals(v, *other);
  }
  bool out = false;
  if (other && compare_test(name, v, *other, out)) return out;
  if (other && (name == "lt" || name == "le" || name == "gt" || name == "ge" || name == "<" || name == ">"))
    return ctx.fail("cannot compare " + std::string(v.type_name()) + " with " + std::string(other->type_name()));
  return make_error(errc::unsupported, "chat template line " + std::to_string(ctx.line) + ": unsupported test '" +
                                           std::string(name) + "'");
}

}  // namespace exa::jinja
