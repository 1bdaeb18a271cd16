#pragma once
// The engine's hot loops, one table per instruction-set variant (isa.hpp).
// Each variant is the same source (kernels_impl.hpp) compiled for its ISA
// (kernels_scalar.cpp, kernels_avx2.cpp, kernels_avxvnni.cpp, kernels_avx512.cpp); they agree
// bitwise on every output. Everything else in the engine is compiled once for
// baseline x86-64 and so is the same instructions on every machine.

#include <cstddef>
#include <cstdint>

#include "engine/isa.hpp"
#include "model/kquants.hpp"
#include "model/legacy_quants.hpp"
#include "model/llama_weights.hpp"
#include "model/tensor_type.hpp"

namespace exa::engine {

/// Activations as the tile kernels read them (see matmul.hpp's activations).
struct kernel_acts {
  const float* xf = nullptr;  // f32 and f16/bf16-rounded activations
  std::size_t xf_stride = 0;  // floats per token
  const model::block_q8_0* xq = nullptr;  // q8_0 blocks
  std::size_t xq_stride = 0;              // blocks per token
  // q8_0 for the AVX-512 q4_0 kernel: the signed bytes q per token, padded to an
  // even block count; per 64-element step 16 scales [d0 ×8, d1 ×8] and 16
  // seeds −128 · Σ q over each lane's 4 bytes (xc, same stride as xd).
  const std::uint8_t* xu = nullptr;
  std::size_t xu_stride = 0;  // bytes per token
  const float* xd = nullptr;
  std::size_t xd_stride = 0;  // floats (and xc int32s) per token
  const std::int32_t* xc = nullptr;
  const float* xs = nullptr;  // q8_0: each block's scale as a float, xq_stride per token
  // q8_0: each block's −128 · Σ q, xq_stride per token (vpdpbusd's seed against
  // weights stored as q + 128, q8_pack.hpp).
  const std::int32_t* xseed = nullptr;
  const model::block_q8_K* xk = nullptr;  // q8_K activations
  std::size_t xk_stride = 0;              // blocks per token
  const void* x32 = nullptr;              // q8_0 or q8_1 blocks for Q4_1/Q5_0/Q5_1
  std::size_t x32_stride = 0;             // blocks per token
};

/// What kernel_table::peak keeps the core busy with (bench-engine's roofline).
enum class peak_op {
  int8_dot,  // the integer dot instruction of the q8_0 tiles (vpdpbusd, or AVX2's maddubs + madd + add)
  f32_fma,   // the float tiles' fused multiply-add, at the variant's width
};

struct kernel_table {
  isa id;
  /// The q4_0 kernel reads xu/xd/xc (the activations must fill them).
  bool q8_0_unsigned_layout;
  /// A forward pass made while this variant is active keeps each KV block's
  /// K transposed and scores it with dot_f16_kt (kv_pages::k_block), where
  /// that measured faster: AVX-512 (bench/attn_probe: 1.5-2.1x per dot for a
  /// decode's 3 heads at head dim 64, 0.95-2.4x over 1-16 heads at 64 and
  /// 128). On AVX2 it measured 0.71-0.88x for 2-4 heads (a broadcast per
  /// multiply-add of 8 lanes), so those keep K by slot. The scalar variant
  /// (hosts without AVX2, and the reference) takes it too, so that the engine
  /// tests, which run every variant a host has, cover both layouts on every
  /// host. Either way the same bits.
  bool k_transposed;
  /// y[t · y_stride + r] for weight rows [row_begin, row_end) and every token.
  void (*rows)(const model::weight_view& w, const kernel_acts& a, std::size_t n_tokens, float* y,
               std::size_t y_stride, std::size_t row_begin, std::size_t row_end);
  /// Q8_0 quantization of one row of n floats (ggml's reference rounding).
  void (*quantize_q8_0)(const float* x, model::block_q8_0* out, std::size_t n);
  /// q · k for an fp16 k, in the fixed 16-lane order.
  float (*dot_f16)(const float* q, const std::uint16_t* k, std::size_t n);
  /// out[i] = fma(w, v[i], out[i]) for an fp16 v.
  void (*axpy_f16)(float w, const std::uint16_t* v, float* out, std::size_t n);
  /// One K-quant row against n_tokens tokens' Q8_K blocks (kquant_dot.hpp).
  void (*kquant_row_tokens)(model::tensor_type type, const std::byte* row, const model::block_q8_K* x,
                            std::size_t x_stride, std::size_t n_tokens, std::size_t nb, float* y,
                            std::size_t y_stride);
  /// One Q4_1/Q5_0/Q5_1 row against n_tokens tokens (legacy_dot.hpp).
  void (*legacy_row_tokens)(model::tensor_type type, const std::byte* row, const void* x,
                            std::size_t x_stride, std::size_t n_tokens, std::size_t nb, float* y,
                            std::size_t y_stride);
  /// out[h · out_stride + i] = dot_f16(q + h · q_stride, k + i · stride, n)
  /// for h < heads and i < rows: one KV block against the query heads that
  /// share it (grouped-query attention), each k converted once for all.
  void (*dot_f16_rows)(const float* q, std::size_t q_stride, std::size_t heads, const std::uint16_t* k,
                       std::size_t stride, std::size_t rows, std::size_t n, float* out, std::size_t out_stride);
  /// dot_f16_rows for a K block stored transposed (kv_pages::k_block):
  /// element e of row i at kt[e · kt_stride + i]. kt_stride a multiple of
  /// 16, rows ≤ kt_stride (the rest of the 16 are read, not written), n at
  /// most 256. The same bits as dot_f16_rows on the same rows.
  void (*dot_f16_kt)(const float* q, std::size_t q_stride, std::size_t heads, const std::uint16_t* kt,
                     std::size_t kt_stride, std::size_t rows, std::size_t n, float* out, std::size_t out_stride);
  /// For h < heads, for i < rows in order:
  /// out[h · out_stride + e] = fma(w[h · w_stride + i], v[i · stride + e], out[h · out_stride + e]).
  void (*axpy_f16_rows)(const float* w, std::size_t w_stride, std::size_t heads, const std::uint16_t* v,
                        std::size_t stride, std::size_t rows, std::size_t n, float* out, std::size_t out_stride);
  /// g[i] = g[i] / (1 + det::expf(-g[i])) · u[i] (ops.hpp's silu_mul).
  void (*silu_mul)(float* g, const float* u, std::size_t n);
  /// ops.hpp's softmax: det::expf(x[i] − max), the sum in double in ops.hpp's order.
  void (*softmax)(float* x, std::size_t n);
  /// out[i] = f16_to_float(float_to_f16(x[i])) (model/half.hpp): the
  /// activations of f16 weights; a NaN becomes its sign and 0x7fc00000.
  void (*round_f16)(const float* x, float* out, std::size_t n);
  /// out[i] = float_to_f16(x[i]) (model/half.hpp), bit for bit, NaNs
  /// included: the K and V a forward pass stores in its cache.
  void (*to_f16)(const float* x, std::uint16_t* out, std::size_t n);
  /// `rounds` rounds of 16 independent chains of `op` on the calling
  /// thread: as many as one core can issue, for the compute roofline.
  /// Returns the multiply-adds done (int8 products or float lanes).
  std::uint64_t (*peak)(peak_op op, std::uint64_t rounds);
  /// Reads bytes [0, n) of p (n a multiple of 256) with the variant's widest
  /// loads, for the read-bandwidth roofline; returns a sum of what it read.
  std::uint64_t (*read_sum)(const std::byte* p, std::size_t n);
};

/// The table of variant `i` (whether this CPU can run it is the caller's
/// check: isa.hpp's supports()).
const kernel_table& kernels_for(isa i) noexcept;

/// The table of active_isa().
inline const kernel_table& active_kernels() noexcept { return kernels_for(active_isa()); }

namespace kernels_scalar { extern const kernel_table table; }
namespace kernels_avx2 { extern const kernel_table table; }
namespace kernels_amx { const kernel_table& table() noexcept; }
namespace kernels_avxvnni { extern const kernel_table table; }
namespace kernels_avx512 { extern const kernel_table table; }

}  // namespace exa::engine
