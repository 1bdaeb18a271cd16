#include "model/quant_mix.hpp"

#include <charconv>

namespace exa::model {

namespace {

bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto lower = [](char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

// Layer index of a "blk.N.*" tensor name; nullopt for other names.
std::optional<int> layer_of(std::string_view name) noexcept {
  constexpr std::string_view prefix = "blk.";
  if (!name.starts_with(prefix)) return std::nullopt;
  int layer = 0;
  const char* begin = name.data() + prefix.size();
  const auto [end, ec] = std::from_chars(begin, name.data() + name.size(), layer);
  if (ec != std::errc{} || end == begin || *end != '.') return std::nullopt;
  return layer;
}

bool ends_with_role(std::string_view name, std::string_view role) noexcept {
  return name.ends_with(role);
}

}  // namespace

std::optional<weight_format> weight_format_from_string(std::string_view s) noexcept {
  if (iequals(s, "q4_k_m")) return weight_format{tensor_type::q4_K, quant_mix::k_m};
  if (iequals(s, "q5_k_m")) return weight_format{tensor_type::q5_K, quant_mix::k_m};
  if (auto t = tensor_type_from_string(s)) return weight_format{*t, quant_mix::uniform};
  return std::nullopt;
}

std::string to_string(const weight_format& f) {
  if (f.mix == quant_mix::k_m) return f.base == tensor_type::q5_K ? "q5_k_m" : "q4_k_m";
  return std::string(to_string(f.base));
}

std::uint32_t llama_file_type(const weight_format& f) noexcept {
  if (f.mix == quant_mix::k_m) return f.base == tensor_type::q5_K ? 17 : 15;
  switch (f.base) {
    case tensor_type::f32: return 0;
    case tensor_type::f16: return 1;
    case tensor_type::q4_0: return 2;
    case tensor_type::q4_1: return 3;
    case tensor_type::q5_0: return 8;
    case tensor_type::q5_1: return 9;
    case tensor_type::q8_0: return 7;
    case tensor_type::q4_K: return 14;
    case tensor_type::q5_K: return 16;
    case tensor_type::q6_K: return 18;
    case tensor_type::bf16: return 32;
  }
  return 0;
}

bool use_more_bits(int i_layer, int n_layers) noexcept {
  return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2;
}

namespace {

tensor_type mixed_type(const weight_format& f, std::string_view name, bool tied_embeddings,
                       std::uint32_t n_layers, std::uint64_t cols) noexcept {
  if (f.mix == quant_mix::uniform) return f.base;
  if (name == "output.weight" || (tied_embeddings && name == "token_embd.weight")) {
    return cols % block_elems(f.base) == 0 ? tensor_type::q6_K : tensor_type::q8_0;
  }
  const std::optional<int> layer = layer_of(name);
  if (layer && (ends_with_role(name, ".attn_v.weight") || ends_with_role(name, ".ffn_down.weight")) &&
      use_more_bits(*layer, static_cast<int>(n_layers))) {
    return tensor_type::q6_K;
  }
  return f.base;
}

tensor_type fallback(tensor_type t, std::uint64_t cols) noexcept {
  if (cols % block_elems(t) == 0) return t;
  switch (t) {
    case tensor_type::q4_K: t = tensor_type::q5_0; break;
    case tensor_type::q5_K: t = tensor_type::q5_1; break;
    case tensor_type::q6_K: t = tensor_type::q8_0; break;
    default: break;
  }
  return cols % block_elems(t) == 0 ? t : tensor_type::f16;
}

}  // namespace

tensor_type weight_type_for(const weight_format& f, std::string_view name, bool tied_embeddings,
                            std::uint32_t n_layers, std::uint64_t cols) noexcept {
  return fallback(mixed_type(f, name, tied_embeddings, n_layers, cols), cols);
}

}  // namespace exa::model
