#pragma once
// Identity of a KV-cache block by its content: the hash of the block's tokens
// chained to the hash of the block before it, so equal hashes mean equal
// whole prefixes (up to 64-bit collisions), not just equal blocks. The engine
// keys its prefix cache on these; replicas report them to the router, which
// computes the same chain over a request's prompt (prefix-aware routing). The
// function is fixed (no std::hash, no seed) so every process agrees.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "model/vocab.hpp"

namespace exa::model {

/// Hash of one block of tokens chained to its parent's hash (0 for the
/// first block of a sequence). Never returns 0.
std::uint64_t block_hash(std::uint64_t parent, std::span<const token_id> tokens) noexcept;

/// Chained hashes of the full blocks of `tokens`, `block_tokens` each (a
/// partial last block has none), at most `max_blocks` of them.
std::vector<std::uint64_t> prefix_block_hashes(std::span<const token_id> tokens,
                                               std::uint32_t block_tokens,
                                               std::size_t max_blocks = SIZE_MAX);

}  // namespace exa::model
