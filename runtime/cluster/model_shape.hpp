#pragma once
// What placement and the simulator need to know about a model: its Llama
// shape, its parameter count, the bytes its weights take at a precision, and
// the bytes of KV cache one token costs (GQA-aware).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "model/tensor_type.hpp"

namespace exa::model {
struct llama_config;
struct llama_weights;
class llama_model;
}  // namespace exa::model

namespace exa::cluster {

/// Storage precision of a model's weight matrices. int8 and int4 are ggml's
/// Q8_0 (34 bytes per 32 weights) and Q4_0 (18 bytes per 32 weights).
enum class precision : std::uint8_t { fp32, fp16, bf16, int8, int4 };

/// "fp32", "fp16", "bf16", "int8", "int4".
std::string_view to_string(precision p) noexcept;

/// Parses the names above and the ggml names ("f32", "f16", "q8_0", "q4_0"),
/// case-insensitive; nullopt for anything else.
std::optional<precision> precision_from_string(std::string_view s) noexcept;

/// The GGUF tensor type that stores weights at `p`.
model::tensor_type to_tensor_type(precision p) noexcept;

/// The precision of a GGUF tensor type.
precision from_tensor_type(model::tensor_type t) noexcept;

/// Bytes of `n` weights stored at `p`; quantized precisions round up to whole
/// 32-weight blocks.
std::uint64_t weight_bytes_for(precision p, std::uint64_t n) noexcept;

/// The shape of a Llama-architecture model, as far as memory is concerned.
struct model_shape {
  std::string name;
  std::uint32_t n_layers = 0;
  std::uint32_t dim = 0;
  std::uint32_t n_heads = 0;
  std::uint32_t n_kv_heads = 0;
  std::uint32_t ff_dim = 0;
  std::uint32_t vocab_size = 0;
  std::uint32_t context_length = 0;
  /// The output head reuses the token embedding (no separate output matrix).
  bool tied_embeddings = false;
  /// Precision of the weight matrices; norms are always f32 (as in GGUF files).
  precision weight_precision = precision::fp16;
  /// Bytes of all weights as stored. For a loaded file this is the file's own
  /// tensor bytes (files mix types); otherwise computed_weight_bytes().
  std::uint64_t weight_bytes = 0;
  /// Bytes of one K or V element in the KV cache (fp16 by default).
  std::uint32_t kv_elem_bytes = 2;

  std::uint32_t head_dim() const noexcept { return dim / n_heads; }
  std::uint32_t kv_dim() const noexcept { return n_kv_heads * head_dim(); }

  /// Exact parameter count: token embedding, per layer Q/K/V/O (K and V at
  /// kv_dim rows: GQA), gate/up/down, two norms; final norm; output head
  /// unless tied.
  std::uint64_t parameter_count() const noexcept;

  /// Parameters in 1-D norm vectors (stored f32 whatever the precision).
  std::uint64_t norm_parameter_count() const noexcept;

  /// Weight bytes if every matrix is stored at `weight_precision` and every
  /// norm at f32: what a GGUF file of this shape and type holds.
  std::uint64_t computed_weight_bytes() const noexcept;

  /// 2 (K and V) × layers × kv_heads × head_dim × kv_elem_bytes.
  std::uint64_t kv_bytes_per_token() const noexcept;
};

/// Checks the shape: every size nonzero and bounded, dim divisible by n_heads,
/// n_heads by n_kv_heads, kv_elem_bytes in {1, 2, 4}. Errors name the field.
expected<void> validate(const model_shape& shape);

/// The same shape with matrices at `p`; weight_bytes recomputed.
model_shape with_precision(model_shape shape, precision p);

/// Named presets with published shapes: llama-2-7b, llama-2-13b, llama-2-70b,
/// llama-3-8b, llama-3-70b, and our generated models tiny and small.
/// Errors: not_found listing the valid names.
expected<model_shape> model_shape_preset(std::string_view name, precision p = precision::fp16);

/// Names accepted by model_shape_preset, in a stable order.
const std::vector<std::string>& model_shape_preset_names();

/// The shape of a loaded model; weight_bytes are the file's real tensor bytes
/// and weight_precision is the type holding most of the matrix parameters.
model_shape model_shape_from(const model::llama_config& config, const model::llama_weights& weights);
model_shape model_shape_from(const model::llama_model& model);

}  // namespace exa::cluster
