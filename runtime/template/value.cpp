#include "template/value.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace exa::jinja {

const value* dict::find(std::string_view key) const {
  auto it = index_.find(std::string(key));
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

value::value(dict d) : depth_(d.depth()), v_(std::make_shared<const dict>(std::move(d))) {}

value::value(list l) {
  for (const auto& e : l) depth_ = std::max(depth_, e.depth());
  depth_ += 1;
  v_ = std::make_shared<const list>(std::move(l));
}

void dict::set(std::string key, value v) {
  depth_ = std::max(depth_, v.depth() + 1);
  if (auto it = index_.find(key); it != index_.end()) {
    items_[it->second].second = std::move(v);
    return;
  }
  index_.emplace(key, items_.size());
  items_.emplace_back(std::move(key), std::move(v));
}

value value::make_namespace(dict initial) {
  value v;
  v.v_ = std::make_shared<dict>(std::move(initial));
  return v;
}

bool value::truthy() const {
  switch (type()) {
    case kind::undefined:
    case kind::none: return false;
    case kind::boolean: return as_bool();
    case kind::integer: return as_int() != 0;
    case kind::floating: return as_double() != 0.0;
    case kind::string: return !as_string().empty();
    case kind::list: return !as_list().empty();
    case kind::dict: return as_dict().size() != 0;
    case kind::ns:
    case kind::function: return true;
  }
  return false;
}

std::string_view value::type_name() const {
  switch (type()) {
    case kind::undefined: return "Undefined";
    case kind::none: return "NoneType";
    case kind::boolean: return "bool";
    case kind::integer: return "int";
    case kind::floating: return "float";
    case kind::string: return "str";
    case kind::list: return tuple_ ? "tuple" : "list";
    case kind::dict: return "dict";
    case kind::ns: return "Namespace";
    case kind::function: return "function";
  }
  return "?";
}

bool equals(const value& a, const value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.type() == value::kind::floating || b.type() == value::kind::floating) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case value::kind::undefined:
    case value::kind::none: return true;
    case value::kind::string: return a.as_string() == b.as_string();
    case value::kind::list: {
      if (a.is_tuple() != b.is_tuple()) return false;
      const auto &x = a.as_list(), &y = b.as_list();
      if (x.size() != y.size()) return false;
      for (std::size_t i = 0; i < x.size(); ++i)
        if (!equals(x[i], y[i])) return false;
      return true;
    }
    case value::kind::dict: {
      const auto &x = a.as_dict(), &y = b.as_dict();
      if (x.size() != y.size()) return false;
      for (const auto& [k, v] : x.items()) {
        const value* w = y.find(k);
        if (!w || !equals(v, *w)) return false;
      }
      return true;
    }
    case value::kind::ns: return &a.ns_attrs() == &b.ns_attrs();
    case value::kind::function: return a.as_function().name == b.as_function().name;
    default: return false;
  }
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  // Shortest round-trip digits, then CPython's layout: positional when the
  // decimal exponent is in [-4, 16), scientific otherwise, always a '.0' or
  // an exponent so the text reads back as a float.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const auto e_pos = sci.find('e');
  std::string mant = sci.substr(0, e_pos);
  const int exp10 = std::stoi(sci.substr(e_pos + 1));
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out = neg ? "-" : "";
  if (exp10 >= 16 || exp10 < -4) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    return out + e;
  }
  if (exp10 < 0) return out + "0." + std::string(static_cast<std::size_t>(-exp10 - 1), '0') + digits;
  const auto int_len = static_cast<std::size_t>(exp10) + 1;
  if (digits.size() <= int_len) return out + digits + std::string(int_len - digits.size(), '0') + ".0";
  return out + digits.substr(0, int_len) + "." + digits.substr(int_len);
}

namespace {

void repr_string(const std::string& s, std::string& out) {
  // CPython picks single quotes unless the text has a ' and no ".
  const char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  out += q;
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == static_cast<unsigned char>(q)) { out += '\\'; out += q; }
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else out += static_cast<char>(c);
  }
  out += q;
}

// Values nest at most as deep as the template's literals or the request's
// JSON, but a namespace may hold itself: stop at a fixed depth like Python's
// recursive-repr guard.
constexpr int repr_depth_max = 64;

void write(const value& v, bool repr, std::string& out, std::size_t bytes_max, int depth = 0) {
  if (out.size() > bytes_max) return;
  if (depth > repr_depth_max) {
    out += "...";
    return;
  }
  switch (v.type()) {
    case value::kind::undefined:
      if (repr) out += "Undefined";  // jinja2's Undefined.__repr__, inside a list or dict
      return;
    case value::kind::none: out += "None"; return;
    case value::kind::boolean: out += v.as_bool() ? "True" : "False"; return;
    case value::kind::integer: out += std::to_string(v.as_int()); return;
    case value::kind::floating: out += python_float_repr(v.as_double()); return;
    case value::kind::string:
      if (repr) repr_string(v.as_string(), out);
      else out += v.as_string();
      return;
    case value::kind::list: {
      out += v.is_tuple() ? '(' : '[';
      bool first = true;
      for (const auto& e : v.as_list()) {
        if (!first) out += ", ";
        first = false;
        write(e, true, out, bytes_max, depth + 1);
        if (out.size() > bytes_max) return;
      }
      if (v.is_tuple() && v.as_list().size() == 1) out += ',';
      out += v.is_tuple() ? ')' : ']';
      return;
    }
    case value::kind::dict:
    case value::kind::ns: {
      const dict& d = v.is_dict() ? v.as_dict() : v.ns_attrs();
      out += v.is_namespace() ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, e] : d.items()) {
        if (!first) out += ", ";
        first = false;
        repr_string(k, out);
        out += ": ";
        write(e, true, out, bytes_max, depth + 1);
        if (out.size() > bytes_max) return;
      }
      out += v.is_namespace() ? "}>" : "}";
      return;
    }
    case value::kind::function: out += "<built-in function " + v.as_function().name + ">"; return;
  }
}

}  // namespace

std::string to_str(const value& v, std::size_t bytes_max) {
  std::string out;
  write(v, false, out, bytes_max);
  return out;
}

std::string to_repr(const value& v, std::size_t bytes_max) {
  std::string out;
  write(v, true, out, bytes_max);
  return out;
}

}  // namespace exa::jinja
