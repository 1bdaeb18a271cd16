#pragma once
// Q8_0 weights repacked once for the SIMD kernels (kernels_impl.hpp, q8p):
// 16 rows side by side, so that one 512-bit register holds 4 consecutive
// weights of each of 16 rows (vpdpbusd's layout, and AMX's B tile), and the
// weights of a group of rows stream as one run of memory.
//
// Group g (rows 16g .. 16g + 15) of a matrix with nb = cols / 32 blocks per
// row takes nb · q8p_block_bytes bytes, block after block; block b of a group:
//   bytes [64j, 64j + 64), j < 8: row i's weights 32b + 4j .. 32b + 4j + 3 at
//     64j + 4i, each stored as an unsigned byte q + 128 (q ^ 0x80);
//   bytes [512, 544): the 16 rows' fp16 scales, row i at 512 + 2i.
// Rows past the matrix's end pad the last group with q = 0 and scale 0.
// Same bytes per weight as the file (34 per 32): decode reads no more.

#include <cstddef>
#include <cstdint>

#include "model/llama_weights.hpp"

namespace exa::engine {

inline constexpr std::size_t q8p_group_rows = 16;
inline constexpr std::size_t q8p_quant_bytes = 512;  // 8 steps of 16 rows × 4 bytes
inline constexpr std::size_t q8p_block_bytes = q8p_quant_bytes + 2 * q8p_group_rows;

/// Bytes of one 16-row group of a q8_0 matrix `cols` wide.
constexpr std::size_t q8p_group_bytes(std::size_t cols) noexcept { return cols / 32 * q8p_block_bytes; }

/// Packs rows [row_begin, row_end) of q8_0 weight `w` as groups starting at
/// row_begin; `out` takes ceil((row_end − row_begin) / 16) groups.
void q8p_pack_rows(const model::weight_view& w, std::size_t row_begin, std::size_t row_end,
                   std::byte* out) noexcept;

/// Rows [row_begin, row_end) of q8_0 weight `w` as packed groups: its own
/// copy when it has one and row_begin starts a group, else packed into this
/// thread's scratch (valid until the thread's next call).
const std::byte* q8p_rows(const model::weight_view& w, std::size_t row_begin, std::size_t row_end);

/// Copies packed once per forward: weight_store (weight_store.hpp).

}  // namespace exa::engine
