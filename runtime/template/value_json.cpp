#include "template/value_json.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace exa::jinja {

expected<value> from_json(const nlohmann::ordered_json& j, std::size_t depth_max) {
  using t = nlohmann::ordered_json::value_t;
  if (depth_max == 0) return make_error(errc::invalid_argument, "JSON nests too deeply for a chat template");
  switch (j.type()) {
    case t::null: return value(none_t{});
    case t::boolean: return value(j.get<bool>());
    case t::number_integer: return value(j.get<std::int64_t>());
    case t::number_unsigned: {
      const auto u = j.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return value(static_cast<double>(u));
      return value(static_cast<std::int64_t>(u));
    }
    case t::number_float: return value(j.get<double>());
    case t::string: return value(j.get<std::string>());
    case t::array: {
      list l;
      l.reserve(j.size());
      for (const auto& e : j) {
        auto v = from_json(e, depth_max - 1);
        if (!v) return v;
        l.push_back(std::move(*v));
      }
      return value(std::move(l));
    }
    case t::object: {
      dict d;
      for (const auto& [k, e] : j.items()) {
        auto v = from_json(e, depth_max - 1);
        if (!v) return v;
        d.set(k, std::move(*v));
      }
      return value(std::move(d));
    }
    default: return make_error(errc::invalid_argument, "JSON value of an unsupported type in a chat template's input");
  }
}

namespace {

void quote(const std::string& s, std::string& out) {
  // Python's json encoder with ensure_ascii=False: only the quote, the
  // backslash and control characters are escaped; everything else is kept.
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

class writer {
 public:
  writer(const json_format& f, std::size_t bytes_max) : f_(f), bytes_max_(bytes_max) {
    if (f.separators) {
      item_sep_ = f.separators->first;
      key_sep_ = f.separators->second;
    } else {
      item_sep_ = f.indent ? "," : ", ";
      key_sep_ = ": ";
    }
  }

  expected<std::string> run(const value& v) {
    if (auto ok = write(v, 0); !ok) return std::unexpected(ok.error());
    return std::move(out_);
  }

 private:
  void newline(int level) {
    if (!f_.indent) return;
    out_ += '\n';
    for (int i = 0; i < level && out_.size() <= bytes_max_; ++i) out_ += *f_.indent;
  }

  expected<void> write(const value& v, int level) {
    if (out_.size() > bytes_max_)
      return make_error(errc::invalid_argument, "tojson output exceeds " + std::to_string(bytes_max_) + " bytes");
    if (level > 64) return make_error(errc::invalid_argument, "tojson: value nests too deeply");
    switch (v.type()) {
      case value::kind::none: out_ += "null"; return {};
      case value::kind::boolean: out_ += v.as_bool() ? "true" : "false"; return {};
      case value::kind::integer: out_ += std::to_string(v.as_int()); return {};
      case value::kind::floating: {
        const double d = v.as_double();
        if (std::isnan(d)) out_ += "NaN";
        else if (std::isinf(d)) out_ += d < 0 ? "-Infinity" : "Infinity";
        else out_ += python_float_repr(d);
        return {};
      }
      case value::kind::string: quote(v.as_string(), out_); return {};
      case value::kind::list: return write_list(v.as_list(), level);
      case value::kind::dict: return write_dict(v.as_dict(), level);
      default:
        return make_error(errc::invalid_argument,
                          "Object of type " + std::string(v.type_name()) + " is not JSON serializable");
    }
  }

  expected<void> write_list(const list& l, int level) {
    if (l.empty()) { out_ += "[]"; return {}; }
    out_ += '[';
    for (std::size_t i = 0; i < l.size(); ++i) {
      if (i) out_ += item_sep_;
      newline(level + 1);
      if (auto ok = write(l[i], level + 1); !ok) return ok;
    }
    newline(level);
    out_ += ']';
    return {};
  }

  expected<void> write_dict(const dict& d, int level) {
    if (d.size() == 0) { out_ += "{}"; return {}; }
    std::vector<const std::pair<std::string, value>*> items;
    for (const auto& kv : d.items()) items.push_back(&kv);
    if (f_.sort_keys)
      std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
    out_ += '{';
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (i) out_ += item_sep_;
      newline(level + 1);
      quote(items[i]->first, out_);
      out_ += key_sep_;
      if (auto ok = write(items[i]->second, level + 1); !ok) return ok;
    }
    newline(level);
    out_ += '}';
    return {};
  }

  const json_format& f_;
  std::size_t bytes_max_;
  std::string item_sep_, key_sep_;
  std::string out_;
};

}  // namespace

expected<std::string> to_json(const value& v, const json_format& fmt, std::size_t bytes_max) {
  auto out = writer(fmt, bytes_max).run(v);
  if (out && out->size() > bytes_max)
    return make_error(errc::invalid_argument, "tojson output exceeds " + std::to_string(bytes_max) + " bytes");
  return out;
}

}  // namespace exa::jinja
