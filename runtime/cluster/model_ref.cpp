#include "cluster/model_ref.hpp"

#include <charconv>
#include <vector>

namespace exa::cluster {
namespace {

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  for (std::size_t start = 0;;) {
    const auto p = s.find(sep, start);
    out.push_back(s.substr(start, p == std::string_view::npos ? std::string_view::npos : p - start));
    if (p == std::string_view::npos) return out;
    start = p + 1;
  }
}

}  // namespace

expected<model_ref> parse_model_ref(std::string_view text) {
  model_ref ref;
  if (text.rfind("preset:", 0) != 0) {
    ref.file = std::string(text);
    return ref;
  }
  const auto parts = split(text.substr(7), ':');
  if (parts.size() < 2 || parts.size() > 3)
    return make_error(errc::invalid_argument,
                      "model reference '" + std::string(text) + "': expected preset:NAME:PRECISION[:ctx=N]");
  const auto p = precision_from_string(parts[1]);
  if (!p) return make_error(errc::invalid_argument, "model reference '" + std::string(text) + "': unknown precision '" +
                                                        std::string(parts[1]) + "'");
  auto shape = model_shape_preset(parts[0], *p);
  if (!shape) return std::unexpected(shape.error());
  if (parts.size() == 3) {
    std::uint32_t ctx = 0;
    const auto v = parts[2];
    if (v.rfind("ctx=", 0) != 0 ||
        std::from_chars(v.data() + 4, v.data() + v.size(), ctx).ec != std::errc() || ctx < 16 || ctx > (1u << 20))
      return make_error(errc::invalid_argument, "model reference '" + std::string(text) +
                                                    "': the last part must be ctx=N with 16 <= N <= 1048576");
    shape->context_length = ctx;
  }
  ref.preset = std::move(*shape);
  return ref;
}

std::string preset_ref(std::string_view name, precision p, std::optional<std::uint32_t> context_length) {
  std::string out = "preset:" + std::string(name) + ":" + std::string(to_string(p));
  if (context_length) out += ":ctx=" + std::to_string(*context_length);
  return out;
}

}  // namespace exa::cluster
