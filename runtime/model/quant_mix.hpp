#pragma once
// Which tensor type each weight of a generated file gets: one type for every
// 2-D weight, or llama.cpp's Q4_K_M / Q5_K_M mixes, which spend more bits on
// the tensors quantization hurts most.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "model/tensor_type.hpp"

namespace exa::model {

/// How the 2-D weights of a file are typed.
enum class quant_mix : std::uint8_t {
  uniform,  // every 2-D weight has the base type
  k_m,      // llama.cpp's *_K_M rule around a q4_K or q5_K base
};

/// A file's weight format: "q8_0" is {q8_0, uniform}, "q4_k_m" is {q4_K, k_m}.
struct weight_format {
  tensor_type base = tensor_type::f32;
  quant_mix mix = quant_mix::uniform;
};

/// Parses a tensor type name (see tensor_type_from_string) or "q4_k_m" /
/// "q5_k_m" (case-insensitive); nullopt for anything else.
std::optional<weight_format> weight_format_from_string(std::string_view s) noexcept;

/// "q4_k_m", "q5_k_m", or the base type's name.
std::string to_string(const weight_format& f);

/// llama.cpp's general.file_type (enum llama_ftype) for the format. Uniform
/// K-quant files report the nearest llama.cpp preset (q4_K: Q4_K_S = 14,
/// q5_K: Q5_K_S = 16, q6_K: Q6_K = 18); the field is informational.
std::uint32_t llama_file_type(const weight_format& f) noexcept;

/// The type of 2-D weight `name`, with rows of `cols` elements, in a file of
/// `n_layers` blocks.
///
/// For k_m, llama.cpp's llama_tensor_get_type (src/llama-quant.cpp) for the
/// llama architecture without an importance matrix: output.weight (or
/// token_embd.weight when the embeddings are tied) is q6_K (q8_0 when its
/// rows are not whole 256-element super-blocks); attn_v and ffn_down of the
/// layers use_more_bits() picks (the first and last eighth, and every third
/// layer between) are q6_K; every other 2-D weight has the base type.
/// Uniform formats give the base type to every 2-D weight.
///
/// Then, for every format, llama.cpp's tensor_type_fallback: a K-quant whose
/// rows are not whole super-blocks becomes q5_0 (from q4_K), q5_1 (q5_K) or
/// q8_0 (q6_K), and f16 if the rows are not whole 32-element blocks either.
tensor_type weight_type_for(const weight_format& f, std::string_view name, bool tied_embeddings,
                            std::uint32_t n_layers, std::uint64_t cols) noexcept;

/// llama.cpp's use_more_bits(i_layer, n_layers).
bool use_more_bits(int i_layer, int n_layers) noexcept;

}  // namespace exa::model
