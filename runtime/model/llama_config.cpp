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

expected<void> read_sizes(const gguf_file& f, llama_config& c) {
  struct required {
    std::string_view key;
    std::int64_t max;
    std::uint32_t* out;
  };
  const required keys[] = {
      {"llama.context_length", max_context, &c.context_length},
      {"llama.embedding_length", max_dim, &c.dim},
      {"llama.block_count", max_layers, &c.n_layers},
      {"llama.feed_forward_length", max_ff, &c.ff_dim},
      {"llama.attention.head_count", max_heads, &c.n_heads},
  };
  for (const required& r : keys) {
    auto v = read_size(f, r.key, r.max);
    if (!v) return std::unexpected(v.error());
    *r.out = *v;
  }
  auto kv = read_size_or(f, "llama.attention.head_count_kv", max_heads, c.n_heads);
  if (!kv) return std::unexpected(kv.error());
  c.n_kv_heads = *kv;
  return {};
}

// Relations between the sizes; every message names the keys involved.
expected<void> check_shape(llama_config& c, const gguf_file& f) {
  if (c.dim % c.n_heads != 0) {
    return invalid(fmt::format(
        "llama.embedding_length {} is not divisible by llama.attention.head_count {}", c.dim,
        c.n_heads));
  }
  if (c.n_kv_heads > c.n_heads || c.n_heads % c.n_kv_heads != 0) {
    return invalid(fmt::format(
        "llama.attention.head_count {} is not a multiple of llama.attention.head_count_kv {}",
        c.n_heads, c.n_kv_heads));
  }
  if (c.head_dim() % 2 != 0) {
    return invalid(fmt::format("head dimension {} (llama.embedding_length / "
                               "llama.attention.head_count) must be even for RoPE",
                               c.head_dim()));
  }
  auto rope = read_size_or(f, "llama.rope.dimension_count", max_dim, c.head_dim());
  if (!rope) return std::unexpected(rope.error());
  if (*rope % 2 != 0 || *rope > c.head_dim()) {
    return invalid(fmt::format(
        "llama.rope.dimension_count {} must be even and at most the head dimension {}", *rope,
        c.head_dim()));
  }
  c.rope_dim = *rope;
  return {};
}

}  // namespace

expected<llama_config> read_llama_config(const gguf_file& file) {
  auto arch = file.get_string("general.architecture");
  if (!arch) {
    if (arch.error().code == errc::not_found) {
      return make_error(errc::not_found, "missing required key 'general.architecture'");
    }
    return std::unexpected(arch.error());
  }
  if (*arch != "llama") {
    return make_error(errc::unsupported,
                      fmt::format("general.architecture '{}' is not supported (only 'llama')", *arch));
  }
  llama_config c;
  if (file.find("general.name") != nullptr) {
    auto name = file.get_string("general.name");
    if (!name) return std::unexpected(name.error());
    c.name = std::move(*name);
  }
  if (auto r = read_sizes(file, c); !r) return std::unexpected(r.error());
  if (auto r = check_shape(c, file); !r) return std::unexpected(r.error());
  auto base = read_positive_or(file, "llama.rope.freq_base", 10000.0f);
  if (!base) return std::unexpected(base.error());
  c.rope_freq_base = *base;
  auto eps = read_positive_or(file, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
  if (!eps) return std::unexpected(eps.error());
  c.rms_eps = *eps;
  auto vocab = read_vocab_size(file);
  if (!vocab) return std::unexpected(vocab.error());
  c.vocab_size = *vocab;
  return c;
}

}  // namespace exa::model
