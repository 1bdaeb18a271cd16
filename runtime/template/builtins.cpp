// Lookup, methods and globals. Filters and tests are in filters.cpp.
#include "template/builtins.hpp"

#include <array>
#include <ctime>

#include "template/pystr.hpp"

namespace exa::jinja {

const value* call_args::get(std::size_t i, std::string_view name) const {
  if (i < pos.size()) return &pos[i];
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}

std::unexpected<error> builtin_context::fail(const std::string& what) const {
  return make_error(errc::invalid_argument, "chat template line " + std::to_string(line) + ": " + what);
}

namespace {

constexpr std::array<std::string_view, 17> str_methods = {
    "strip", "lstrip", "rstrip", "split", "splitlines", "startswith", "endswith", "upper", "lower",
    "title", "capitalize", "replace", "find", "count", "join", "format", "isdigit"};
constexpr std::array<std::string_view, 4> dict_methods = {"items", "keys", "values", "get"};

bool has(auto const& names, std::string_view n) {
  for (auto m : names)
    if (m == n) return true;
  return false;
}

value bound(const value& self, std::string name) {
  return value(function{std::move(name), std::make_shared<const value>(self)});
}

std::string owner_name(const value& obj) {
  if (obj.is_none()) return "None";
  return "'" + std::string(obj.type_name()) + " object'";
}

/// An optional str argument (None counts as absent, as in Python).
expected<std::optional<std::string>> opt_str(const value* v, const char* what, const builtin_context& ctx) {
  if (!v || v->is_none()) return std::nullopt;
  if (!v->is_string()) return ctx.fail(std::string(what) + " must be a string, not " + std::string(v->type_name()));
  return v->as_string();
}

expected<value> str_join(const std::string& s, const value* x, const builtin_context& ctx) {
  if (!x) return ctx.fail("join() takes one argument");
  auto items = iterate(*x, ctx);
  if (!items) return std::unexpected(items.error());
  std::string out;
  for (std::size_t i = 0; i < items->size(); ++i) {
    if (!(*items)[i].is_string()) return ctx.fail("sequence item " + std::to_string(i) + ": expected str instance");
    if (i) out += s;
    out += (*items)[i].as_string();
    if (out.size() > ctx.string_bytes_max) return ctx.fail("join() result too long");
  }
  return value(std::move(out));
}

/// str.format with "{}", "{0}" and "{name}" fields only (no format specs).
expected<value> str_format(const std::string& s, const call_args& a, const builtin_context& ctx) {
  std::string out;
  std::size_t auto_index = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if ((s[i] == '{' || s[i] == '}') && i + 1 < s.size() && s[i + 1] == s[i]) { out += s[i++]; continue; }
    if (s[i] != '{') { out += s[i]; continue; }
    const std::size_t close = s.find('}', i);
    if (close == std::string::npos) return ctx.fail("format(): single '{' in format string");
    const std::string field = s.substr(i + 1, close - i - 1);
    const value* v = nullptr;
    if (field.empty()) v = a.get(auto_index++, "");
    else if (field.size() <= 9 && field.find_first_not_of("0123456789") == std::string::npos)
      v = a.get(std::stoul(field), "");
    else if (field.find_first_of(":!.[") == std::string::npos) v = a.get(SIZE_MAX, field);
    else return ctx.fail("format(): unsupported field '{" + field + "}'");
    if (!v) return ctx.fail("format(): no argument for '{" + field + "}'");
    out += to_str(*v, ctx.string_bytes_max);
    i = close;
  }
  return value(std::move(out));
}

expected<value> str_method(const std::string& s, const std::string& m, const call_args& a, const builtin_context& ctx) {
  if (m == "strip" || m == "lstrip" || m == "rstrip") {
    auto chars = opt_str(a.get(0, "chars"), "strip argument", ctx);
    if (!chars) return std::unexpected(chars.error());
    return value(pystr::strip(s, *chars, m != "rstrip", m != "lstrip"));
  }
  if (m == "split") {
    auto sep = opt_str(a.get(0, "sep"), "split separator", ctx);
    if (!sep) return std::unexpected(sep.error());
    if (*sep && (*sep)->empty()) return ctx.fail("empty separator");
    const value* n = a.get(1, "maxsplit");
    list out;
    for (auto& p : pystr::split(s, *sep, n && n->is_int() ? n->as_int() : -1)) out.emplace_back(std::move(p));
    return value(std::move(out));
  }
  if (m == "splitlines") {
    list out;
    for (auto& p : pystr::splitlines(s)) out.emplace_back(std::move(p));
    return value(std::move(out));
  }
  if (m == "startswith" || m == "endswith") {
    const value* p = a.get(0, "prefix");
    if (!p) return ctx.fail(m + "() takes at least 1 argument");
    auto test = [&](const value& x) -> expected<bool> {
      if (!x.is_string()) return ctx.fail(m + " first arg must be str or a tuple of str");
      const auto& t = x.as_string();
      if (t.size() > s.size()) return false;
      return m == "startswith" ? s.compare(0, t.size(), t) == 0 : s.compare(s.size() - t.size(), t.size(), t) == 0;
    };
    if (p->is_list()) {
      for (const auto& x : p->as_list()) {
        auto r = test(x);
        if (!r || *r) return r ? expected<value>(value(true)) : std::unexpected(r.error());
      }
      return value(false);
    }
    auto r = test(*p);
    if (!r) return std::unexpected(r.error());
    return value(*r);
  }
  if (m == "upper") return value(pystr::upper(s));
  if (m == "lower") return value(pystr::lower(s));
  if (m == "title") return value(pystr::title(s));
  if (m == "capitalize") return value(pystr::capitalize(s));
  if (m == "isdigit") {
    bool all = !s.empty();
    for (char c : s) all = all && c >= '0' && c <= '9';
    return value(all);
  }
  const value* x = a.get(0, "x");
  if (m == "replace") {
    const value* y = a.get(1, "y");
    const value* n = a.get(2, "count");
    if (!x || !y || !x->is_string() || !y->is_string()) return ctx.fail("replace() takes two strings");
    const std::int64_t count = n && n->is_int() ? n->as_int() : -1;
    // Bound the result before building it: each replacement may grow the text.
    const auto hits = static_cast<std::size_t>(pystr::count(s, x->as_string()));
    if (y->as_string().size() > x->as_string().size() &&
        s.size() + hits * (y->as_string().size() - x->as_string().size()) > ctx.string_bytes_max)
      return ctx.fail("replace() result exceeds " + std::to_string(ctx.string_bytes_max) + " bytes");
    return value(pystr::replace(s, x->as_string(), y->as_string(), count));
  }
  if (m == "find" || m == "count") {
    if (!x || !x->is_string()) return ctx.fail(m + "() takes a string");
    return value(m == "find" ? pystr::find(s, x->as_string()) : pystr::count(s, x->as_string()));
  }
  if (m == "join") return str_join(s, x, ctx);
  if (m == "format") return str_format(s, a, ctx);
  return ctx.fail("'str' object has no method '" + m + "'");
}

expected<value> dict_method(const dict& d, const std::string& m, const call_args& a, const builtin_context& ctx) {
  if (m == "items" || m == "keys" || m == "values") {
    list out;
    out.reserve(d.size());
    for (const auto& [k, v] : d.items()) {
      if (m == "items") out.push_back(value::make_tuple(list{value(k), v}));
      else if (m == "keys") out.emplace_back(k);
      else out.push_back(v);
    }
    return value(std::move(out));
  }
  if (m == "get") {
    const value* k = a.get(0, "key");
    if (!k) return ctx.fail("get() takes at least 1 argument");
    if (k->is_string())
      if (const value* v = d.find(k->as_string())) return *v;
    const value* def = a.get(1, "default");
    return def ? *def : value(none_t{});
  }
  return ctx.fail("'dict' object has no method '" + m + "'");
}

expected<value> strftime_now(const call_args& a, const builtin_context& ctx) {
  const value* f = a.get(0, "format");
  if (!f || !f->is_string()) return ctx.fail("strftime_now() takes a format string");
  const std::time_t t = static_cast<std::time_t>(ctx.now_unix_s);
  std::tm tm{};
  gmtime_r(&t, &tm);
  if (f->as_string().size() > 256) return ctx.fail("strftime_now() format too long");
  char buf[1024];
  const std::size_t n = std::strftime(buf, sizeof buf, f->as_string().c_str(), &tm);
  return value(std::string(buf, n));
}

expected<value> range_of(const call_args& a, const builtin_context& ctx) {
  std::int64_t start = 0, stop = 0, step = 1;
  for (const auto& v : a.pos)
    if (!v.is_int()) return ctx.fail("range() arguments must be integers, not " + std::string(v.type_name()));
  if (a.pos.size() == 1) stop = a.pos[0].as_int();
  else if (a.pos.size() == 2 || a.pos.size() == 3) {
    start = a.pos[0].as_int();
    stop = a.pos[1].as_int();
    if (a.pos.size() == 3) step = a.pos[2].as_int();
  } else {
    return ctx.fail("range() takes 1 to 3 arguments");
  }
  if (step == 0) return ctx.fail("range() arg 3 must not be zero");
  list out;
  for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (out.size() >= ctx.items_max) return ctx.fail("range() longer than " + std::to_string(ctx.items_max) + " items");
    out.emplace_back(i);
  }
  return value(std::move(out));
}

}  // namespace

