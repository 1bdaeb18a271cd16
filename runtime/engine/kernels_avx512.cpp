// The engine's kernels for AVX-512 F/BW/VL/DQ + VNNI (Ice Lake and later, Zen 4).
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

// GCC 12's AVX-512 intrinsics pass _mm512_undefined_*() as the unused merge
// operand, and -W(maybe-)uninitialized then fires inside them wherever they
// are inlined (a known GCC false positive): silenced in this file only.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#define EXA_K_NS kernels_avx512
#define EXA_K_AVX512 1
#include "engine/kernels_impl.hpp"

namespace exa::engine::kernels_avx512 {
extern const kernel_table table;
const kernel_table table{isa::avx512, true, true, rows_fn, quantize_fn, dot_f16_fn, axpy_f16_fn, kquant_fn, legacy_fn,
                         dot_f16_rows_fn, dot_f16_kt_fn, axpy_f16_rows_fn, silu_mul_fn, softmax_fn,
                         round_f16_fn, to_f16_fn, peak_fn, read_sum_fn};
}  // namespace exa::engine::kernels_avx512

#pragma GCC pop_options
