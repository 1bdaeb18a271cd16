#pragma once
// Strict command-line flags for the exaserve subcommands: `--name value` or
// `--name=value`, every flag declared up front, numbers range-checked, and an
// error naming the flag for anything else.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace exa::app {

struct flag_spec {
  std::string name;  // without the leading "--"
  bool takes_value = true;
  std::string help;
};

class args {
 public:
  /// Parses argv[first, argc) against `specs`. Errors: invalid_argument for
  /// an unknown flag, a missing value, or a flag given twice.
  static expected<args> parse(int argc, char** argv, int first, const std::vector<flag_spec>& specs);

  bool has(const std::string& name) const { return values_.count(name) != 0; }
  std::optional<std::string> get(const std::string& name) const;
  std::string get_or(const std::string& name, std::string fallback) const;

  /// Integer flag in [min, max]; `fallback` when absent.
  expected<std::int64_t> get_int(const std::string& name, std::int64_t fallback, std::int64_t min,
                                 std::int64_t max) const;
  /// Finite number in [min, max]; `fallback` when absent.
  expected<double> get_double(const std::string& name, double fallback, double min, double max) const;

  const std::vector<std::string>& positional() const noexcept { return positional_; }

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

/// "  --name VALUE   help" lines for a usage message.
std::string describe_flags(const std::vector<flag_spec>& specs);

/// Parses "1,2,3" strictly (no spaces at ends, no empty items, each in
/// [0, 2^31)). Errors name the bad item.
expected<std::vector<std::int32_t>> parse_id_list(const std::string& text);

}  // namespace exa::app
