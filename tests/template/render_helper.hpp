#pragma once
// Renders a template source with variables given as JSON, for tests.

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "template/template.hpp"
#include "template/value_json.hpp"

namespace exa::jinja::test {

inline constexpr std::int64_t fixed_now_unix_s = 1721952000;  // 2024-07-26 00:00:00 UTC

/// The rendered text, or "ERROR: <message>".
inline std::string render(std::string_view source, std::string_view vars_json = "{}",
                          const template_limits& limits = {}) {
  auto t = compiled_template::compile(source, limits);
  if (!t) return "ERROR: " + t.error().message;
  auto j = nlohmann::ordered_json::parse(vars_json);
  auto v = from_json(j);
  if (!v) return "ERROR: " + v.error().message;
  auto out = t->render(v->as_dict(), fixed_now_unix_s);
  if (!out) return "ERROR: " + out.error().message;
  return *out;
}

/// The error, or "" when rendering worked.
inline error render_error(std::string_view source, std::string_view vars_json = "{}", const template_limits& limits = {}) {
  auto t = compiled_template::compile(source, limits);
  if (!t) return t.error();
  auto v = from_json(nlohmann::ordered_json::parse(vars_json));
  auto out = t->render(v->as_dict(), fixed_now_unix_s);
  if (!out) return out.error();
  return error{errc::internal, ""};
}

}  // namespace exa::jinja::test
