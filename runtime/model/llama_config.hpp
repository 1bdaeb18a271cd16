#pragma once
// The shape of a Llama-architecture model, read from `llama.*` GGUF metadata.

#include <cstdint>
#include <string>

#include "common/error.hpp"

namespace exa::model {

class gguf_file;

struct llama_config {
  std::string name;               // general.name, or empty
  std::uint32_t context_length = 0;   // llama.context_length
  std::uint32_t dim = 0;              // llama.embedding_length
  std::uint32_t n_layers = 0;         // llama.block_count
  std::uint32_t ff_dim = 0;           // llama.feed_forward_length
  std::uint32_t n_heads = 0;          // llama.attention.head_count
  std::uint32_t n_kv_heads = 0;       // llama.attention.head_count_kv (default n_heads)
  std::uint32_t rope_dim = 0;         // llama.rope.dimension_count (default head_dim)
  float rope_freq_base = 10000.0f;    // llama.rope.freq_base
  float rms_eps = 1e-5f;              // llama.attention.layer_norm_rms_epsilon
  std::uint32_t vocab_size = 0;       // from token_embd.weight's shape

  std::uint32_t head_dim() const noexcept { return dim / n_heads; }
  std::uint32_t kv_dim() const noexcept { return n_kv_heads * head_dim(); }
  /// Bytes of K and V for one token across all layers, at `bytes_per_elem`.
  std::uint64_t kv_bytes_per_token(std::uint32_t bytes_per_elem) const noexcept {
    return std::uint64_t{2} * n_layers * kv_dim() * bytes_per_elem;
  }
};

/// Reads and validates the config: architecture must be "llama"; every size
/// nonzero and within limits; dim divisible by head_count; head_count divisible
/// by head_count_kv; rope_dim even and <= head_dim. Errors name the key.
expected<llama_config> read_llama_config(const gguf_file& file);

}  // namespace exa::model
