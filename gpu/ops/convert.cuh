#pragma once
// Activations converted for a weight type (types.cuh: act_type), for the
// inputs no other kernel writes converted: the attention output before the
// output projection, and a second weight type among Q/K/V or gate/up.

#include "gpu/ops/types.cuh"

namespace exa::gpu::ops {

/// Converts n rows of `k` floats (row stride x_stride) into rows [0, n) of
/// `act`. k % 32 == 0.
void convert(const float* x, int x_stride, int n, int k, const act_view& act, cudaStream_t stream);

}  // namespace exa::gpu::ops
