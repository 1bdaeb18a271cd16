// matmul_probe: the float tiles' multiply-add rate, matrix by matrix, against
// the core's measured f32 peak (kernel_table::peak): which shape of the small
// preset's matrices keeps batch 32 under the roof. One thread, f32 weights
// (f16 with --f16) in huge-page memory, f32 activations 64-byte aligned. On AVX-512 it also
// measures the ceiling the tile's loads leave it: the batch tile's 24 fused
// multiply-adds a step from registers alone, and with the 11 loads (3 weight
// rows, 8 tokens) it issues per step, all from L1. Run by hand
// (docs/PERFORMANCE.md, batch 32 against batch 1).
//
//   build/bin/matmul_probe [--memory] [--f16] [tokens] [seconds per shape] [ROWSxCOLS ...]
//
// --memory: each call reads another copy of the weights, as many copies as
// make about 256 MiB (at least two), so they come from memory as the
// engine's do (a 32 MiB L3 holds a lone copy of every small-preset shape,
// and the rates without it are the cache's). Shapes over 1 GiB of weights
// are refused with it.
//
// --f16: the weights in f16 (the activations stay f32, as in the engine);
// the same values, rounded.

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <immintrin.h>

#include "engine/kernel_table.hpp"
#include "model/half.hpp"
#include "probe_args.hpp"

// GCC 12's AVX-512 intrinsics pass _mm512_undefined_*() as the unused merge
// operand, and -W(maybe-)uninitialized fires inside them (as in
// q8_step_probe.cpp).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace {

using clock_type = std::chrono::steady_clock;

void* huge_alloc(std::size_t bytes) {
  const std::size_t align = std::size_t{2} << 20;
  bytes = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, bytes);
  if (p == nullptr) {
    std::fprintf(stderr, "matmul_probe: out of memory (%zu bytes)\n", bytes);
    std::exit(1);
  }
  madvise(p, bytes, MADV_HUGEPAGE);
  std::memset(p, 0, bytes);
  return p;
}

// 24 accumulator chains (a 3 × 8 tile), `Loads` vector loads a step from a
// 64 KiB buffer that stays in L1/L2 (the tile's 3 weight and 8 token loads
// when 11); multiply-adds per second.
template <int Loads>
__attribute__((target("avx512f"), noinline)) double tile_steps(const float* buf, long n) {
  __m512 acc[24];
  __m512 v[11];
#pragma GCC unroll 24
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_setzero_ps();
#pragma GCC unroll 11
  for (int i = 0; i < 11; ++i) v[i] = _mm512_set1_ps(1.0f + float(i) / 1024);
  const auto t0 = clock_type::now();
  for (long it = 0; it < n; ++it) {
    const float* p = buf + (it & 63) * 16;
#pragma GCC unroll 11
    for (int i = 0; i < Loads; ++i) {
      v[i] = _mm512_loadu_ps(p + i * 1024);
      asm("" : "+v"(v[i]));  // held for its multiply-adds, as the tile does
    }
#pragma GCC unroll 3
    for (int r = 0; r < 3; ++r)
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) acc[r * 8 + c] = _mm512_fmadd_ps(v[r], v[3 + c], acc[r * 8 + c]);
  }
  const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
  float keep = 0;
#pragma GCC unroll 24
  for (int i = 0; i < 24; ++i) keep += _mm512_reduce_add_ps(acc[i]);
  if (keep == 0.5f) std::puts("");  // keeps every chain live
  return double(n) * 24 * 16 / s / 1e9;
}

void tile_ceiling() {
  auto* buf = static_cast<float*>(std::aligned_alloc(64, 16 * 1024 * sizeof(float)));
  if (buf == nullptr) return;
  for (std::size_t i = 0; i < 16 * 1024; ++i) buf[i] = 1.0f / 4096;
  const long n = 50'000'000;
  double alone = 0, loaded = 0;
  for (int r = 0; r < 3; ++r) {  // alternated, best of each
    alone = std::max(alone, tile_steps<0>(buf, n));
    loaded = std::max(loaded, tile_steps<11>(buf, n));
  }
  std::printf("3 x 8 tile from L1: %.1f GMAC/s from registers, %.1f with its 11 loads a step (%.0f %%)\n", alone,
              loaded, 100 * loaded / alone);
  std::free(buf);
}

}  // namespace

