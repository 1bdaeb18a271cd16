#pragma once
// The shape of a Llama-family model, read from `{general.architecture}.*` GGUF
// metadata. Two architectures share this transformer: `llama` (Llama 1-3.x,
// Mistral, TinyLlama, SmolLM) and `qwen2` (Qwen2/2.5: biases on Q/K/V and
// RoPE over half-split pairs). Anything else is refused by name.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.hpp"

namespace exa::model {

class gguf_file;

/// The model families the engine runs, by their `general.architecture` name.
enum class architecture : std::uint8_t { llama, qwen2 };

/// "llama", "qwen2".
std::string_view to_string(architecture a) noexcept;

/// Parses the names above (exact, as GGUF writes them); nullopt otherwise.
std::optional<architecture> architecture_from_string(std::string_view s) noexcept;

/// Which elements of a head RoPE rotates together. llama-architecture files
/// rotate adjacent pairs (x[2i], x[2i+1]) (ggml's NORM mode: the converters
/// permute Q and K rows to it); qwen2 files rotate (x[i], x[i + rope_dim/2])
/// (ggml's NEOX mode, the Hugging Face layout, unpermuted).
enum class rope_pairing : std::uint8_t { adjacent, halves };

struct llama_config {
  architecture arch = architecture::llama;  // general.architecture
  rope_pairing rope_pairs = rope_pairing::adjacent;  // implied by arch
  std::string name;               // general.name, or empty
  // Every key below is `{arch}.…`: e.g. llama.context_length, qwen2.context_length.
  std::uint32_t context_length = 0;   // .context_length
  std::uint32_t dim = 0;              // .embedding_length
  std::uint32_t n_layers = 0;         // .block_count
  std::uint32_t ff_dim = 0;           // .feed_forward_length
  std::uint32_t n_heads = 0;          // .attention.head_count
  std::uint32_t n_kv_heads = 0;       // .attention.head_count_kv (default n_heads)
  std::uint32_t rope_dim = 0;         // .rope.dimension_count (default head_dim)
  float rope_freq_base = 10000.0f;    // .rope.freq_base
  /// Multiplies every RoPE angle: 1 / .rope.scaling.factor when the scaling
  /// type is linear (llama.cpp's default type), 1 without a factor or with
  /// type "none".
  float rope_freq_scale = 1.0f;
  float rms_eps = 1e-5f;              // .attention.layer_norm_rms_epsilon
  std::uint32_t vocab_size = 0;       // from token_embd.weight's shape

  std::uint32_t head_dim() const noexcept { return dim / n_heads; }
  std::uint32_t kv_dim() const noexcept { return n_kv_heads * head_dim(); }
  /// Bytes of K and V for one token across all layers, at `bytes_per_elem`.
  std::uint64_t kv_bytes_per_token(std::uint32_t bytes_per_elem) const noexcept {
    return std::uint64_t{2} * n_layers * kv_dim() * bytes_per_elem;
  }
};

/// Reads and validates the config. general.architecture must be one of the
/// architectures above ("unsupported architecture 'X' (supported: llama,
/// qwen2)" otherwise); every size nonzero and within limits; dim divisible by
/// head_count; head_count divisible by head_count_kv; rope_dim even and <=
/// head_dim; RoPE scaling "none" or "linear" (YaRN and LongRoPE are refused by
/// name). Errors name the key.
expected<llama_config> read_llama_config(const gguf_file& file);

}  // namespace exa::model
