#include "gpu/ops/common.cuh"
#include "gpu/ops/matmul.cuh"

namespace exa::gpu::ops {
namespace {

constexpr int warps = 8;  // the K split: fixed for every launch (matmul.cuh)
constexpr int threads = warps * 32;
constexpr int tile_rows = 16;

struct mm_args {
  const void* w;
  const float* w_scales;
  int rows;
  int k;
  const void* x;
  const float* x_scales;
  int n_tok;
  float* y;
  int y_stride;
  const float* bias;
  bool accumulate;
};

// m16n8k16, f32 accumulators. Fragment layouts (PTX ISA, "mma.m16n8k16"):
// with g = lane / 4 and t = lane % 4, A's registers hold (row g, k 2t..2t+1),
// (row g+8, k 2t..), (row g, k 2t+8..), (row g+8, k 2t+8..); B's hold
// (k 2t.., column g), (k 2t+8.., column g); D's hold (row g, columns 2t and
// 2t+1), then (row g+8, the same columns).
template <weight_type W>
__device__ __forceinline__ void mma_k16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint32_t b0, uint32_t b1) {
  if constexpr (W == weight_type::f16) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// m16n8k32 on int8, int32 accumulators: A's registers hold (row g, k
// 4t..4t+3), (row g+8, k 4t..), (row g, k 4t+16..), (row g+8, k 4t+16..); B's
// (k 4t.., column g), (k 4t+16.., column g); D as above.
__device__ __forceinline__ void mma_s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Loading fragments. Any one permutation of k within a chunk gives the same
// dot product as long as W and x use it alike, so each lane loads the
// contiguous values [8t, 8t + 8) of its rows and its token in one access
// (16 bytes of f16, 8 of int8) and hands them to the instruction as the k
// slots the layouts above give lane t: for f16 two k16 steps take values
// {0,1 | 2,3} and {4,5 | 6,7}; for int8 one k32 step takes {0..3 | 4..7}.
__device__ __forceinline__ uint4 load16(const void* p) { return __ldg(static_cast<const uint4*>(p)); }
__device__ __forceinline__ uint2 load8(const void* p) { return __ldg(static_cast<const uint2*>(p)); }

template <weight_type W, int NG, int U>
__global__ void __launch_bounds__(threads) mm_kernel(const mm_args a) {
  __shared__ float red[warps][tile_rows][NG * 8];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.y * tile_rows, tok0 = blockIdx.x * NG * 8;
  const int nch = a.k / 32;
  // Rows and tokens past the end are clamped to the last one: their results
  // are computed from valid memory and never stored.
  const long long r_lo = min(row0 + g, a.rows - 1), r_hi = min(row0 + g + 8, a.rows - 1);
  long long tok_b[NG];  // this lane's token for B (column g of each group)
#pragma unroll
  for (int ng = 0; ng < NG; ++ng) tok_b[ng] = min(tok0 + ng * 8 + g, a.n_tok - 1);
  float acc[NG][4];
#pragma unroll
  for (int ng = 0; ng < NG; ++ng) acc[ng][0] = acc[ng][1] = acc[ng][2] = acc[ng][3] = 0.0f;

  if constexpr (W == weight_type::f16 || W == weight_type::bf16) {
    const auto* w = static_cast<const std::uint16_t*>(a.w);
    const auto* x = static_cast<const std::uint16_t*>(a.x);
    for (int c0 = warp; c0 < nch; c0 += warps * U) {
      uint4 lo[U], hi[U];  // all of this step's weight loads first: bytes in flight
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + u * warps;
        if (c < nch) {
          lo[u] = load16(w + r_lo * a.k + c * 32 + 8 * t);
          hi[u] = load16(w + r_hi * a.k + c * 32 + 8 * t);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + u * warps;
        if (c >= nch) break;  // uniform across the warp
#pragma unroll
        for (int ng = 0; ng < NG; ++ng) {
          const uint4 b = load16(x + tok_b[ng] * a.k + c * 32 + 8 * t);
          mma_k16<W>(acc[ng], lo[u].x, hi[u].x, lo[u].y, hi[u].y, b.x, b.y);
          mma_k16<W>(acc[ng], lo[u].z, hi[u].z, lo[u].w, hi[u].w, b.z, b.w);
        }
      }
    }
  } else {
    const auto* w = static_cast<const std::int8_t*>(a.w);
    const auto* x = static_cast<const std::int8_t*>(a.x);
    // The x scales of this lane's two output columns (tokens 2t, 2t+1 of a group).
    long long tok_d[NG][2];
#pragma unroll
    for (int ng = 0; ng < NG; ++ng) {
      tok_d[ng][0] = min(tok0 + ng * 8 + 2 * t, a.n_tok - 1);
      tok_d[ng][1] = min(tok0 + ng * 8 + 2 * t + 1, a.n_tok - 1);
    }
    for (int c0 = warp; c0 < nch; c0 += warps * U) {
      uint2 lo[U], hi[U];
      float d_lo[U], d_hi[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + u * warps;
        if (c < nch) {
          lo[u] = load8(w + r_lo * a.k + c * 32 + 8 * t);
          hi[u] = load8(w + r_hi * a.k + c * 32 + 8 * t);
          d_lo[u] = __ldg(a.w_scales + r_lo * nch + c);
          d_hi[u] = __ldg(a.w_scales + r_hi * nch + c);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + u * warps;
        if (c >= nch) break;
#pragma unroll
        for (int ng = 0; ng < NG; ++ng) {
          const uint2 b = load8(x + tok_b[ng] * a.k + c * 32 + 8 * t);
          int s[4] = {0, 0, 0, 0};
          mma_s8(s, lo[u].x, hi[u].x, lo[u].y, hi[u].y, b.x, b.y);
          const float dx0 = __ldg(a.x_scales + tok_d[ng][0] * nch + c);
          const float dx1 = __ldg(a.x_scales + tok_d[ng][1] * nch + c);
          acc[ng][0] += (static_cast<float>(s[0]) * d_lo[u]) * dx0;
          acc[ng][1] += (static_cast<float>(s[1]) * d_lo[u]) * dx1;
          acc[ng][2] += (static_cast<float>(s[2]) * d_hi[u]) * dx0;
          acc[ng][3] += (static_cast<float>(s[3]) * d_hi[u]) * dx1;
        }
      }
    }
  }

#pragma unroll
  for (int ng = 0; ng < NG; ++ng) {
    red[warp][g][ng * 8 + 2 * t] = acc[ng][0];
    red[warp][g][ng * 8 + 2 * t + 1] = acc[ng][1];
    red[warp][g + 8][ng * 8 + 2 * t] = acc[ng][2];
    red[warp][g + 8][ng * 8 + 2 * t + 1] = acc[ng][3];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < tile_rows * NG * 8; idx += threads) {
    const int r = idx % tile_rows, c = idx / tile_rows;
    const int row = row0 + r, tok = tok0 + c;
    if (row >= a.rows || tok >= a.n_tok) continue;
    float v = ((red[0][r][c] + red[1][r][c]) + (red[2][r][c] + red[3][r][c])) +
              ((red[4][r][c] + red[5][r][c]) + (red[6][r][c] + red[7][r][c]));
    if (a.bias != nullptr) v = v + a.bias[row];
    float* dst = a.y + static_cast<long long>(tok) * a.y_stride + row;
    if (a.accumulate) v = *dst + v;
    *dst = v;
  }
}

template <weight_type W, int NG>
void launch(const mm_args& a, cudaStream_t stream) {
  // Chunks loaded ahead per warp: enough bytes in flight for one token,
  // fewer registers for wide token tiles (the order of the sum is the same).
  constexpr int U = NG <= 2 ? (W == weight_type::q8_0 ? 8 : 4) : 2;
  const dim3 grid((a.n_tok + NG * 8 - 1) / (NG * 8), (a.rows + tile_rows - 1) / tile_rows);
  mm_kernel<W, NG, U><<<grid, threads, 0, stream>>>(a);
}

template <weight_type W>
void launch_tiles(const mm_args& a, cudaStream_t stream) {
  switch (matmul_token_tile(a.n_tok)) {
    case 8: return launch<W, 1>(a, stream);
    case 16: return launch<W, 2>(a, stream);
    case 32: return launch<W, 4>(a, stream);
    default: return launch<W, 8>(a, stream);
  }
}

}  // namespace

int matmul_token_tile(int n_tok) {
  if (n_tok <= 8) return 8;
  if (n_tok <= 16) return 16;
  if (n_tok <= 32) return 32;
  return 64;
}

bool matmul(const matrix_view& w, const act_view& x, int n_tok, float* y, int y_stride,
            const matmul_epilogue& epilogue, cudaStream_t stream) {
  const bool types_match = (w.type == weight_type::f16 && x.type == act_type::f16) ||
                           (w.type == weight_type::bf16 && x.type == act_type::bf16) ||
                           (w.type == weight_type::q8_0 && x.type == act_type::q8_0);
  if (!types_match || w.cols != x.k || w.cols % 32 != 0 || w.rows <= 0 || n_tok < 0) return false;
  if (n_tok == 0) return true;
  const mm_args a{w.data, w.scales, w.rows, w.cols, x.data, x.scales, n_tok, y, y_stride, epilogue.bias,
                  epilogue.accumulate};
  switch (w.type) {
    case weight_type::f16: launch_tiles<weight_type::f16>(a, stream); break;
    case weight_type::bf16: launch_tiles<weight_type::bf16>(a, stream); break;
    default: launch_tiles<weight_type::q8_0>(a, stream); break;
  }
  return true;
}

}  // namespace exa::gpu::ops
