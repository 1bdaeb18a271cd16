#pragma once
// y = x · Wᵀ on tensor cores (mma.sync, sm_80+) for f16, bf16 and q8_0
// weights: W has `rows` rows of `cols` values (types.cuh: matrix_view), x has
// n_tok rows converted for W's type (act_view), y gets n_tok rows of `rows`
// floats.
//
// Batch invariance. Each output element y[t][r] is reduced the same way
// whatever n_tok is, so a sequence's logits are bitwise the same alone or in
// any batch (and resume and prefix caching stay exact on the GPU):
//  - K is split among the 8 warps of a block always the same way: warp w takes
//    the 32-wide chunks c ≡ w (mod 8), in increasing order, each accumulated
//    into its own fragment by one tensor-core instruction per 16 (f16/bf16)
//    or 32 (q8_0) values; the 8 partial sums are then added in one fixed
//    tree, ((w0 + w1) + (w2 + w3)) + ((w4 + w5) + (w6 + w7)). Nothing of this
//    depends on the batch: there is no split-K chosen by batch size.
//  - A tensor-core result element depends on its own row of W and its own
//    token's column of x only; the batch decides how many token columns a
//    block holds (8, 16, 32 or 64) and how many blocks there are, never the
//    order of any element's sum. Padding columns are computed and dropped.
//  - q8_0: each 32-value block's dot product is an exact integer (int8 mma),
//    scaled as acc += (float(isum) · d_w) · d_x in chunk order.
// The order differs from the CPU engine's, so GPU and CPU agree to rounding
// (checked by normalized MSE), not bitwise.

#include "gpu/ops/types.cuh"

namespace exa::gpu::ops {

struct matmul_epilogue {
  const float* bias = nullptr;  // y = result + bias[r] when given
  bool accumulate = false;      // y = y + (result [+ bias]): the residual add
};

/// Requires w.type f16/bf16/q8_0 with the matching x.type, w.cols == x.k and
/// k % 32 == 0; returns false (and launches nothing) otherwise.
bool matmul(const matrix_view& w, const act_view& x, int n_tok, float* y, int y_stride,
            const matmul_epilogue& epilogue, cudaStream_t stream);

/// Token columns one block holds for a batch of n_tok (8, 16, 32 or 64): the
/// only thing the batch size chooses.
int matmul_token_tile(int n_tok);

}  // namespace exa::gpu::ops
