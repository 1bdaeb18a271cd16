#include "gpu/ops/common.cuh"
#include "gpu/ops/embed.cuh"

namespace exa::gpu::ops {
namespace {

__global__ void embed_kernel(matrix_view table, const int* tokens, float* x) {
  const long long row = tokens[blockIdx.x];
  const int n = table.cols;
  float* out = x + static_cast<long long>(blockIdx.x) * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const long long at = row * n + i;
    float v;
    switch (table.type) {
      case weight_type::f32: v = static_cast<const float*>(table.data)[at]; break;
      case weight_type::f16: v = __half2float(static_cast<const __half*>(table.data)[at]); break;
      case weight_type::bf16: v = __bfloat162float(static_cast<const __nv_bfloat16*>(table.data)[at]); break;
      default:  // q8_0, repacked: value = q * d, as dequantize_row_q8_0
        v = static_cast<float>(static_cast<const std::int8_t*>(table.data)[at]) * table.scales[row * (n / 32) + i / 32];
        break;
    }
    out[i] = v;
  }
}

}  // namespace

void embed(const matrix_view& table, const int* tokens, int n_tok, float* x, cudaStream_t stream) {
  if (n_tok == 0) return;
  embed_kernel<<<n_tok, 256, 0, stream>>>(table, tokens, x);
}

}  // namespace exa::gpu::ops
