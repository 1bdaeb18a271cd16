#pragma once
// What the CUDA kernels (gpu/ops/*.cu) and the host code that launches them
// share: plain views of device buffers. Kept to C++17 and the CUDA runtime
// headers, so nvcc (C++17) and g++ (C++23, the rest of ExaServe) both read it;
// nothing here includes a project header.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace exa::gpu::ops {

/// How a weight matrix is stored on the device.
///  - f16, bf16: row-major, `cols` 16-bit values per row, as in the GGUF file.
///  - q8_0: repacked from GGUF's 34-byte blocks into `data` = int8 quants,
///    row-major [rows][cols], and `scales` = float [rows][cols / 32] (each
///    block's fp16 scale, converted exactly), so a warp's loads are aligned.
///  - f32: embedding tables only (no matmul kernel takes it).
enum class weight_type : int { f32 = 0, f16 = 1, bf16 = 2, q8_0 = 3 };

struct matrix_view {
  weight_type type = weight_type::f16;
  const void* data = nullptr;
  const float* scales = nullptr;  // q8_0 only
  int rows = 0;
  int cols = 0;
};

/// Activations converted for a weight type, as the CPU engine converts them
/// (engine/matmul.hpp): rounded to f16 for f16 weights, to bf16 for bf16
/// weights, quantized to Q8_0 (ggml's reference rounding) for q8_0 weights.
enum class act_type : int { f16 = 0, bf16 = 1, q8_0 = 2 };

/// n rows of `k` converted values: `data` is [n][k] 16-bit values (f16,
/// bf16) or int8 quants (q8_0); `scales` is float [n][k / 32] (q8_0 only:
/// each block's fp16 scale, as a float).
struct act_view {
  act_type type = act_type::f16;
  void* data = nullptr;
  float* scales = nullptr;
  int k = 0;
};

/// One step's tokens on the device (int32 arrays, n_tok long unless said):
/// token ids, positions, and where each token's block table starts in
/// `tables` (the block ids of every sequence of the step, concatenated);
/// `out_rows` (n_out long) lists the tokens whose logits are computed.
struct step_meta {
  const int* tokens = nullptr;
  const int* pos = nullptr;
  const int* table_off = nullptr;
  const int* tables = nullptr;
  const int* out_rows = nullptr;
};

/// The KV pages of one layer: page b starts at base + b * page_bytes; inside
/// a page the layout is engine/kv_pages.hpp's by slot:
/// [layer][K, V][slot][kv_dim] in fp16 (the CPU forward pass keeps K
/// transposed in its own pools; no pool is shared between them).
struct kv_view {
  void* base = nullptr;
  long long page_bytes = 0;
  int block_tokens = 0;
  int kv_dim = 0;
  int layer = 0;
};

}  // namespace exa::gpu::ops
