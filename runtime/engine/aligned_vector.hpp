#pragma once

// A std::vector whose storage starts on a 64-byte boundary. The kernels read
// activations in 64-byte vectors; from malloc's 16-byte-aligned blocks every
// such load straddles two cache lines, and split loads measured 10-20 %
// slower in the f16/f32 tiles (docs/PERFORMANCE.md).

#include <cstddef>
#include <new>
#include <vector>

namespace exa::engine {

template <class T>
struct cache_line_allocator {
  using value_type = T;
  static constexpr std::align_val_t alignment{64};
  cache_line_allocator() noexcept = default;
  template <class U>
  cache_line_allocator(const cache_line_allocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), alignment)); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, alignment); }
  template <class U>
  bool operator==(const cache_line_allocator<U>&) const noexcept {
    return true;
  }
};

template <class T>
using aligned_vector = std::vector<T, cache_line_allocator<T>>;

}  // namespace exa::engine
