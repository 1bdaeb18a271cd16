#include "model/prefix_hash.hpp"

namespace exa::model {
namespace {

// splitmix64's finalizer: a bijection with good avalanche.
std::uint64_t mix(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

std::uint64_t block_hash(std::uint64_t parent, std::span<const token_id> tokens) noexcept {
  std::uint64_t h = mix(parent ^ 0x9e3779b97f4a7c15ULL);
  h = mix(h ^ tokens.size());
  for (const token_id t : tokens) h = mix(h + static_cast<std::uint32_t>(t) + 0x632be59bd9b4e019ULL);
  return h == 0 ? 1 : h;
}

std::vector<std::uint64_t> prefix_block_hashes(std::span<const token_id> tokens,
                                               std::uint32_t block_tokens, std::size_t max_blocks) {
  std::vector<std::uint64_t> out;
  if (block_tokens == 0) return out;
  std::uint64_t parent = 0;
  for (std::size_t b = 0; (b + 1) * block_tokens <= tokens.size() && out.size() < max_blocks; ++b) {
    parent = block_hash(parent, tokens.subspan(b * block_tokens, block_tokens));
    out.push_back(parent);
  }
  return out;
}

}  // namespace exa::model
