#pragma once
// JSON in and out of template values: the request's messages become values,
// and the `tojson` filter writes values the way transformers' override does
// (Python's json.dumps with ensure_ascii=False, sort_keys=False, optional
// indent and separators) rather than jinja2's HTML-escaping default.

#include <cstddef>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "template/value.hpp"

namespace exa::jinja {

/// Converts parsed JSON (key order kept). Errors: invalid_argument when the
/// document nests deeper than `depth_max`.
expected<value> from_json(const nlohmann::ordered_json& j, std::size_t depth_max = 64);

struct json_format {
  /// nullopt: one line. Otherwise newline + this string per nesting level
  /// (Python's indent=4 is four spaces; indent=0 still breaks lines).
  std::optional<std::string> indent;
  /// Python's defaults: (", ", ": ") on one line, (",", ": ") when indented.
  std::optional<std::pair<std::string, std::string>> separators;
  bool sort_keys = false;
};

/// json.dumps(v, ensure_ascii=False, ...). Errors: invalid_argument for a
/// value JSON cannot hold (undefined, a namespace, a function), or when the
/// text would exceed `bytes_max`.
expected<std::string> to_json(const value& v, const json_format& fmt, std::size_t bytes_max);

}  // namespace exa::jinja
