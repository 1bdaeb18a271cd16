#include "gpu/ops/common.cuh"
#include "gpu/ops/convert.cuh"

namespace exa::gpu::ops {
namespace {

__global__ void __launch_bounds__(256) convert_kernel(const float* x, int x_stride, int k, act_view act) {
  const float* xr = x + static_cast<long long>(blockIdx.x) * x_stride;
  detail::store_row_slice(k, [&](int i) { return xr[i]; }, nullptr, act, blockIdx.x);
}

}  // namespace

void convert(const float* x, int x_stride, int n, int k, const act_view& act, cudaStream_t stream) {
  if (n == 0) return;
  const dim3 grid(n, (k / 32 + detail::groups_per_block - 1) / detail::groups_per_block);
  convert_kernel<<<grid, 32 * detail::groups_per_block, 0, stream>>>(x, x_stride, k, act);
}

}  // namespace exa::gpu::ops
