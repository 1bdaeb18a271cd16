#pragma once
// Generates Llama-architecture GGUF models with deterministic pseudo-random
// weights: the same spec and seed always give the same file, byte for byte.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.hpp"
#include "model/tensor_type.hpp"

namespace exa::model {

struct model_spec {
  std::string name = "exaserve-tiny";
  std::uint32_t n_layers = 2;
  std::uint32_t dim = 64;
  std::uint32_t n_heads = 4;
  std::uint32_t n_kv_heads = 2;
  std::uint32_t ff_dim = 192;
  std::uint32_t vocab_size = 260;
  std::uint32_t context_length = 512;
  float rope_freq_base = 10000.0f;
  float rms_eps = 1e-5f;
  tensor_type type = tensor_type::f32;  // 2-D weights; norms are always f32
  bool tie_embeddings = false;          // omit output.weight
  std::uint64_t seed = 1;
};

/// Named presets: "tiny" (a few MB; tests and the default `make run`) and
/// "small" (~100M parameters; benchmarks). nullopt for an unknown name.
std::optional<model_spec> preset_spec(std::string_view name);

/// Checks a spec before any work: sizes nonzero and bounded, dim % heads == 0,
/// heads % kv_heads == 0, even head_dim, quantized types need dim and ff_dim
/// divisible by 32, vocab >= 260 (the byte-level tokenizer).
expected<void> validate(const model_spec& spec);

/// Writes the model to `path` (atomically). Weights ~ N(0, 1/sqrt(fan_in))
/// from a counter-based generator keyed by (seed, tensor name, index), so any
/// tensor is reproducible on its own. Norm weights are 1 + small noise.
expected<void> generate_model(const model_spec& spec, const std::string& path);

}  // namespace exa::model
