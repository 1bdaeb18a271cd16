#pragma once
// Generates Llama-architecture GGUF models with deterministic pseudo-random
// weights: the same spec and seed always give the same file, byte for byte.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.hpp"
#include "model/llama_config.hpp"
#include "model/quant_mix.hpp"
#include "model/tensor_type.hpp"
#include "model/vocab.hpp"

namespace exa::model {

/// RoPE scaling a generated file carries. linear: {arch}.rope.scaling.type
/// "linear" and .factor; llama3: rope_freqs.weight with the per-pair factors
/// llama.cpp's converter computes for Llama 3.1 (rope_type "llama3", low/high
/// frequency factors 1 and 4).
enum class rope_scaling_kind : std::uint8_t { none, linear, llama3 };

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
  /// k_m: `type` (q4_K or q5_K) is the base of llama.cpp's *_K_M mix
  /// (model/quant_mix.hpp); uniform: every 2-D weight is `type`.
  quant_mix mix = quant_mix::uniform;
  bool tie_embeddings = false;          // omit output.weight
  std::uint64_t seed = 1;
  /// llama, or qwen2: Q/K/V biases (~N(0, 0.5²)) and `qwen2.*` keys.
  architecture arch = architecture::llama;
  rope_scaling_kind rope_scaling = rope_scaling_kind::none;
  float rope_scaling_factor = 8.0f;             // linear and llama3
  std::uint32_t rope_original_context = 8192;   // llama3's original_max_position_embeddings
  /// Blocks from `deep_block_from` on write their attention and MLP outputs
  /// scaled by `deep_block_scale` (their attn_output and ffn_down weights):
  /// random weights give every block an equal say, while a trained model's
  /// deep blocks mostly refine what the first ones computed -- which is what
  /// lets a draft cut to those first blocks (model/draft_model.hpp) agree
  /// with it. 1: off; the scale sets how often such a draft agrees.
  float deep_block_scale = 1.0f;
  std::uint32_t deep_block_from = 0;
  /// The vocabulary to write; absent: the byte-level one of `vocab_size`
  /// tokens. When present, `vocab_size` must equal its token count.
  std::optional<model::vocab> vocabulary;
};

/// Named presets: "tiny" (a few MB; tests and the default `make run`) and
/// "small" (~100M parameters; benchmarks). nullopt for an unknown name.
std::optional<model_spec> preset_spec(std::string_view name);

/// Checks a spec before any work: sizes nonzero and bounded, dim % heads == 0,
/// heads % kv_heads == 0, even head_dim, quantized types need dim and ff_dim
/// divisible by 32 (K-quant tensors with other row lengths fall back per
/// tensor as llama.cpp does; see weight_type_for), vocab >= 260 (the byte-level tokenizer) unless the spec
/// carries its own vocabulary, which must be valid and `vocab_size` long.
expected<void> validate(const model_spec& spec);

/// Writes the model to `path` (atomically). Weights ~ N(0, 1/sqrt(fan_in))
/// from a counter-based generator keyed by (seed, tensor name, index), so any
/// tensor is reproducible on its own. Norm weights are 1 + small noise.
expected<void> generate_model(const model_spec& spec, const std::string& path);

}  // namespace exa::model
