#include "gpu/ops/common.cuh"
#include "gpu/ops/rms_norm.cuh"

namespace exa::gpu::ops {
namespace {

// A row is one block's (its sum of squares is one fixed tree), so a token's
// norm runs on one multiprocessor: 1024 threads take a 2048-wide row in 2
// strided steps instead of 8 (8.9 us a call on an H200 with 256).
constexpr int threads = 1024;

// Σ x² over a row in double: each thread sums its strided elements in
// order, then a fixed tree (warp butterfly, then warps in order). The same
// for every row and every launch.
__device__ double sum_squares(const float* x, int n) {
  __shared__ double partial[threads / 32];
  double s = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += static_cast<double>(x[i] * x[i]);
  s = detail::warp_sum(s);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = s;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < threads / 32; ++w) total += partial[w];
  return total;
}

__global__ void __launch_bounds__(threads) rms_norm_kernel(const float* x, const int* rows, int dim, const float* w,
                                                           float eps, float* out, act_view act) {
  const int row = rows != nullptr ? rows[blockIdx.x] : static_cast<int>(blockIdx.x);
  const float* xr = x + static_cast<long long>(row) * dim;
  const float mean = static_cast<float>(sum_squares(xr, dim) / static_cast<double>(dim));
  const float scale = 1.0f / sqrtf(mean + eps);
  float* o = out != nullptr ? out + static_cast<long long>(blockIdx.x) * dim : nullptr;
  detail::store_row(dim, [&](int i) { return (xr[i] * scale) * w[i]; }, o, act, blockIdx.x);
}

}  // namespace

void rms_norm(const float* x, const int* rows, int n_out, int dim, const float* w, float eps, float* out,
              const act_view& act, cudaStream_t stream) {
  if (n_out == 0) return;
  rms_norm_kernel<<<n_out, threads, 0, stream>>>(x, rows, dim, w, eps, out, act);
}

}  // namespace exa::gpu::ops
