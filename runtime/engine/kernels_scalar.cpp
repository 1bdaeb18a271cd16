// The engine's kernels for baseline x86-64: no vector extensions beyond the ABI's SSE2; every multiply-add is fmaf.
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

#pragma GCC push_options

#define EXA_K_NS kernels_scalar
#define EXA_K_SCALAR 1
#include "engine/kernels_impl.hpp"

namespace exa::engine::kernels_scalar {
extern const kernel_table table;
const kernel_table table{isa::scalar, false, true, rows_fn, quantize_fn, dot_f16_fn, axpy_f16_fn, kquant_fn, legacy_fn,
                         dot_f16_rows_fn, dot_f16_kt_fn, axpy_f16_rows_fn, silu_mul_fn, softmax_fn,
                         round_f16_fn, to_f16_fn, peak_fn, read_sum_fn};
}  // namespace exa::engine::kernels_scalar

#pragma GCC pop_options
