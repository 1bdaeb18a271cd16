#include "args.hpp"

#include <charconv>
#include <cmath>

namespace exa::app {
namespace {

const flag_spec* find_spec(const std::vector<flag_spec>& specs, const std::string& name) {
  for (const auto& s : specs)
    if (s.name == name) return &s;
  return nullptr;
}

}  // namespace

expected<args> args::parse(int argc, char** argv, int first, const std::vector<flag_spec>& specs) {
  args out;
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0 || a == "--") {
      out.positional_.push_back(std::move(a));
      continue;
    }
    std::string name = a.substr(2);
    std::optional<std::string> value;
    if (const auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    const flag_spec* spec = find_spec(specs, name);
    if (spec == nullptr) return make_error(errc::invalid_argument, "unknown flag --" + name);
    if (out.values_.count(name)) return make_error(errc::invalid_argument, "flag --" + name + " given twice");
    if (!spec->takes_value) {
      if (value) return make_error(errc::invalid_argument, "flag --" + name + " takes no value");
      out.values_[name] = "true";
      continue;
    }
    if (!value) {
      if (i + 1 >= argc) return make_error(errc::invalid_argument, "flag --" + name + " needs a value");
      value = argv[++i];
    }
    out.values_[name] = *value;
  }
  return out;
}

std::optional<std::string> args::get(const std::string& name) const {
  const auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string args::get_or(const std::string& name, std::string fallback) const {
  auto v = get(name);
  return v ? *v : std::move(fallback);
}

expected<std::int64_t> args::get_int(const std::string& name, std::int64_t fallback, std::int64_t min,
                                     std::int64_t max) const {
  const auto v = get(name);
  if (!v) return fallback;
  std::int64_t out = 0;
  const auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), out);
  if (ec != std::errc() || end != v->data() + v->size())
    return make_error(errc::invalid_argument, "--" + name + " must be an integer, got '" + *v + "'");
  if (out < min || out > max)
    return make_error(errc::invalid_argument, "--" + name + " must be in [" + std::to_string(min) + ", " +
                                                  std::to_string(max) + "], got " + *v);
  return out;
}

expected<double> args::get_double(const std::string& name, double fallback, double min,
                                  double max) const {
  const auto v = get(name);
  if (!v) return fallback;
  double out = 0;
  const auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), out);
  if (ec != std::errc() || end != v->data() + v->size() || !std::isfinite(out))
    return make_error(errc::invalid_argument, "--" + name + " must be a number, got '" + *v + "'");
  if (out < min || out > max)
    return make_error(errc::invalid_argument, "--" + name + " must be in [" + std::to_string(min) + ", " +
                                                  std::to_string(max) + "], got " + *v);
  return out;
}

std::string describe_flags(const std::vector<flag_spec>& specs) {
  std::string out;
  for (const auto& s : specs) {
    std::string left = "  --" + s.name + (s.takes_value ? " VALUE" : "");
    if (left.size() < 24) left.resize(24, ' ');
    out += left + " " + s.help + "\n";
  }
  return out;
}

expected<std::vector<std::int32_t>> parse_id_list(const std::string& text) {
  std::vector<std::int32_t> ids;
  std::size_t start = 0;
  if (text.empty()) return make_error(errc::invalid_argument, "token id list is empty");
  for (;;) {
    const std::size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    std::int64_t v = -1;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || v < 0 || v > INT32_MAX)
      return make_error(errc::invalid_argument, "bad token id '" + item + "' at position " +
                                                    std::to_string(ids.size()) + " of the id list");
    ids.push_back(static_cast<std::int32_t>(v));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ids;
}

}  // namespace exa::app
