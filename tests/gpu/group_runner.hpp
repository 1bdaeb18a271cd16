#pragma once
// Helpers for tests of communicator groups: one real thread per member, seeded
// jitter to vary which member arrives first, and data whose sums depend on the
// order of the additions (so a wrong order shows as a bit difference).
// Catch2 assertions are not thread-safe: members record, the test thread checks.

#include <chrono>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include "common/splitmix64.hpp"

namespace exa::test {

/// Runs fn(rank) on one thread per member and joins them all.
template <class F>
void on_each_member(int size, F&& fn) {
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) threads.emplace_back([&fn, r] { fn(r); });
  for (auto& t : threads) t.join();
}

/// Yields the core a seeded random number of times (0..max_yields-1), so that
/// members reach a collective in a different order from call to call.
inline void jitter(splitmix64_stream& rng, std::uint32_t max_yields) {
  for (std::uint32_t n = rng.below(max_yields); n > 0; --n) std::this_thread::yield();
}

/// Floats in +-[2^-6, 2^6): random signs, mantissas and exponents, so that
/// reassociating a sum of several of them changes its rounding.
inline std::vector<float> spread_values(std::uint64_t seed, std::size_t n) {
  splitmix64_stream rng(seed);
  std::vector<float> out(n);
  for (auto& v : out) {
    const double mantissa = 1.0 + rng.uniform();
    const int exponent = static_cast<int>(rng.below(12)) - 6;
    v = static_cast<float>(std::ldexp(rng.next() & 1 ? -mantissa : mantissa, exponent));
  }
  return out;
}

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace exa::test
