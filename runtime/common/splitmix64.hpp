#pragma once
// SplitMix64 (Steele, Lea and Flood, 2014): ExaServe's one pseudo-random
// generator, small and fast. Every use is seeded, so a run with the same
// seed repeats exactly (model weights, sampling, routing, workloads, faults).

#include <cmath>
#include <cstdint>

namespace exa {

inline constexpr std::uint64_t splitmix64_gamma = 0x9e3779b97f4a7c15ull;

/// The output mixer alone (Stafford's variant 13 of the MurmurHash3 finalizer).
constexpr std::uint64_t splitmix64_finalize(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// One step as a function: a well-spread 64-bit hash of x + gamma.
constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept { return splitmix64_finalize(x + splitmix64_gamma); }

/// A stream: the n-th output is splitmix64(seed + n * gamma).
class splitmix64_stream {
 public:
  constexpr explicit splitmix64_stream(std::uint64_t seed) noexcept : state_(seed) {}

  constexpr std::uint64_t next() noexcept {
    const std::uint64_t z = splitmix64(state_);
    state_ += splitmix64_gamma;
    return z;
  }
  /// Uniform in [0, 1) with 53 random bits.
  constexpr double uniform() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Exponential gap of a Poisson process at `rate` events per unit of time.
  double exponential(double rate) noexcept { return -std::log1p(-uniform()) / rate; }
  /// Uniform in [0, bound); bound must be > 0. Lemire's multiply-shift with
  /// rejection, so small bounds carry no modulo bias.
  constexpr std::uint32_t below(std::uint32_t bound) noexcept {
    std::uint64_t product = (next() >> 32) * bound;
    auto low = static_cast<std::uint32_t>(product);
    if (low < bound) {
      const std::uint32_t threshold = (0u - bound) % bound;
      while (low < threshold) {
        product = (next() >> 32) * bound;
        low = static_cast<std::uint32_t>(product);
      }
    }
    return static_cast<std::uint32_t>(product >> 32);
  }
  constexpr std::uint64_t state() const noexcept { return state_; }

 private:
  std::uint64_t state_;
};

}  // namespace exa
