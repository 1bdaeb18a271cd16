#pragma once
// What bounds the CPU engine on this machine: the compute and read-bandwidth
// peaks measured with the active kernel variant's own instructions
// (kernel_table::peak, read_sum), and the decode speed they allow. A decode
// step of b sequences multiplies every matmul weight once per sequence
// (matmul_macs_per_token each) and reads the weights once
// (matmul_weight_bytes), so its tokens/s is at most
//   min(peak multiply-adds/s / macs per token, b · read bytes/s / weight bytes).
// bench-engine reports both, so "batch 32 ≥ 10× batch 1" can be read against
// what the machine allows (docs/PERFORMANCE.md, "Roofline").

#include <cstddef>
#include <cstdint>

#include "model/llama_weights.hpp"

namespace exa::engine {

class thread_pool;
struct kernel_table;

struct machine_peaks {
  double int8_macs_per_s = 0;   // the q8_0 tiles' integer dot instruction, all threads
  double f32_macs_per_s = 0;    // the float tiles' FMA lanes, all threads
  double read_bytes_per_s = 0;  // a stream larger than the caches, all threads
};

/// Measures the peaks on every thread of `pool` at once with `kernels`'
/// probes: the best of `repeat` runs of about `probe_s` seconds each.
machine_peaks measure_peaks(thread_pool& pool, const kernel_table& kernels, int repeat, double probe_s = 0.1);

/// Multiply-adds of the matrix products per token: every layer's Q, K, V, O,
/// gate, up and down, and the output head (attention's own products, which
/// grow with the context, are not counted).
std::uint64_t matmul_macs_per_token(const model::llama_weights& w);
/// Bytes of those matrices (the output head once, tied or not): what one
/// decode step reads whatever its batch.
std::uint64_t matmul_weight_bytes(const model::llama_weights& w);
/// True when the matrices are integer-quantized (their products run the
/// int8 dot instruction), false for f32/f16/bf16 (the float tiles).
bool matmul_is_int8(const model::llama_weights& w);

/// The decode tokens/s a step of `batch` sequences cannot exceed: the
/// smaller of the compute and the weight-read bounds. 0 when a peak is 0
/// (not measured).
double roofline_tok_s(std::uint64_t macs_per_token, std::uint64_t weight_bytes, double macs_per_s,
                      double read_bytes_per_s, std::uint32_t batch);

}  // namespace exa::engine
