#pragma once
// RoPE on each token's Q and K heads, then K and V stored as fp16 into the
// token's KV page slot -- what the CPU engine does between the Q/K/V
// projections and attention (engine/llama_forward.cpp), with the same angles:
// theta_i = pos · theta_scale^i by repeated float multiplication,
// angle = freq_scale · (theta_i / factor_i), sine and cosine in double.

#include "gpu/ops/types.cuh"

namespace exa::gpu::ops {

struct rope_view {
  int rope_dim = 0;            // leading elements of each head that rotate
  float theta_scale = 1.0f;    // base^(-2 / rope_dim), computed on the host as the CPU engine does
  float freq_scale = 1.0f;     // linear scaling
  const float* factors = nullptr;  // rope_dim / 2 divisors on the device, or null
  bool halves = false;         // pairs (i, i + rope_dim/2) instead of (2i, 2i+1)
};

/// Token t's q (n_heads * head_dim floats) at q + t * q_stride, its k and v
/// (kv.kv_dim floats each) at k + t * kv_stride and v + t * kv_stride, biases
/// already added (the strides let Q, K and V be column ranges of one fused
/// projection's output). Rotates q and k in place and writes k and v into
/// the pages of kv.layer. head_dim <= 1024 (rope_dim / 2 <= 512).
void rope_kv(float* q, float* k, const float* v, int q_stride, int kv_stride, int n_tok, int n_heads,
             int n_kv_heads, int head_dim, const rope_view& rope, const step_meta& meta, const kv_view& kv,
             cudaStream_t stream);

}  // namespace exa::gpu::ops
