#pragma once
// Per-token elementwise and normalization operators of the Llama forward pass,
// following ggml's definitions (so results track llama.cpp's). Each works on
// one token's vector at a time: nothing depends on the rest of the batch.

#include <cstddef>
#include <cstdint>

namespace exa::engine {

/// out[i] = x[i] / sqrt(mean(x²) + eps) * w[i]; the mean is accumulated in
/// double in index order, as ggml_rms_norm does.
void rms_norm(const float* x, const float* w, std::size_t n, float eps, float* out) noexcept;

/// rms_norm of `rows` vectors (row r at x + r · x_stride, its result at
/// out + r · out_stride), each bit for bit as rms_norm alone. Up to 8 rows'
/// sums run side by side: one row's double sum in index order is a chain of
/// dependent additions the core otherwise waits on.
void rms_norm_rows(const float* x, std::size_t x_stride, const float* w, std::size_t n, float eps, float* out,
                   std::size_t out_stride, std::size_t rows) noexcept;

/// How one token's heads are rotated (see model::llama_config).
struct rope_params {
  std::size_t rope_dim = 0;       // leading elements of each head that rotate
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;        // linear RoPE scaling: multiplies every angle
  /// rope_dim / 2 divisors of each pair's angle (Llama 3.1's rope_freqs), or
  /// null for none.
  const float* freq_factors = nullptr;
  /// Pairs (x[i], x[i + rope_dim/2]) (ggml's NEOX mode, qwen2) instead of
  /// adjacent pairs (x[2i], x[2i+1]) (NORM mode, llama files: converters
  /// permute Q and K to it).
  bool halves = false;
};

/// Rotates each pair i of the first `rope_dim` elements of each of `n_heads`
/// heads by freq_scale · (pos · base^(-2i/rope_dim) / freq_factors[i]), as
/// ggml_rope_ext computes it without YaRN (the angle by repeated
/// multiplication, in float).
void rope(float* x, std::size_t n_heads, std::size_t head_dim, std::uint32_t pos,
          const rope_params& p) noexcept;
/// rope() in two parts, so that one position's angles serve every layer:
/// the rope_dim / 2 cosines and sines for `pos`, then the rotation by them.
void rope_table(std::uint32_t pos, const rope_params& p, float* cos_t, float* sin_t) noexcept;
void rope_rotate(float* x, std::size_t n_heads, std::size_t head_dim, const float* cos_t, const float* sin_t,
                 const rope_params& p) noexcept;

/// g[i] = silu(g[i]) * u[i], silu(v) = v / (1 + exp(-v)).
void silu_mul(float* g, const float* u, std::size_t n) noexcept;

/// In-place softmax of x[0, n): max-subtracted exps, summed in double, then
/// scaled by 1/sum. The sum's order: 8 lanes (exp i in lane i mod 8) over
/// the whole groups of 8, in index order; the lanes by a fixed tree
/// (l + (l + 4), then + 2, then + 1); then the remaining exps one after
/// another. (One running sum was a chain of dependent double adds, 4 cycles
/// per score: most of softmax's time in a long prefill.)
void softmax(float* x, std::size_t n) noexcept;

}  // namespace exa::engine
