#include "gpu/ops/attention.cuh"
#include "gpu/ops/common.cuh"

namespace exa::gpu::ops {
namespace {

constexpr int threads = 128;  // also the positions per tile
constexpr int max_head_dim = 256;

// Block-wide reductions through shared memory: warps' results combined in
// warp order, so the tree is fixed.
__device__ float block_max(float v, float* scratch) {
  v = detail::warp_max(v);
  __syncthreads();  // scratch may still be read from the previous call
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = scratch[0];
  for (int w = 1; w < threads / 32; ++w) m = fmaxf(m, scratch[w]);
  return m;
}

__device__ float block_sum(float v, float* scratch) {
  v = detail::warp_sum(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = scratch[0];
  for (int w = 1; w < threads / 32; ++w) s += scratch[w];
  return s;
}

__global__ void __launch_bounds__(threads) attention_kernel(const float* q, int q_stride, float* out, int n_heads,
                                                            int n_kv_heads, int head_dim, step_meta meta, kv_view kv) {
  __shared__ float qs[max_head_dim];
  __shared__ float p[threads];
  __shared__ float scratch[threads / 32];
  __shared__ float partial[threads];  // group sums of the output (head_dim < threads)

  const int head = blockIdx.x, t = blockIdx.y;
  const int q_dim = n_heads * head_dim;
  const int kv_head = head / (n_heads / n_kv_heads);
  const int pos = meta.pos[t];
  const int n = pos + 1;
  const int* table = meta.tables + meta.table_off[t];
  const float scale = 1.0f / sqrtf(static_cast<float>(head_dim));
  for (int i = threadIdx.x; i < head_dim; i += threads)
    qs[i] = detail::f16_round(q[static_cast<long long>(t) * q_stride + head * head_dim + i]);

  // The weighted sum of V: thread (group g, element e) accumulates positions
  // j ≡ g (mod groups) of each tile for elements e, e + threads, ...
  const int tid = static_cast<int>(threadIdx.x);
  const int groups = head_dim < threads ? threads / head_dim : 1;
  const int g = tid / head_dim < groups ? tid / head_dim : -1;  // -1: idle in the V sum
  const int e0 = head_dim < threads ? tid % head_dim : tid;
  float acc[max_head_dim / threads] = {};
  float m = -INFINITY, l = 0.0f;
  const long long k_off = (static_cast<long long>(kv.layer) * 2 + 0) * kv.block_tokens * kv.kv_dim + kv_head * head_dim;
  const long long v_off = (static_cast<long long>(kv.layer) * 2 + 1) * kv.block_tokens * kv.kv_dim + kv_head * head_dim;
  __syncthreads();

  for (int j0 = 0; j0 < n; j0 += threads) {
    // Scores: thread i takes position j0 + i, a dot product in element order.
    const int j = j0 + threadIdx.x;
    float s = -INFINITY;
    if (j < n) {
      const char* page = static_cast<const char*>(kv.base) + table[j / kv.block_tokens] * kv.page_bytes;
      const __half* kj = reinterpret_cast<const __half*>(page) + k_off + static_cast<long long>(j % kv.block_tokens) * kv.kv_dim;
      float dot = 0.0f;
      for (int i = 0; i < head_dim; i += 2) {
        const float2 k2 = __half22float2(*reinterpret_cast<const __half2*>(kj + i));
        dot = fmaf(qs[i], k2.x, dot);
        dot = fmaf(qs[i + 1], k2.y, dot);
      }
      s = dot * scale;
    }
    const float m_new = fmaxf(m, block_max(s, scratch));  // finite: position j0 < n is in the tile
    const float pj = j < n ? expf(s - m_new) : 0.0f;
    p[threadIdx.x] = pj;
    const float corr = expf(m - m_new);  // 0 on the first tile (m = -inf)
    l = l * corr + block_sum(pj, scratch);  // block_sum's barriers also publish p[]
    m = m_new;
    if (g >= 0) {
      const int tile_n = min(threads, n - j0);
      for (int r = 0; r * threads + e0 < head_dim; ++r) {
        float a = acc[r] * corr;
        const int e = r * threads + e0;
        const auto v_at = [&](int jj) {
          const int jp = j0 + jj;
          const char* page = static_cast<const char*>(kv.base) + table[jp / kv.block_tokens] * kv.page_bytes;
          return __half2float(reinterpret_cast<const __half*>(page)[v_off + static_cast<long long>(jp % kv.block_tokens) * kv.kv_dim + e]);
        };
        // Eight positions' V loaded before they are added: the loads are in
        // flight together instead of one after another (one token's decode
        // waited on each in turn: 11.3 us a call on an H200 at contexts of
        // 16-50). The additions keep their order, so the sum is the same.
        int jj = g;
        for (; jj + 7 * groups < tile_n; jj += 8 * groups) {
          float vv[8];
#pragma unroll
          for (int u = 0; u < 8; ++u) vv[u] = v_at(jj + u * groups);
#pragma unroll
          for (int u = 0; u < 8; ++u) a = fmaf(p[jj + u * groups], vv[u], a);
        }
        for (; jj < tile_n; jj += groups) a = fmaf(p[jj], v_at(jj), a);
        acc[r] = a;
      }
    }
    __syncthreads();  // p[] is rewritten by the next tile
  }

  // Groups combined in group order, then divided by the softmax sum.
  float* o = out + static_cast<long long>(t) * q_dim + head * head_dim;
  if (groups == 1) {
    if (g < 0) return;
    for (int r = 0; r * threads + e0 < head_dim; ++r) o[r * threads + e0] = acc[r] / l;
    return;
  }
  if (g >= 0) partial[threadIdx.x] = acc[0];
  __syncthreads();
  if (threadIdx.x < head_dim) {
    float sum = partial[threadIdx.x];
    for (int gg = 1; gg < groups; ++gg) sum += partial[gg * head_dim + threadIdx.x];
    o[threadIdx.x] = sum / l;
  }
}

}  // namespace

void attention(const float* q, int q_stride, float* out, int n_tok, int n_heads, int n_kv_heads, int head_dim,
               const step_meta& meta, const kv_view& kv, cudaStream_t stream) {
  if (n_tok == 0) return;
  attention_kernel<<<dim3(n_heads, n_tok), threads, 0, stream>>>(q, q_stride, out, n_heads, n_kv_heads, head_dim,
                                                                 meta, kv);
}

}  // namespace exa::gpu::ops
