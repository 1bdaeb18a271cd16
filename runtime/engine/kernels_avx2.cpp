// The engine's kernels for AVX2 + FMA + F16C (Haswell and later, Zen).
// Only functions defined below the pragma get the ISA; everything included
// above it keeps the baseline (see kernels_impl.hpp).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include <immintrin.h>

#include "engine/det_math.hpp"
#include "engine/even_tiles.hpp"
#include "engine/kernel_table.hpp"
#include "engine/kquant_dot.hpp"
#include "engine/legacy_dot.hpp"
#include "engine/q8_pack.hpp"
#include "engine/row_blocks.hpp"
#include "model/half.hpp"
#include "model/quantize.hpp"

// GCC 12's AVX2 gather intrinsics pass _mm256_undefined_pd() as the unused
// merge operand, and -Wmaybe-uninitialized then fires inside them wherever
// they are inlined (a known GCC false positive): silenced in this file only.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define EXA_K_NS kernels_avx2
#define EXA_K_AVX2 1
#include "engine/kernels_impl.hpp"

namespace exa::engine::kernels_avx2 {
extern const kernel_table table;
const kernel_table table{isa::avx2, false, false, rows_fn, quantize_fn, dot_f16_fn, axpy_f16_fn, kquant_fn, legacy_fn,
                         dot_f16_rows_fn, dot_f16_kt_fn, axpy_f16_rows_fn, silu_mul_fn, softmax_fn,
                         round_f16_fn, to_f16_fn, peak_fn, read_sum_fn};
}  // namespace exa::engine::kernels_avx2

#pragma GCC pop_options
