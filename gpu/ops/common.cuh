#pragma once
// Device helpers shared by the kernels (included by .cu files only).
//
// Every .cu file is compiled with --fmad=false: like the host build's
// -ffp-contract=off, no a*b+c is fused behind our back, so a kernel rounds
// exactly as written (fmaf where a fused step is meant) and the elementwise
// ops round as the CPU engine's do.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "gpu/ops/types.cuh"

namespace exa::gpu::ops::detail {

constexpr unsigned full_mask = 0xffffffffu;

/// Max over the warp by a butterfly: exact, so its order does not matter.
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(full_mask, v, o));
  return v;
}

/// The largest |v| over the warp as float bits, sign cleared: for non-negative
/// floats the bits order as the values and a NaN's lie above infinity's, so
/// the maximum is exact and sees a NaN in any lane (model::abs_max_bits).
__device__ __forceinline__ unsigned warp_abs_max_bits(float v) {
  unsigned m = __float_as_uint(v) & 0x7fffffffu;
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(full_mask, m, o));
  return m;
}

/// Sum over the warp by a fixed butterfly (o = 16, 8, 4, 2, 1): every lane
/// gets the same value, and the tree never depends on the data or the launch.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(full_mask, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(full_mask, v, o);
  return v;
}

__device__ __forceinline__ float f16_round(float v) { return __half2float(__float2half_rn(v)); }

/// store_groups: the 32-element groups [g_begin, g_end) of one row;
/// store_row: all of it. Writes value(i) for i in [0, n) of one row, converted to `act` (row `row`),
/// and to `f32_out` when given. n % 32 == 0; each warp of the block takes
/// whole 32-element groups, so a Q8_0 block is one warp's: lane l holds
/// element l, the scale is amax / 127 and q = round(x / scale) as in ggml's
/// quantize_row_q8_0 (model/quantize.cpp), and as there a block holding a NaN
/// or an infinity gets a NaN scale (q8_nonfinite_scale's) and zero quants.
template <class Value>
__device__ __forceinline__ void store_groups(int g_begin, int g_end, Value value, float* f32_out, const act_view& act,
                                             int row) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int g = g_begin + warp; g < g_end; g += warps) {
    const int i = g * 32 + lane;
    const float v = value(i);
    if (f32_out != nullptr) f32_out[i] = v;
    if (act.data == nullptr) continue;
    const long long at = static_cast<long long>(row) * act.k + i;
    switch (act.type) {
      case act_type::f16:
        static_cast<__half*>(act.data)[at] = __float2half_rn(v);
        break;
      case act_type::bf16:
        static_cast<__nv_bfloat16*>(act.data)[at] = __float2bfloat16_rn(v);
        break;
      case act_type::q8_0: {
        const unsigned amax = warp_abs_max_bits(v);
        const bool finite = amax < 0x7f800000u;
        const float d = __uint_as_float(amax) / 127.0f;
        const float id = finite && d != 0.0f ? 1.0f / d : 0.0f;
        static_cast<std::int8_t*>(act.data)[at] = finite ? static_cast<std::int8_t>(roundf(v * id)) : 0;
        if (lane == 0)
          act.scales[static_cast<long long>(row) * (act.k / 32) + g] =
              finite ? __half2float(__float2half_rn(d)) : __uint_as_float(0xffc00000u);
        break;
      }
    }
  }
}

template <class Value>
__device__ __forceinline__ void store_row(int n, Value value, float* f32_out, const act_view& act, int row) {
  store_groups(0, n / 32, value, f32_out, act, row);
}

/// Elementwise rows over many blocks: a block of `warps_per_block` warps
/// takes that many 32-element groups of row blockIdx.x, starting at group
/// blockIdx.y * warps_per_block (one group a warp), so a single token's row
/// is spread over the multiprocessors instead of looping on one. Each
/// element (and each Q8_0 group's scale) is computed exactly as store_row
/// computes it.
constexpr int groups_per_block = 8;  // with 256 threads
template <class Value>
__device__ __forceinline__ void store_row_slice(int n, Value value, float* f32_out, const act_view& act, int row) {
  const int g0 = static_cast<int>(blockIdx.y) * groups_per_block;
  store_groups(g0, min(g0 + groups_per_block, n / 32), value, f32_out, act, row);
}

}  // namespace exa::gpu::ops::detail
