#pragma once
// Where each weight of a Llama model goes in the CUDA engine's device memory,
// decided before any device is touched: the engine checks the model with it
// (an unsupported type or shape is refused by name, on machines without a GPU
// too), and the upload follows it. Pure host logic; no CUDA.
//
// Layouts on the device (gpu/ops/types.cuh):
//  - f16 and bf16 matrices: as in the file (row-major, 16-bit values).
//  - q8_0 matrices: repacked into int8 quants [rows][cols] plus float scales
//    [rows][cols / 32], so a warp's loads are aligned (repack_q8_0).
//  - vectors (norms, biases, RoPE frequency factors): dequantized to f32.
//  - the token embedding: as a matrix of its type (it is the output head too
//    when the file ties them), or f32 when it is only gathered.
// A layer's Q, K and V, and its gate and up, go in one piece each when they
// share a type: their values back to back, then their scales (see
// contiguous()), so the forward runs each piece as one matmul. Every piece
// starts at a multiple of device_alignment.

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "model/llama_config.hpp"
#include "model/llama_weights.hpp"

namespace exa::gpu {

enum class device_format : std::uint8_t { f32, f16, bf16, q8_0 };
std::string_view to_string(device_format f) noexcept;

inline constexpr std::uint64_t device_alignment = 256;
/// Limits of the CUDA kernels (gpu/ops/attention.cuh, rope_kv.cuh).
inline constexpr std::uint32_t cuda_max_head_dim = 256;

struct planned_tensor {
  const model::weight_view* src = nullptr;
  device_format format = device_format::f32;
  std::uint64_t offset = 0;         // the values (f32, f16, bf16) or int8 quants (q8_0)
  std::uint64_t bytes = 0;
  std::uint64_t scales_offset = 0;  // q8_0: float scales
  std::uint64_t scales_bytes = 0;
};

struct weight_plan {
  std::vector<planned_tensor> tensors;  // every distinct tensor once (a tied output is token_embd)
  std::uint64_t total_bytes = 0;        // one device allocation holds them all
  /// The entry of `w` (one of the model's weight views); nullptr if absent.
  const planned_tensor* find(const model::weight_view& w) const noexcept;
  /// True when `ws` (planned, in this order) share a format and width and lie
  /// back to back on the device, values and scales alike: one matrix of
  /// their rows stacked.
  bool contiguous(std::initializer_list<const model::weight_view*> ws) const noexcept;
};

/// The plan for `weights`. Errors: unsupported naming the tensor and its type
/// when a matrix is not f16, bf16 or q8_0 (K-quants and the other legacy
/// quants have no CUDA kernel yet; nor do f32 matrices) and when a shape is
/// outside what the kernels take (a matmul width not a multiple of 32, a head
/// wider than cuda_max_head_dim or of odd width).
expected<weight_plan> plan_weights(const model::llama_config& config, const model::llama_weights& weights);

/// GGUF q8_0 rows (34-byte blocks) -> `quants` [rows][cols] and `scales`
/// [rows][cols / 32] (each block's fp16 scale as a float, exactly), the
/// layout the CUDA matmul reads. cols % 32 == 0.
void repack_q8_0(const std::byte* src, std::size_t rows, std::size_t cols, std::int8_t* quants, float* scales);

/// The bytes a tensor takes on the device in `format`, and for q8_0 its
/// scales' (0 otherwise).
std::uint64_t device_bytes(device_format format, std::uint64_t rows, std::uint64_t cols) noexcept;
std::uint64_t device_scale_bytes(device_format format, std::uint64_t rows, std::uint64_t cols) noexcept;

}  // namespace exa::gpu
