// exp_probe: nanoseconds per element of the two kernels built on the
// engine's double-precision expf (det::expf, the same bits on every ISA):
// SiLU (a feed-forward row of a batch: g / (1 + e^-g) · u) and softmax (one
// head's scores at a context length), on the active kernel variant
// (EXA_ENGINE_ISA picks another). Run by hand (docs/PERFORMANCE.md, "The
// expf kernels").
//
//   build/bin/exp_probe [elements 16-1048576]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "engine/isa.hpp"
#include "engine/kernel_table.hpp"
#include "probe_args.hpp"

namespace {

// Nanoseconds per element of fn over n elements, the best of 7 runs of
// enough calls to take about 20 ms.
template <class Fn>
double ns_per_element(Fn&& fn, std::size_t n) {
  const int reps = static_cast<int>(std::max<std::size_t>(1, 4'000'000 / n));
  double best = 1e30;
  for (int run = 0; run < 7; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) fn();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s * 1e9 / (double(reps) * double(n)));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace exa;
  const char* usage = "usage: exp_probe [elements 16-1048576]";
  if (bench::wants_help(argc, argv)) return std::puts(usage), 0;
  const std::size_t n = bench::count_arg(argc, argv, 1, 2048, 16, 1 << 20, "exp_probe: elements", usage);
  const auto& k = engine::active_kernels();
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> gate(-6.0f, 6.0f), score(-12.0f, 4.0f);
  std::vector<float> g0(n), u(n), s0(n), g(n), s(n);
  for (std::size_t i = 0; i < n; ++i) {
    g0[i] = gate(rng);
    u[i] = gate(rng);
    s0[i] = score(rng);
  }
  // Fresh inputs each call (a copy, timed alone and subtracted): SiLU
  // overwrites g, softmax x.
  const double copy = ns_per_element([&] { std::copy(g0.begin(), g0.end(), g.begin()); }, n);
  const double silu = ns_per_element(
      [&] {
        std::copy(g0.begin(), g0.end(), g.begin());
        k.silu_mul(g.data(), u.data(), n);
      },
      n);
  const double soft = ns_per_element(
      [&] {
        std::copy(s0.begin(), s0.end(), s.begin());
        k.softmax(s.data(), n);
      },
      n);
  float keep = 0;
  for (std::size_t i = 0; i < n; i += 97) keep += g[i] + s[i];
  std::printf("kernels: %s, %zu elements (checksum %.6g)\n", std::string(engine::to_string(k.id)).c_str(), n, keep);
  std::printf("silu_mul %.3f ns/element, softmax %.3f ns/element (a copy of the input, %.3f, subtracted)\n",
              silu - copy, soft - copy, copy);
  return 0;
}
