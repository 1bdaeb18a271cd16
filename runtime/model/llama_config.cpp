#include "model/llama_config.hpp"

#include <cmath>
#include <cstdint>
#include <limits>

#include <fmt/format.h>

#include "model/gguf.hpp"

namespace exa::model {

namespace {

// Sanity bounds: far above any real Llama model, low enough that products of
// them (KV sizes, activation buffers) stay in 64-bit range.
constexpr std::int64_t max_dim = 65536;
constexpr std::int64_t max_layers = 1024;
constexpr std::int64_t max_heads = 1024;
constexpr std::int64_t max_ff = std::int64_t{1} << 20;
constexpr std::int64_t max_context = std::int64_t{1} << 24;
constexpr std::int64_t max_vocab = std::int64_t{1} << 22;

std::unexpected<error> invalid(std::string message) {
  return make_error(errc::invalid_argument, std::move(message));
}

// A required integer key in [1, max].
expected<std::uint32_t> read_size(const gguf_file& f, std::string_view key, std::int64_t max) {
  auto v = f.get_int(key);
  if (!v) {
    if (v.error().code == errc::not_found) {
      return make_error(errc::not_found, fmt::format("missing required key '{}'", key));
    }
    return std::unexpected(v.error());
  }
  if (*v < 1 || *v > max) {
    return invalid(fmt::format("{} = {} is out of range (1..{})", key, *v, max));
  }
  return static_cast<std::uint32_t>(*v);
}

// An optional integer key in [1, max]; `fallback` when absent.
expected<std::uint32_t> read_size_or(const gguf_file& f, std::string_view key, std::int64_t max,
                                     std::uint32_t fallback) {
  if (f.find(key) == nullptr) return fallback;
  return read_size(f, key, max);
}

// An optional float key that must be finite and positive; `fallback` when absent.
expected<float> read_positive_or(const gguf_file& f, std::string_view key, float fallback) {
  if (f.find(key) == nullptr) return fallback;
  auto v = f.get_float(key);
  if (!v) return std::unexpected(v.error());
  // Checked as a double first: narrowing an out-of-range double is undefined.
  const bool in_range = std::isfinite(*v) && *v > 0.0 &&
                        *v <= static_cast<double>(std::numeric_limits<float>::max());
  if (!in_range || !(static_cast<float>(*v) > 0.0f)) {
    return invalid(fmt::format("{} = {} must be positive and finite", key, *v));
  }
  return static_cast<float>(*v);
}

expected<std::uint32_t> read_vocab_size(const gguf_file& f) {
  const gguf_tensor* t = f.find_tensor("token_embd.weight");
  if (t == nullptr) return make_error(errc::not_found, "missing tensor 'token_embd.weight'");
  if (t->shape.size() != 2) {
    return invalid(fmt::format("tensor 'token_embd.weight' has {} dimensions, expected 2",
                               t->shape.size()));
  }
  if (t->shape[1] > static_cast<std::uint64_t>(max_vocab)) {
    return invalid(fmt::format("vocabulary size {} (token_embd.weight) exceeds {}", t->shape[1],
                               max_vocab));
  }
  return static_cast<std::uint32_t>(t->shape[1]);
}

// `{arch}.suffix`: every hyper-parameter key carries the architecture's name.
std::string arch_key(architecture a, std::string_view suffix) {
  return fmt::format("{}.{}", to_string(a), suffix);
}

expected<void> read_sizes(const gguf_file& f, llama_config& c) {
  struct required {
    std::string_view suffix;
    std::int64_t max;
    std::uint32_t* out;
  };
  const required keys[] = {
      {"context_length", max_context, &c.context_length},
      {"embedding_length", max_dim, &c.dim},
      {"block_count", max_layers, &c.n_layers},
      {"feed_forward_length", max_ff, &c.ff_dim},
      {"attention.head_count", max_heads, &c.n_heads},
  };
  for (const required& r : keys) {
    auto v = read_size(f, arch_key(c.arch, r.suffix), r.max);
    if (!v) return std::unexpected(v.error());
    *r.out = *v;
  }
  auto kv = read_size_or(f, arch_key(c.arch, "attention.head_count_kv"), max_heads, c.n_heads);
  if (!kv) return std::unexpected(kv.error());
  c.n_kv_heads = *kv;
  return {};
}

// Relations between the sizes; every message names the keys involved.
expected<void> check_shape(llama_config& c, const gguf_file& f) {
  const std::string dim_key = arch_key(c.arch, "embedding_length");
  const std::string heads_key = arch_key(c.arch, "attention.head_count");
  if (c.dim % c.n_heads != 0) {
    return invalid(fmt::format("{} {} is not divisible by {} {}", dim_key, c.dim, heads_key, c.n_heads));
  }
  if (c.n_kv_heads > c.n_heads || c.n_heads % c.n_kv_heads != 0) {
    return invalid(fmt::format("{} {} is not a multiple of {} {}", heads_key, c.n_heads,
                               arch_key(c.arch, "attention.head_count_kv"), c.n_kv_heads));
  }
  if (c.head_dim() % 2 != 0) {
    return invalid(fmt::format("head dimension {} ({} / {}) must be even for RoPE", c.head_dim(), dim_key,
                               heads_key));
  }
  // Files may state the head width; the engine only runs heads of dim / n_heads.
  for (const char* suffix : {"attention.key_length", "attention.value_length"}) {
    const std::string key = arch_key(c.arch, suffix);
    auto v = read_size_or(f, key, max_dim, c.head_dim());
    if (!v) return std::unexpected(v.error());
    if (*v != c.head_dim()) {
      return make_error(errc::unsupported,
                        fmt::format("{} = {} differs from {} / {} = {}, which the engine does not run",
                                    key, *v, dim_key, heads_key, c.head_dim()));
    }
  }
  const std::string rope_key = arch_key(c.arch, "rope.dimension_count");
  auto rope = read_size_or(f, rope_key, max_dim, c.head_dim());
  if (!rope) return std::unexpected(rope.error());
  if (*rope % 2 != 0 || *rope > c.head_dim()) {
    return invalid(fmt::format("{} {} must be even and at most the head dimension {}", rope_key, *rope,
                               c.head_dim()));
  }
  c.rope_dim = *rope;
  return {};
}

// RoPE scaling as llama.cpp reads it: the type defaults to "linear", the
// factor (or its old name rope.scale_linear) to none; a factor of 0 means
// none; type "none" disables any factor. Llama 3.1's scaling is not a type
// here: its converter stores per-pair factors in rope_freqs.weight instead.
expected<void> read_rope_scaling(const gguf_file& f, llama_config& c) {
  const std::string type_key = arch_key(c.arch, "rope.scaling.type");
  std::string type = "linear";
  if (f.find(type_key) != nullptr) {
    auto v = f.get_string(type_key);
    if (!v) return std::unexpected(v.error());
    type = std::move(*v);
  }
  if (type == "yarn" || type == "longrope") {
    return make_error(errc::unsupported,
                      fmt::format("{} '{}' is not supported (supported: none, linear)", type_key, type));
  }
  if (type != "none" && type != "linear") {
    return invalid(fmt::format("{} '{}' is not a RoPE scaling type (none, linear, yarn, longrope)",
                               type_key, type));
  }
  std::string factor_key = arch_key(c.arch, "rope.scaling.factor");
  if (f.find(factor_key) == nullptr) factor_key = arch_key(c.arch, "rope.scale_linear");
  if (type == "none" || f.find(factor_key) == nullptr) return {};
  auto factor = f.get_float(factor_key);
  if (!factor) return std::unexpected(factor.error());
  if (*factor == 0.0) return {};
  auto checked = read_positive_or(f, factor_key, 1.0f);
  if (!checked) return std::unexpected(checked.error());
  c.rope_freq_scale = 1.0f / *checked;
  return {};
}

expected<architecture> read_architecture(const gguf_file& file) {
  auto arch = file.get_string("general.architecture");
  if (!arch) {
    if (arch.error().code == errc::not_found) {
      return make_error(errc::not_found, "missing required key 'general.architecture'");
    }
    return std::unexpected(arch.error());
  }
  auto a = architecture_from_string(*arch);
  if (!a) {
    return make_error(errc::unsupported,
                      fmt::format("unsupported architecture '{}' (supported: llama, qwen2)", *arch));
  }
  return *a;
}

}  // namespace

std::string_view to_string(architecture a) noexcept {
  switch (a) {
    case architecture::llama: return "llama";
    case architecture::qwen2: return "qwen2";
  }
  return "unknown";
}

std::optional<architecture> architecture_from_string(std::string_view s) noexcept {
  for (architecture a : {architecture::llama, architecture::qwen2}) {
    if (s == to_string(a)) return a;
  }
  return std::nullopt;
}

expected<llama_config> read_llama_config(const gguf_file& file) {
  auto arch = read_architecture(file);
  if (!arch) return std::unexpected(arch.error());
  llama_config c;
  c.arch = *arch;
  // llama.cpp ropes qwen2 in NEOX mode and llama in NORM mode.
  c.rope_pairs = c.arch == architecture::qwen2 ? rope_pairing::halves : rope_pairing::adjacent;
  if (file.find("general.name") != nullptr) {
    auto name = file.get_string("general.name");
    if (!name) return std::unexpected(name.error());
    c.name = std::move(*name);
  }
  if (auto r = read_sizes(file, c); !r) return std::unexpected(r.error());
  if (auto r = check_shape(c, file); !r) return std::unexpected(r.error());
  auto base = read_positive_or(file, arch_key(c.arch, "rope.freq_base"), 10000.0f);
  if (!base) return std::unexpected(base.error());
  c.rope_freq_base = *base;
  if (auto r = read_rope_scaling(file, c); !r) return std::unexpected(r.error());
  auto eps = read_positive_or(file, arch_key(c.arch, "attention.layer_norm_rms_epsilon"), 1e-5f);
  if (!eps) return std::unexpected(eps.error());
  c.rms_eps = *eps;
  auto vocab = read_vocab_size(file);
  if (!vocab) return std::unexpected(vocab.error());
  c.vocab_size = *vocab;
  return c;
}

}  // namespace exa::model