expected<value> get_attr(const value& obj, const std::string& name, const builtin_context& ctx) {
  switch (obj.type()) {
    case value::kind::undefined: return ctx.fail(obj.undefined_hint());
    case value::kind::string:
      if (has(str_methods, name)) return bound(obj, name);
      break;
    case value::kind::dict:
      if (has(dict_methods, name)) return bound(obj, name);
      if (const value* v = obj.as_dict().find(name)) return *v;
      break;
    case value::kind::ns:
      if (const value* v = obj.ns_attrs().find(name)) return *v;
      break;
    default: break;
  }
  return value::make_undefined(owner_name(obj) + " has no attribute '" + name + "'");
}

expected<value> get_item(const value& obj, const value& key, const builtin_context& ctx) {
  if (obj.is_undefined()) return ctx.fail(obj.undefined_hint());
  if (obj.is_dict() && key.is_string()) {
    if (const value* v = obj.as_dict().find(key.as_string())) return *v;
    return get_attr(obj, key.as_string(), ctx);
  }
  if ((obj.is_list() || obj.is_string()) && key.is_int()) {
    std::int64_t i = key.as_int();
    if (obj.is_list()) {
      const auto n = static_cast<std::int64_t>(obj.as_list().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.as_list()[static_cast<std::size_t>(i)];
    } else {
      const auto cps = pystr::decode(obj.as_string());
      const auto n = static_cast<std::int64_t>(cps.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return value(pystr::encode(cps, static_cast<std::size_t>(i), static_cast<std::size_t>(i) + 1));
    }
    return value::make_undefined(owner_name(obj) + " has no element " + std::to_string(key.as_int()));
  }
  if (key.is_string()) return get_attr(obj, key.as_string(), ctx);
  return value::make_undefined(owner_name(obj) + " has no element " + to_repr(key, 64));
}

value global_value(std::string_view name) {
  static constexpr std::string_view names[] = {"raise_exception", "strftime_now", "namespace", "range", "dict"};
  for (auto n : names)
    if (n == name) return value(function{std::string(n), nullptr});
  return value::make_undefined("'" + std::string(name) + "' is undefined");
}

expected<value> call_function(const function& f, const call_args& a, const builtin_context& ctx) {
  if (f.self) {
    if (f.self->is_string()) return str_method(f.self->as_string(), f.name, a, ctx);
    if (f.self->is_dict()) return dict_method(f.self->as_dict(), f.name, a, ctx);
    return ctx.fail("no method '" + f.name + "'");
  }
  if (f.name == "raise_exception") {
    const value* m = a.get(0, "message");
    return make_error(errc::invalid_argument, "chat template: " + (m ? to_str(*m, ctx.string_bytes_max) : std::string()));
  }
  if (f.name == "strftime_now") return strftime_now(a, ctx);
  if (f.name == "range") return range_of(a, ctx);
  if (f.name == "namespace" || f.name == "dict") {
    dict d;
    if (!a.pos.empty()) {
      if (a.pos.size() > 1 || !a.pos[0].is_dict()) return ctx.fail(f.name + "() takes keyword arguments or one dict");
      d = a.pos[0].as_dict();
    }
    for (const auto& [k, v] : a.kw) d.set(k, v);
    return f.name == "dict" ? value(std::move(d)) : value::make_namespace(std::move(d));
  }
  return ctx.fail("'" + f.name + "' is not callable");
}

expected<list> iterate(const value& v, const builtin_context& ctx) {
  switch (v.type()) {
    case value::kind::undefined: return list{};
    case value::kind::list: return v.as_list();
    case value::kind::dict: {
      list keys;
      for (const auto& kv : v.as_dict().items()) keys.emplace_back(kv.first);
      return keys;
    }
    case value::kind::string: {
      const auto cps = pystr::decode(v.as_string());
      list chars;
      for (std::size_t i = 0; i < cps.size(); ++i) chars.emplace_back(pystr::encode(cps, i, i + 1));
      return chars;
    }
    default: return ctx.fail("'" + std::string(v.type_name()) + "' object is not iterable");
  }
}

expected<std::int64_t> length_of(const value& v, const builtin_context& ctx) {
  switch (v.type()) {
    case value::kind::undefined: return 0;
    case value::kind::string: return static_cast<std::int64_t>(pystr::length(v.as_string()));
    case value::kind::list: return static_cast<std::int64_t>(v.as_list().size());
    case value::kind::dict: return static_cast<std::int64_t>(v.as_dict().size());
    default: return ctx.fail("object of type '" + std::string(v.type_name()) + "' has no len()");
  }
}

}  // namespace exa::jinja
