#pragma once
// Internal to chaos/: the JSON field readers of plan parsing and the parser of
// one fault object, shared by chaos plans (plan.cpp) and simulation scenarios
// (sim_scenario.cpp) so both accept the same fault objects with the same
// field-named errors. Included by .cpp files only: it exposes nlohmann::json,
// which public headers keep out.

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "chaos/plan.hpp"
#include "common/error.hpp"

namespace exa::chaos::json_detail {

using json = nlohmann::json;

// Field readers. The first error wins and later reads become no-ops, so the
// parsers read straight down without checking after every field.

class field_errors {
 public:
  void fail(const std::string& field, std::string message) {
    if (!first_) first_ = error{errc::invalid_argument, field + ": " + message};
  }
  bool failed() const noexcept { return first_.has_value(); }
  const error& first() const { return *first_; }

 private:
  std::optional<error> first_;
};

inline std::string join_path(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

class object_reader {
 public:
  object_reader(const json& obj, std::string path, field_errors& errs)
      : obj_(obj), path_(std::move(path)), errs_(errs) {}

  std::string field(std::string_view key) const { return join_path(path_, key); }
  bool has(const char* key) const { return obj_.contains(key); }
  const json& at(const char* key) const { return obj_.at(key); }
  field_errors& errors() const { return errs_; }

  /// Unknown keys are errors: a typo must not silently fall back to a default.
  void known_keys(std::initializer_list<std::string_view> keys) const {
    for (auto it = obj_.begin(); it != obj_.end() && !errs_.failed(); ++it) {
      if (std::find(keys.begin(), keys.end(), it.key()) == keys.end())
        errs_.fail(field(it.key()), "unknown key");
    }
  }
  void require(const char* key, std::string_view why = "required") const {
    if (!errs_.failed() && !has(key)) errs_.fail(field(key), std::string(why));
  }
  void forbid(const char* key, std::string_view why) const {
    if (!errs_.failed() && has(key)) errs_.fail(field(key), std::string(why));
  }

  void u32(const char* key, std::uint32_t lo, std::uint32_t hi, std::uint32_t& out) const {
    std::uint64_t v = out;
    u64(key, lo, hi, v);
    out = static_cast<std::uint32_t>(v);
  }
  void u64(const char* key, std::uint64_t lo, std::uint64_t hi, std::uint64_t& out) const {
    if (errs_.failed() || !has(key)) return;
    const json& v = at(key);
    if (!v.is_number_integer()) return errs_.fail(field(key), "must be an integer (got " + v.dump() + ")");
    if (!v.is_number_unsigned()) return errs_.fail(field(key), fmt::format("must be between {} and {} (got {})", lo, hi, v.dump()));
    const auto x = v.get<std::uint64_t>();
    if (x < lo || x > hi) return errs_.fail(field(key), fmt::format("must be between {} and {} (got {})", lo, hi, x));
    out = x;
  }
  /// A number in [lo, hi], or (lo, hi] when lo_open.
  void number(const char* key, double lo, bool lo_open, double hi, double& out) const {
    if (errs_.failed() || !has(key)) return;
    const json& v = at(key);
    if (!v.is_number()) return errs_.fail(field(key), "must be a number (got " + v.dump() + ")");
    const auto x = v.get<double>();
    if (x < lo || (lo_open && x == lo) || x > hi || std::isnan(x))
      return errs_.fail(field(key), fmt::format("must be in {}{}, {}] (got {})", lo_open ? "(" : "[", lo, hi, v.dump()));
    out = x;
  }
  void number(const char* key, double lo, bool lo_open, double hi, std::optional<double>& out) const {
    double v = 0;
    if (errs_.failed() || !has(key)) return;
    number(key, lo, lo_open, hi, v);
    if (!errs_.failed()) out = v;
  }
  void string(const char* key, std::size_t max_chars, std::string& out) const {
    if (errs_.failed() || !has(key)) return;
    const json& v = at(key);
    if (!v.is_string()) return errs_.fail(field(key), "must be a string (got " + v.dump() + ")");
    const auto& s = v.get_ref<const std::string&>();
    if (s.size() > max_chars) return errs_.fail(field(key), fmt::format("longer than {} characters", max_chars));
    out = s;
  }

 private:
  const json& obj_;
  std::string path_;
  field_errors& errs_;
};

inline bool is_object_field(const object_reader& r, const char* key) {
  if (r.errors().failed() || !r.has(key)) return false;
  if (r.at(key).is_object()) return true;
  r.errors().fail(r.field(key), "must be an object");
  return false;
}

/// Plan and scenario names: letters, digits, '.', '_' and '-'.
inline bool valid_name(std::string_view name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
           ch == '_' || ch == '-';
  });
}

/// Reads a file of at most `max_bytes` (one byte more is read, so a larger
/// file reaches the parser's size check instead of memory). io_error names
/// `what` and the path: "cannot open plan file x.json".
expected<std::string> read_text_file(const std::string& path, std::size_t max_bytes, std::string_view what);

/// Parses `text` (at most `max_bytes`) into a JSON object. Errors
/// (invalid_argument) start with `what`: "plan: not valid JSON: ...".
expected<json> parse_json_object(const std::string& text, std::size_t max_bytes, std::string_view what);

/// Parses one chaos fault object read by `r` into `f`: its kind, timing
/// (at_s within the run, or a random process), target (node < c.nodes,
/// device < c.devices_per_node) and the parameters its kind takes. Only
/// c.nodes, c.devices_per_node and w.duration_s are read. Errors go to
/// r.errors(), naming the field.
void parse_fault(const object_reader& r, const cluster_spec& c, const workload_spec& w, fault_spec& f);

}  // namespace exa::chaos::json_detail
