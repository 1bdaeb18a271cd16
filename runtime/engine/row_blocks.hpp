#pragma once
// How the float kernels (kernels_impl.hpp, rows()) cut a matrix's rows into
// blocks: the rows every token tile of a batch runs over before the next
// block, while the tiles prefetch that next block. Pure arithmetic, so it is
// tested on its own (engine_test "float_block_rows*"); only the speed
// depends on it, never a result.

#include <algorithm>
#include <cstddef>

namespace exa::engine {

/// Every tile height of every kernel variant divides this, so only a
/// matrix's last rows use 1-row tiles; threads take whole halves of it
/// (matmul.cpp).
inline constexpr std::size_t row_multiple = 48;
/// A block's bytes, in whole row_multiples (at least one): small enough to
/// stay in L1/L2 while every token streams past.
inline constexpr std::size_t row_block_bytes = 32 * 1024;
/// A batch over long rows (AVX-512's long-row tile, 4 tokens by 6 rows) reads
/// each block once per 4 tokens, from L2 only if the block fits there beside
/// the next one's prefetch: at 4,096 f32 columns a 48-row block is 768 KiB,
/// two of them more than a 1 MiB L2. Such blocks hold at most this many
/// bytes, in whole steps of long_row_step rows (the 6-row tile's and the
/// 3-token tile's 4-row heights both divide it), one step however long the
/// rows. On the Zen 5 host, weights from memory, batch 32, 384 KiB blocks
/// against 48 rows, call by call (bench/matmul_probe): 4096 x 4096 1.15x,
/// 11008 x 4096 1.07x, 4096 x 11008 1.13x (f32); f16, whose 48 rows of 4,096
/// columns fit already, 0.98-1.08x.
inline constexpr std::size_t long_row_block_bytes = 384 * 1024;
inline constexpr std::size_t long_row_step = 12;

/// The rows of a block of rows `pitch` bytes long; `long_rows`: a batch on
/// the long-row tile.
constexpr std::size_t float_block_rows(std::size_t pitch, bool long_rows) noexcept {
  pitch = std::max<std::size_t>(pitch, 1);
  const std::size_t rows = std::max<std::size_t>(1, row_block_bytes / pitch / row_multiple) * row_multiple;
  if (!long_rows) return rows;
  return std::min(rows, std::max<std::size_t>(1, long_row_block_bytes / pitch / long_row_step) * long_row_step);
}

}  // namespace exa::engine
