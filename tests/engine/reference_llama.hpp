#pragma once
// A slow, obviously-correct Llama-family forward pass (llama and qwen2) for
// checking the engine: every weight dequantized to double up front, every
// token recomputed from scratch (no KV cache, no batching, no SIMD), math
// straight from the definitions, RoPE angles computed directly in double.

#include <cstdint>
#include <vector>

#include "model/llama_model.hpp"

namespace exa::test {

class reference_llama {
 public:
  explicit reference_llama(const model::llama_model& m);

  /// Logits (vocab doubles) after each position of `tokens`.
  std::vector<std::vector<double>> logits_all(const std::vector<std::int32_t>& tokens) const;

 private:
  using matrix = std::vector<std::vector<double>>;  // [rows][cols]
  struct layer {
    std::vector<double> attn_norm, ffn_norm;
    matrix wq, wk, wv, wo, w_gate, w_up, w_down;
    std::vector<double> bq, bk, bv, bo;  // empty when absent
  };

  static matrix dequantize(const model::weight_view& w);
  static std::vector<double> dequantize(const std::optional<model::weight_view>& w);
  static void add(std::vector<double>& x, const std::vector<double>& b);
  static std::vector<double> matvec(const matrix& w, const std::vector<double>& x);
  std::vector<double> rms_norm(const std::vector<double>& x, const std::vector<double>& w) const;
  void rope(std::vector<double>& v, std::uint32_t n_heads, std::uint32_t pos) const;

  model::llama_config c_;
  matrix embd_, output_;
  std::vector<double> output_norm_;
  std::vector<double> rope_factors_;  // empty when the file has none
  std::vector<layer> layers_;
};

/// Normalized mean squared error Σ(a-b)² / Σb² between engine and reference.
double nmse(const float* a, const std::vector<double>& b);

}  // namespace exa::test
