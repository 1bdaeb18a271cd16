#pragma once
// Helpers of cuda_gpu_test: device buffers, uploads, the normalized MSE the
// checks bound (llama.cpp's test-backend-ops measure: Σ(a−b)² / Σb²).

#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>

#include <cstddef>
#include <vector>

namespace exa::test {

#define CUDA_REQUIRE(call) REQUIRE(cudaSuccess == (call))

/// Device memory for `n` values of T, freed on scope exit.
template <class T>
class dev {
 public:
  explicit dev(std::size_t n) : n_(n) { CUDA_REQUIRE(cudaMalloc(reinterpret_cast<void**>(&p_), std::max<std::size_t>(n, 1) * sizeof(T))); }
  explicit dev(const std::vector<T>& host) : dev(host.size()) { upload(host); }
  ~dev() { cudaFree(p_); }
  dev(const dev&) = delete;
  dev& operator=(const dev&) = delete;

  T* get() const noexcept { return p_; }
  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() <= n_);
    CUDA_REQUIRE(cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    CUDA_REQUIRE(cudaDeviceSynchronize());
    CUDA_REQUIRE(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_;
};

/// Σ(a−b)² / Σb² over the first `n` values (all when n is 0).
inline double nmse(const std::vector<float>& a, const std::vector<float>& b, std::size_t n = 0) {
  if (n == 0) n = b.size();
  REQUIRE(a.size() >= n);
  REQUIRE(b.size() >= n);
  double num = 0, den = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return den == 0 ? num : num / den;
}

}  // namespace exa::test