int main(int argc_in, char** argv_in) {
  using namespace exa;
  const char* usage = "usage: matmul_probe [--memory] [--f16] [tokens 1-512] [seconds per shape] [ROWSxCOLS ...]";
  if (exa::bench::wants_help(argc_in, argv_in)) return std::puts(usage), 0;
  // --memory and --f16 anywhere; the rest positional.
  std::vector<char*> args;
  bool from_memory = false, f16 = false;
  for (int i = 0; i < argc_in; ++i) {
    if (i > 0 && std::strcmp(argv_in[i], "--memory") == 0) from_memory = true;
    else if (i > 0 && std::strcmp(argv_in[i], "--f16") == 0) f16 = true;
    else args.push_back(argv_in[i]);
  }
  const int argc = static_cast<int>(args.size());
  char** argv = args.data();
  const std::size_t tokens = exa::bench::count_arg(argc, argv, 1, 32, 1, 512, "matmul_probe: tokens", usage);
  char* end = nullptr;
  const double seconds = argc > 2 ? std::strtod(argv[2], &end) : 0.5;
  if (argc > 2 && (*end != '\0' || !(seconds > 0) || seconds > 600)) {
    std::fprintf(stderr, "matmul_probe: seconds per shape must be a number in (0, 600], got '%s'\n%s\n", argv[2], usage);
    return 2;
  }
  struct shape {
    const char* name;
    std::size_t rows, cols;
  };
  std::vector<shape> shapes = {{"q/o 768x768", 768, 768}, {"k/v 256x768", 256, 768},
                                {"gate/up 2048x768", 2048, 768}, {"down 768x2048", 768, 2048}};
  // More shapes as ROWSxCOLS arguments (e.g. 48x256: one row block in L1).
  std::vector<std::string> names;
  for (int i = 3; i < argc; ++i) names.emplace_back(argv[i]);
  for (const std::string& n : names) {
    std::size_t r = 0, c = 0;
    if (std::sscanf(n.c_str(), "%zux%zu", &r, &c) != 2 || r == 0 || c == 0 || r > 65536 || c > 65536) {
      std::fprintf(stderr, "matmul_probe: shape '%s' is not ROWSxCOLS\n", n.c_str());
      return 2;
    }
    shapes.push_back({n.c_str(), r, c});
  }
  const engine::kernel_table& k = engine::active_kernels();
  const auto t0 = clock_type::now();
  const std::uint64_t peak_macs = k.peak(engine::peak_op::f32_fma, 20'000'000);
  const double peak = double(peak_macs) / std::chrono::duration<double>(clock_type::now() - t0).count() / 1e9;
  const std::string isa_name(engine::to_string(k.id));
  std::printf("isa %s, %zu tokens, %s weights, f32 peak %.1f GMAC/s, weights from %s\n", isa_name.c_str(), tokens,
              f16 ? "f16" : "f32", peak,
              from_memory ? "memory (copies of about 256 MiB in all, one a call)" : "cache (one copy)");
  if (engine::supports(engine::detect_cpu(), engine::isa::avx512)) tile_ceiling();
  for (const shape& s : shapes) {
    const std::size_t w_bytes = s.rows * s.cols * (f16 ? sizeof(std::uint16_t) : sizeof(float));
    const std::size_t copies = from_memory ? std::max<std::size_t>(2, (std::size_t{256} << 20) / w_bytes) : 1;
    if (from_memory && w_bytes > (std::size_t{1} << 30)) {
      std::fprintf(stderr, "matmul_probe: --memory with %s: %zu MiB of weights, over the 1 GiB its copies allow\n",
                   s.name, w_bytes >> 20);
      return 2;
    }
    auto* w = static_cast<std::byte*>(huge_alloc(w_bytes * copies));
    auto* x = static_cast<float*>(huge_alloc(tokens * s.cols * sizeof(float)));
    auto* y = static_cast<float*>(huge_alloc(tokens * s.rows * sizeof(float)));
    for (std::size_t i = 0; i < s.rows * s.cols; ++i) {
      const float v = float(int(i % 97) - 48) / 64.0f;  // exact in f16 too
      if (f16) {
        const std::uint16_t h = model::float_to_f16(v);
        std::memcpy(w + i * sizeof h, &h, sizeof h);
      } else {
        std::memcpy(w + i * sizeof v, &v, sizeof v);
      }
    }
    for (std::size_t c = 1; c < copies; ++c) std::memcpy(w + c * w_bytes, w, w_bytes);
    for (std::size_t i = 0; i < tokens * s.cols; ++i) x[i] = float(int(i % 89) - 44) / 32.0f;
    model::weight_view view;
    view.type = f16 ? model::tensor_type::f16 : model::tensor_type::f32;
    view.rows = s.rows;
    view.cols = s.cols;
    view.data = w;
    engine::kernel_acts a;
    a.xf = x;
    a.xf_stride = s.cols;
    k.rows(view, a, tokens, y, s.rows, 0, s.rows);  // warm
    std::uint64_t calls = 0;
    const auto b = clock_type::now();
    double took = 0;
    while (took < seconds) {
      view.data = w + (calls + 1) % copies * w_bytes;
      k.rows(view, a, tokens, y, s.rows, 0, s.rows);
      ++calls;
      took = std::chrono::duration<double>(clock_type::now() - b).count();
    }
    const double gmacs = double(calls) * double(s.rows * s.cols * tokens) / took / 1e9;
    std::printf("%-18s %7.1f GMAC/s %5.1f %% of peak  (y[0] %.3f)", s.name, gmacs, 100 * gmacs / peak, y[0]);
    if (from_memory) std::printf("  %zu copies, %zu MiB", copies, (w_bytes * copies) >> 20);
    std::printf("\n");
    std::free(w);
    std::free(x);
    std::free(y);
  }
  return 0;
}
