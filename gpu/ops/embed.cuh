#pragma once
// Embedding gather: x[t] = row tokens[t] of the table, dequantized to f32
// exactly as the CPU engine's dequantize_row (f32, f16, bf16, q8_0).

#include "gpu/ops/types.cuh"

namespace exa::gpu::ops {

/// x: [n_tok][table.cols] floats.
void embed(const matrix_view& table, const int* tokens, int n_tok, float* x, cudaStream_t stream);

}  // namespace exa::gpu::ops
