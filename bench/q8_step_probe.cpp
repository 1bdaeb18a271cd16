// q8_step_probe: how much of the int8 peak a q8_0 tile can use at most under
// the engine's bitwise contract (engine/kernels_impl.hpp): every 32-element
// block ends with one float step per (row group, token) pair -- the exact
// integer sum converted, the scale product, a fused multiply-add -- beside
// the block's vpdpbusd. This runs 12 independent chains of 8 vpdpbusd per
// block (the batch-32 tile's 2 row groups × 6 tokens), once alone and once
// with each chain's float step, and prints the throughput of each and their
// ratio: the ceiling the tile's float steps leave it, before its loads.
// AVX-512 VNNI only; run by hand (docs/PERFORMANCE.md, batch 32 against
// batch 1).
//
//   build/bin/q8_step_probe [rounds]

#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "engine/isa.hpp"
#include "probe_args.hpp"

// GCC 12's AVX-512 intrinsics pass _mm512_undefined_*() as the unused merge
// operand, and -W(maybe-)uninitialized fires inside them (a known false
// positive, silenced as in engine/kernels_avx512.cpp).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace {

#define EXA_CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

template <bool FloatStep>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"), noinline)) double blocks(long n) {
#define EXA_DECLARE(i)                         \
  __m512i acc##i = _mm512_set1_epi32(i);       \
  __m512 sum##i = _mm512_set1_ps(float(i));
  EXA_CHAINS(EXA_DECLARE)
  __m512i w0 = _mm512_set1_epi8(3), w1 = _mm512_set1_epi8(5), x = _mm512_set1_epi8(1);
  __m512 scale = _mm512_set1_ps(1.0000001f);
  const auto t0 = std::chrono::steady_clock::now();
  for (long b = 0; b < n; ++b) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
#define EXA_DOT(i) acc##i = _mm512_dpbusd_epi32(acc##i, (i & 1) ? w1 : w0, x);
      EXA_CHAINS(EXA_DOT)
      asm volatile("" : "+v"(x), "+v"(w0), "+v"(w1));  // new operands each step, as loads would give
    }
    if constexpr (FloatStep) {
#define EXA_STEP(i) sum##i = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc##i), _mm512_mul_ps(scale, scale), sum##i);
      EXA_CHAINS(EXA_STEP)
      asm volatile("" : "+v"(scale));
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  float keep = 0;
#define EXA_KEEP(i) keep += _mm512_reduce_add_ps(sum##i) + float(_mm512_reduce_add_epi32(acc##i));
  EXA_CHAINS(EXA_KEEP)
  if (keep == 0.5f) std::puts("");  // keeps every chain live
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage = "usage: q8_step_probe [rounds 1-1000]";
  if (exa::bench::wants_help(argc, argv)) return std::puts(usage), 0;
  const long rounds = static_cast<long>(exa::bench::count_arg(argc, argv, 1, 5, 1, 1000, "q8_step_probe: rounds", usage));
  const exa::engine::cpu_caps caps = exa::engine::detect_cpu();
  if (!exa::engine::supports(caps, exa::engine::isa::avx512)) {
    std::printf("q8_step_probe: this CPU has no AVX-512 VNNI (%s); nothing to measure\n",
                exa::engine::describe(caps).c_str());
    return 0;
  }
  const long n = 20'000'000;  // blocks per run: about 0.3 s at 7 G vpdpbusd/s
  double best_alone = 0, best_stepped = 0;
  for (long r = 0; r < rounds; ++r) {  // alternated, best of each
    const double alone = 96.0 * n / blocks<false>(n) / 1e9, stepped = 96.0 * n / blocks<true>(n) / 1e9;
    std::printf("round %ld: vpdpbusd alone %.2f G/s, with the float steps %.2f G/s (%.0f %%)\n", r + 1, alone,
                stepped, 100 * stepped / alone);
    if (alone > best_alone) best_alone = alone;
    if (stepped > best_stepped) best_stepped = stepped;
  }
  std::printf("best: %.2f G/s alone (%.0f G int8 multiply-adds/s), %.2f G/s with the float steps: the tile's "
              "ceiling %.0f %% of the peak\n",
              best_alone, best_alone * 64, best_stepped, 100 * best_stepped / best_alone);
  return 0;
}
