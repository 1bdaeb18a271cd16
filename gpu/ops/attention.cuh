#pragma once
// Causal GQA attention over the paged KV cache, for decode and chunked
// prefill alike: token t (at position pos) attends to positions [0, pos] of
// its own sequence, whose K/V (this step's included: rope_kv wrote them
// first) sit in the pages its block table names. Q is rounded to fp16 as the
// CPU engine rounds it; scores, softmax and the weighted sum of V in float.
//
// One thread block per (head, token), so a token's result never depends on
// the rest of the batch. Positions are taken in tiles of 128 with a running
// max and sum (online softmax): the tiling depends on the position alone,
// and each reduction is a fixed tree, so the result is the same whichever
// batch the token is in.

#include "gpu/ops/types.cuh"

namespace exa::gpu::ops {

/// Token t's q (n_heads * head_dim floats, after RoPE) at q + t * q_stride;
/// out: [n_tok][n_heads * head_dim]. head_dim <= 256, even;
/// n_heads % n_kv_heads == 0.
void attention(const float* q, int q_stride, float* out, int n_tok, int n_heads, int n_kv_heads, int head_dim,
               const step_meta& meta, const kv_view& kv, cudaStream_t stream);

}  // namespace exa::gpu::ops
