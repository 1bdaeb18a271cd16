#pragma once
// The MLP's gate: h = silu(gate) * up, silu(v) = v / (1 + exp(-v)), as the CPU
// engine's silu_mul, written straight into the activations of the down
// projection's weight type.

#include "gpu/ops/types.cuh"

namespace exa::gpu::ops {

/// gate and up: [n_tok][ff] floats; rows [0, n_tok) of `act` get h.
/// ff % 32 == 0.
void swiglu(const float* gate, const float* up, int n_tok, int ff, const act_view& act, cudaStream_t stream);

}  // namespace exa::gpu::ops
