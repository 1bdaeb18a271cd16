#include "gpu/ops/common.cuh"
#include "gpu/ops/rope_kv.cuh"

namespace exa::gpu::ops {
namespace {

// Every loop below is strided by the block, with no reduction: the thread
// count changes no value. 1024 (not 256) takes a 32-head query's 1024 pairs
// in one step; one token's call took 6.4 us on an H200 with 256.
constexpr int threads = 1024;
constexpr int max_pairs = 512;

__device__ __forceinline__ void rotate(float* x, int n_heads, int head_dim, int pairs, bool halves, const float* cos_t,
                                       const float* sin_t) {
  const int partner = halves ? pairs : 1;
  const int step = halves ? 1 : 2;
  for (int idx = threadIdx.x; idx < n_heads * pairs; idx += blockDim.x) {
    const int h = idx / pairs, i = idx % pairs;
    float* a = x + h * head_dim + i * step;
    const float x0 = a[0], x1 = a[partner];
    // --fmad=false: each product rounds before the sum, as on the CPU.
    a[0] = x0 * cos_t[i] - x1 * sin_t[i];
    a[partner] = x0 * sin_t[i] + x1 * cos_t[i];
  }
}

__global__ void __launch_bounds__(threads) rope_kv_kernel(float* q, float* k, const float* v, int q_stride,
                                                          int kv_stride, int n_heads, int n_kv_heads, int head_dim,
                                                          rope_view rope, step_meta meta, kv_view kv) {
  __shared__ float cos_t[max_pairs], sin_t[max_pairs];
  const int t = blockIdx.x;
  const int pos = meta.pos[t];
  const int pairs = rope.rope_dim / 2;
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    // The CPU multiplies theta by theta_scale once per pair, in order: pair
    // i's theta is i such multiplications of pos, each rounded to float.
    float theta = static_cast<float>(pos);
    for (int j = 0; j < i; ++j) theta *= rope.theta_scale;
    const float factor = rope.factors != nullptr ? rope.factors[i] : 1.0f;
    const float angle = rope.freq_scale * (theta / factor);
    double s, c;
    sincos(static_cast<double>(angle), &s, &c);
    cos_t[i] = static_cast<float>(c);
    sin_t[i] = static_cast<float>(s);
  }
  __syncthreads();
  rotate(q + static_cast<long long>(t) * q_stride, n_heads, head_dim, pairs, rope.halves, cos_t, sin_t);
  float* kt = k + static_cast<long long>(t) * kv_stride;
  rotate(kt, n_kv_heads, head_dim, pairs, rope.halves, cos_t, sin_t);
  __syncthreads();

  const int page = meta.tables[meta.table_off[t] + pos / kv.block_tokens];
  auto* base = reinterpret_cast<__half*>(static_cast<char*>(kv.base) + page * kv.page_bytes);
  const long long slot = pos % kv.block_tokens;
  __half* kd = base + ((static_cast<long long>(kv.layer) * 2 + 0) * kv.block_tokens + slot) * kv.kv_dim;
  __half* vd = base + ((static_cast<long long>(kv.layer) * 2 + 1) * kv.block_tokens + slot) * kv.kv_dim;
  const float* vt = v + static_cast<long long>(t) * kv_stride;
  for (int i = threadIdx.x; i < kv.kv_dim; i += blockDim.x) {
    kd[i] = __float2half_rn(kt[i]);
    vd[i] = __float2half_rn(vt[i]);
  }
}

}  // namespace

void rope_kv(float* q, float* k, const float* v, int q_stride, int kv_stride, int n_tok, int n_heads,
             int n_kv_heads, int head_dim, const rope_view& rope, const step_meta& meta, const kv_view& kv,
             cudaStream_t stream) {
  if (n_tok == 0) return;
  rope_kv_kernel<<<n_tok, threads, 0, stream>>>(q, k, v, q_stride, kv_stride, n_heads, n_kv_heads, head_dim, rope,
                                                meta, kv);
}

}  // namespace exa::gpu::ops
