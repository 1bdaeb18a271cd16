#pragma once
// RMSNorm of each token's row, out = x / sqrt(mean(x²) + eps) * w, as the CPU
// engine's rms_norm (engine/ops.hpp): squares taken in float, summed in
// double -- here by a fixed tree, there in index order, so the float mean
// agrees but for a rare last-bit difference -- then rounded as written.
// The result goes to `out` (f32) and/or straight into `act`, converted for
// the next weight type.

#include "gpu/ops/types.cuh"

namespace exa::gpu::ops {

/// Normalizes n_out rows of `dim` floats: output row i is input row
/// rows[i] (or i when `rows` is null: the final norm gathers the tokens that
/// need logits). `out` ([n_out][dim]) and `act.data` may each be null.
/// dim % 32 == 0.
void rms_norm(const float* x, const int* rows, int n_out, int dim, const float* w, float eps, float* out,
              const act_view& act, cudaStream_t stream);

}  // namespace exa::gpu::ops
