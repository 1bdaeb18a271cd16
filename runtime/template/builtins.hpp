#pragma once
// What templates can reach besides operators: attribute and item lookup with
// jinja2's rules, methods of str and dict, the globals transformers provides
// (raise_exception, strftime_now, namespace, range, dict), and the filters and
// tests. Errors name the template line ("chat template line N: ...");
// raise_exception's error is "chat template: <its message>".

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "template/value.hpp"

namespace exa::jinja {

struct call_args {
  std::vector<value> pos;
  std::vector<std::pair<std::string, value>> kw;

  /// Positional `i`, else keyword `name`, else null.
  const value* get(std::size_t i, std::string_view name) const;
};

/// What a builtin may need from the renderer: bounds, the clock, the line.
struct builtin_context {
  std::size_t string_bytes_max = 1 << 22;
  std::size_t items_max = 1 << 16;
  std::int64_t now_unix_s = 0;  // strftime_now's clock (UTC), injected
  int line = 0;

  std::unexpected<error> fail(const std::string& what) const;
};

/// `obj.name`: a method bound to obj if it has one by that name, else the
/// key/attribute, else undefined (with jinja2's hint). Errors: obj undefined.
expected<value> get_attr(const value& obj, const std::string& name, const builtin_context& ctx);
/// `obj[key]`: the item, falling back to the attribute for string keys.
expected<value> get_item(const value& obj, const value& key, const builtin_context& ctx);
/// A global name transformers' environment defines, or undefined.
value global_value(std::string_view name);
/// Calls a builtin global or bound method.
expected<value> call_function(const function& f, const call_args& args, const builtin_context& ctx);
/// `v | name(args)`. Errors: unsupported for a filter we do not have.
expected<value> apply_filter(std::string_view name, const value& v, const call_args& args, const builtin_context& ctx);
/// `v is name(args)`. Errors: unsupported for a test we do not have.
expected<bool> apply_test(std::string_view name, const value& v, const call_args& args, const builtin_context& ctx);
/// Iterating a value as Python would: list items, dict keys, string
/// characters; undefined is empty. Errors: not iterable.
expected<list> iterate(const value& v, const builtin_context& ctx);
/// len(v): string code points, list/dict size; undefined is 0.
expected<std::int64_t> length_of(const value& v, const builtin_context& ctx);

}  // namespace exa::jinja
