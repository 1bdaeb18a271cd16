#pragma once
// The values a chat template computes with, shaped after the Python objects
// jinja2 hands its templates: undefined, None, bool, int, float, str, list,
// dict (insertion-ordered, string keys), jinja2's namespace, and callables
// (builtin globals and bound methods such as `message.items`). Lists and dicts
// are shared by reference like Python's; templates cannot mutate them (the
// sandbox transformers uses forbids it), only namespaces change in place.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace exa::jinja {

class value;

using list = std::vector<value>;

class dict;

/// A builtin callable: a global (`raise_exception`, `namespace`, `range`, ...)
/// or a method bound to its object (`"a b".split`, `message.items`).
struct function {
  std::string name;
  std::shared_ptr<const value> self;  // null for globals
};

/// jinja2's Undefined: what a missing name, key or attribute evaluates to.
/// `hint` is the message jinja2 would give if it is used in a way that fails
/// ("'foo' is undefined", "'dict object' has no attribute 'bar'").
struct undefined {
  std::string hint;
};

struct none_t {
  friend bool operator==(none_t, none_t) = default;
};

class value {
 public:
  enum class kind { undefined, none, boolean, integer, floating, string, list, dict, ns, function };

  value() : v_(undefined{}) {}
  value(none_t) : v_(none_t{}) {}
  value(bool b) : v_(b) {}
  value(std::int64_t i) : v_(i) {}
  value(int i) : v_(std::int64_t{i}) {}
  value(double d) : v_(d) {}
  value(std::string s) : v_(std::move(s)) {}
  value(const char* s) : v_(std::string(s)) {}
  value(list l);
  value(dict d);
  value(function f) : v_(std::make_shared<const function>(std::move(f))) {}

  static value make_undefined(std::string hint) { value v; v.v_ = undefined{std::move(hint)}; return v; }
  /// A Python tuple: a list that prints as (a, b) and never equals a list.
  static value make_tuple(list l) { value v(std::move(l)); v.tuple_ = true; return v; }
  /// A jinja2 namespace(): a dict whose attributes templates may assign.
  static value make_namespace(dict initial);

  kind type() const noexcept { return static_cast<kind>(v_.index()); }
  bool is_undefined() const noexcept { return type() == kind::undefined; }
  bool is_none() const noexcept { return type() == kind::none; }
  bool is_bool() const noexcept { return type() == kind::boolean; }
  bool is_int() const noexcept { return type() == kind::integer || type() == kind::boolean; }
  bool is_number() const noexcept { return is_int() || type() == kind::floating; }
  bool is_string() const noexcept { return type() == kind::string; }
  bool is_list() const noexcept { return type() == kind::list; }
  bool is_tuple() const noexcept { return tuple_; }
  bool is_dict() const noexcept { return type() == kind::dict; }
  bool is_namespace() const noexcept { return type() == kind::ns; }
  bool is_function() const noexcept { return type() == kind::function; }

  bool as_bool() const { return std::get<bool>(v_); }
  /// Integer value (bools are ints, as in Python).
  std::int64_t as_int() const { return is_bool() ? std::int64_t{as_bool()} : std::get<std::int64_t>(v_); }
  double as_double() const { return type() == kind::floating ? std::get<double>(v_) : static_cast<double>(as_int()); }
  const std::string& as_string() const { return std::get<std::string>(v_); }
  const list& as_list() const { return *std::get<std::shared_ptr<const list>>(v_); }
  const dict& as_dict() const { return *std::get<std::shared_ptr<const dict>>(v_); }
  /// A namespace's attributes; shared, so assignment through any copy is seen by all.
  dict& ns_attrs() const { return *std::get<std::shared_ptr<dict>>(v_); }
  const function& as_function() const { return *std::get<std::shared_ptr<const function>>(v_); }
  const std::string& undefined_hint() const { return std::get<undefined>(v_).hint; }

  /// How deeply lists, dicts and namespaces nest inside (0 for scalars).
  /// Renderers bound it: destroying or printing a value recurses this deep.
  std::uint32_t depth() const noexcept;

  /// Python truthiness (undefined is false).
  bool truthy() const;
  /// Python's type name as jinja2 error messages show it ("str", "dict", ...).
  std::string_view type_name() const;

 private:
  std::uint32_t depth_ = 0;
  bool tuple_ = false;
  std::variant<undefined, none_t, bool, std::int64_t, double, std::string, std::shared_ptr<const list>,
               std::shared_ptr<const dict>, std::shared_ptr<dict>, std::shared_ptr<const function>>
      v_;
};

/// A dict with string keys that iterates in insertion order (Python 3.7+).
class dict {
 public:
  const value* find(std::string_view key) const;
  /// Inserts or replaces; keeps the first insertion's position.
  void set(std::string key, value v);
  std::size_t size() const noexcept { return items_.size(); }
  const std::vector<std::pair<std::string, value>>& items() const noexcept { return items_; }
  /// 1 + the deepest value inside (kept as items are set).
  std::uint32_t depth() const noexcept { return depth_; }

 private:
  std::vector<std::pair<std::string, value>> items_;
  std::unordered_map<std::string, std::size_t> index_;
  std::uint32_t depth_ = 1;
};

inline std::uint32_t value::depth() const noexcept { return is_namespace() ? ns_attrs().depth() : depth_; }

/// Python `==` (1 == 1.0 == True; lists and dicts compare by value;
/// undefined equals only undefined).
bool equals(const value& a, const value& b);

/// Python str(): what `{{ x }}` prints. Undefined prints nothing, None
/// "None", bools "True"/"False", floats as repr(), lists and dicts as repr().
/// Output beyond `bytes_max` is cut off (callers check the size).
std::string to_str(const value& v, std::size_t bytes_max);
/// Python repr() (strings quoted), used inside list/dict reprs.
std::string to_repr(const value& v, std::size_t bytes_max);
/// repr() of a float exactly as CPython prints it (shortest round trip).
std::string python_float_repr(double d);

}  // namespace exa::jinja
