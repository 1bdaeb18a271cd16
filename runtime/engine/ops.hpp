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

/// Rotates adjacent pairs (x[2i], x[2i+1]) of the first `rope_dim` elements of
/// each of `n_heads` heads by pos · base^(-2i/rope_dim) (ggml's NORM mode,
/// which llama-architecture GGUF files expect: converters permute Q and K).
void rope(float* x, std::size_t n_heads, std::size_t head_dim, std::size_t rope_dim,
          std::uint32_t pos, float freq_base) noexcept;

/// g[i] = silu(g[i]) * u[i], silu(v) = v / (1 + exp(-v)).
void silu_mul(float* g, const float* u, std::size_t n) noexcept;

/// In-place softmax of x[0, n): max-subtracted exps, summed in double in
/// index order, then scaled by 1/sum.
void softmax(float* x, std::size_t n) noexcept;

}  // namespace exa::engine
