#pragma once
// The MLP's gate: h = silu(gate) * up, silu(v) = v / (1 + exp(-v)), as the CPU
// engine's silu_mul, written straight into the activations of the down
// projection's weight type.

#include "gpu/ops/types.cuh"

namespace exa::gpu::ops {

/// Token t's gate and up (ff floats each) at gate + t * stride and
/// up + t * stride (the columns of a fused gate/up projection, or two
/// buffers); rows [0, n_tok) of `act` get h. ff % 32 == 0.
void swiglu(const float* gate, const float* up, int stride, int n_tok, int ff, const act_view& act,
            cudaStream_t stream);

}  // namespace exa::gpu::ops
