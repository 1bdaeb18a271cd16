#pragma once
// How the kernels cut a batch's tokens into tiles (kernels_impl.hpp,
// in_even_chunks): the fewest tiles of at most `max` tokens, their sizes
// within one of each other, the larger first. A batch of 32 in tiles of at
// most 6 runs 6, 6, 5, 5, 5, 5, not five of 6 and one of 2; 9 in tiles of at
// most 8 runs 5 and 4, not 8 and 1. A small tile's loads serve few
// multiply-adds: on the Zen 5 host the 2-token q8_0 tile held 7 % of a
// batch-32 step's samples for 6 % of its tokens, and the 1-token float tile
// re-read the row block for one token (docs/PERFORMANCE.md, "Results
// (5 December 2026, late morning ...)"). Each token's outputs are the same
// bits whatever its tile, so only the speed depends on this.

#include <cstddef>

namespace exa::engine {

struct even_tiles {
  std::size_t tiles = 0, base = 0, extra = 0;  // `extra` tiles of base + 1 tokens, then tiles of base
  constexpr even_tiles(std::size_t n, std::size_t max) noexcept
      : tiles(max ? (n + max - 1) / max : 0), base(tiles ? n / tiles : 0), extra(tiles ? n % tiles : 0) {}
  /// Tile k's size (k < tiles).
  constexpr std::size_t size(std::size_t k) const noexcept { return base + (k < extra ? 1 : 0); }
  /// The first token of tile k (k ≤ tiles; k = tiles gives n).
  constexpr std::size_t start(std::size_t k) const noexcept { return k * base + (k < extra ? k : extra); }
  /// The index of the tile that starts at token t.
  constexpr std::size_t index(std::size_t t) const noexcept {
    const std::size_t big = extra * (base + 1);
    return t < big ? t / (base + 1) : extra + (t - big) / base;
  }
};

}  // namespace exa::engine
