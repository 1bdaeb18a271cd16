#pragma once
// Views of a Llama-family model's weight tensors inside a mapped GGUF file,
// checked against the config: every tensor present with the shape the
// architecture needs and a type the engine runs, and no tensor the
// architecture would leave unused. Nothing is copied: the views point into
// the mapping, so the file must outlive them.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "model/llama_config.hpp"
#include "model/tensor_type.hpp"

namespace exa::model {

class gguf_file;

/// A 1-D or 2-D weight: `rows` rows of `cols` elements, each row contiguous.
/// For ggml shape {cols, rows}; a 1-D tensor has rows == 1.
struct weight_view {
  tensor_type type = tensor_type::f32;
  std::uint64_t rows = 0;
  std::uint64_t cols = 0;
  const std::byte* data = nullptr;
  std::string name;
  /// q8_0 only: the same rows repacked for the engine's kernels
  /// (engine/q8_pack.hpp), or null (the kernels then pack as they go).
  const std::byte* packed = nullptr;
  /// `data` is memory of the process's own, not the file's mapping (a
  /// tensor-parallel member's repacked columns, engine/tp_weights.hpp): the
  /// engine's forward reads it where it is instead of copying it again.
  bool owned = false;

  std::uint64_t row_bytes() const noexcept;
  const std::byte* row(std::uint64_t r) const noexcept { return data + r * row_bytes(); }
  std::uint64_t bytes() const noexcept { return rows * row_bytes(); }
};

struct llama_layer_weights {
  weight_view attn_norm;    // {dim}
  weight_view wq;           // {dim, dim}: rows = n_heads * head_dim
  weight_view wk;           // {dim, kv_dim}
  weight_view wv;           // {dim, kv_dim}
  weight_view wo;           // {dim, dim}
  weight_view ffn_norm;     // {dim}
  weight_view w_gate;       // {dim, ff}
  weight_view w_up;         // {dim, ff}
  weight_view w_down;       // {ff, dim}
  // Attention biases, added after each projection: qwen2 files always carry
  // the Q/K/V ones; llama files may carry any of the four (as llama.cpp's
  // llama graph allows).
  std::optional<weight_view> bq;  // {dim}
  std::optional<weight_view> bk;  // {kv_dim}
  std::optional<weight_view> bv;  // {kv_dim}
  std::optional<weight_view> bo;  // {dim}
};

struct llama_weights {
  weight_view token_embd;   // {dim, vocab}
  std::vector<llama_layer_weights> layers;
  weight_view output_norm;  // {dim}
  weight_view output;       // {dim, vocab}; token_embd when the file ties them
  bool tied_output = false;
  /// rope_freqs.weight {rope_dim / 2}: Llama 3.1's per-pair RoPE frequency
  /// factors (each pair's angle is divided by its factor); llama only.
  std::optional<weight_view> rope_freqs;

  /// Every distinct tensor, each once (a tied output is token_embd).
  std::vector<const weight_view*> all() const;
  /// Total bytes of distinct weight tensors (tied output counted once).
  std::uint64_t total_bytes() const noexcept;
};

/// Binds the architecture's tensor names. Errors: not_found naming a missing
/// tensor, invalid_argument naming a tensor with the wrong shape, unsupported
/// naming a tensor whose type the engine does not run (norms, biases and
/// rope_freqs must be f32, f16 or bf16) or a tensor the architecture does not
/// use (computing without it would silently give other logits than llama.cpp).
expected<llama_weights> bind_llama_weights(const gguf_file& file, const llama_config& config);

}  // namespace exa::model
