// The AVX-512 variant with AMX-INT8 (Sapphire Rapids and later): q8_0
// matrices against 16 tokens and more run their integer dot products on AMX
// tiles; everything else is the AVX-512 variant's code (kernels_avx512.cpp).
//
// Same bits as every other variant: a q8_0 block's dot product is an exact
// int32 (a tile's TDPBSUD adds the same 32 products as 8 vpdpbusd steps),
// and the float step after it is the AVX-512 tile's, per output, in block
// order: acc = fma(float(Σ + seed), d_w · d_x, acc) (kernels_impl.hpp, q8p).
//
// Layout: C = A · B per 32-element block b of a 16-row group, with
//   A (tile 2/5): 16 tokens × 32 signed bytes, token t's block b (gathered
//      once per call into 512 contiguous bytes per block: gather_tokens);
//   B (tile 3/6): 8 rows × 64 bytes: q8p's block b as stored (4 consecutive
//      weights of each of 16 rows per 64 bytes, unsigned q + 128: the
//      VNNI layout TDPBSUD takes);
//   C (tile 0/1): 16 tokens × 16 rows of int32, then + the seed −128 · Σ x.
// Two blocks are in flight: while the AVX-512 units scale block b's sums,
// the tile unit multiplies blocks b + 1 and b + 2 (group_tokens).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <vector>

#include <immintrin.h>

#include "engine/aligned_vector.hpp"
#include "engine/kernel_table.hpp"
#include "engine/q8_pack.hpp"
#include "model/legacy_quants.hpp"

// GCC 12's false -W(maybe-)uninitialized inside the AVX-512 intrinsics, as
// in kernels_avx512.cpp.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8")

namespace exa::engine::kernels_amx {
namespace {

constexpr std::size_t tile_tokens = 16;

struct alignas(64) tile_config {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

// GCC's tile intrinsics are asm statements that do not tell the compiler
// which memory they read or write: a fence on both sides of them keeps the
// vector loads and stores of the same buffers in order.
inline void compiler_fence() noexcept { __asm__ volatile("" ::: "memory"); }

void configure_tiles() noexcept {
  tile_config c;
  for (int t : {0, 1}) c.rows[t] = 16, c.colsb[t] = 64;  // C: 16 tokens × 16 int32
  for (int t : {2, 5}) c.rows[t] = 16, c.colsb[t] = 32;  // A: 16 tokens × 32 int8 (gather_tokens)
  for (int t : {3, 6}) c.rows[t] = 8, c.colsb[t] = 64;   // B: 8 × (16 rows × 4 bytes)
  compiler_fence();  // the intrinsic's asm names only the first 8 bytes as read
  _tile_loadconfig(&c);
}

// Token t0 + t's q8_0 block b, its 32 signed bytes, at xa + 512 b + 32 t:
// a tile load of 16 contiguous, aligned rows. (Loaded straight from the
// activations, 16 rows 34 · nb bytes apart and often split across cache
// lines, the tile loads took more time than the multiplies, and the
// kernel was slower than the AVX-512 one.)
void gather_tokens(const kernel_acts& a, std::size_t t0, std::size_t nb, std::byte* xa) noexcept {
  for (std::size_t t = 0; t < tile_tokens; ++t) {
    const model::block_q8_0* x = a.xq + (t0 + t) * a.xq_stride;
    for (std::size_t b = 0; b < nb; ++b)
      _mm256_store_si256(reinterpret_cast<__m256i*>(xa + 512 * b + 32 * t),
                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs)));
  }
}

// acc[t] = fma(float(sums[t] + seed of token t), d_w · d_x of token t, acc[t]),
// for block b: the AVX-512 tile's float step (kernels_impl.hpp, q8p::tile).
[[gnu::always_inline]] inline void scale_block(__m512 (&acc)[16], const std::int32_t (&sums)[16][16],
                                               const std::byte* grp, std::size_t b, const float* xs,
                                               const std::int32_t* seed, std::size_t stride) noexcept {
  const __m512 dw = _mm512_cvtph_ps(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(grp + b * q8p_block_bytes + q8p_quant_bytes)));
#pragma GCC unroll 16
  for (std::size_t t = 0; t < 16; ++t) {
    const __m512i is = _mm512_add_epi32(_mm512_load_si512(sums[t]), _mm512_set1_epi32(seed[t * stride + b]));
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dw, _mm512_set1_ps(xs[t * stride + b])), acc[t]);
  }
}

// 16 tokens from t0 (their blocks gathered at xa) × one 16-row group `grp`
// (valid rows of it: `valid`). Two blocks per iteration, on tiles 0 and 1,
// so that tile numbers stay constants.
void group_tokens(const std::byte* grp, unsigned valid, std::size_t nb, const kernel_acts& a, std::size_t t0,
                  const std::byte* xa, float* y, std::size_t ys, std::size_t r0, const std::byte* next) noexcept {
  alignas(64) std::int32_t sums0[16][16];
  alignas(64) std::int32_t sums1[16][16];
  const float* xs = a.xs + t0 * a.xq_stride;
  const std::int32_t* seed = a.xseed + t0 * a.xq_stride;
  const std::size_t stride = a.xq_stride;
  __m512 acc[16];
#pragma GCC unroll 16
  for (int t = 0; t < 16; ++t) acc[t] = _mm512_setzero_ps();

  // Two blocks in flight on the tile unit: block b + 2's multiply is issued
  // on tile set b % 2 as soon as block b's sums are stored from it, and has
  // the scaling of blocks b and b + 1 on the vector units to finish. (One
  // block ahead, each store waited for the multiply issued just before it:
  // no faster than the AVX-512 tile.)
  const auto issue = [&](auto tile, std::size_t blk) {
    if (blk >= nb) return;
    if (next != nullptr)
      for (std::size_t l = 0; l < q8p_block_bytes; l += 64)
        _mm_prefetch(reinterpret_cast<const char*>(next + blk * q8p_block_bytes + l), _MM_HINT_T0);
    if constexpr (decltype(tile)::value == 0) {
      _tile_zero(0);
      _tile_loadd(2, xa + 512 * blk, 32);
      _tile_loadd(3, grp + blk * q8p_block_bytes, 64);
      _tile_dpbsud(0, 2, 3);
    } else {
      _tile_zero(1);
      _tile_loadd(5, xa + 512 * blk, 32);
      _tile_loadd(6, grp + blk * q8p_block_bytes, 64);
      _tile_dpbsud(1, 5, 6);
    }
  };
  using tile0 = std::integral_constant<int, 0>;
  using tile1 = std::integral_constant<int, 1>;
  compiler_fence();
  issue(tile0{}, 0);
  issue(tile1{}, 1);
  for (std::size_t b = 0; b < nb; b += 2) {
    _tile_stored(0, sums0, 64);
    compiler_fence();
    issue(tile0{}, b + 2);
    scale_block(acc, sums0, grp, b, xs, seed, stride);
    if (b + 1 == nb) break;
    compiler_fence();
    _tile_stored(1, sums1, 64);
    compiler_fence();
    issue(tile1{}, b + 3);
    scale_block(acc, sums1, grp, b + 1, xs, seed, stride);
    compiler_fence();
  }
  const __mmask16 m = static_cast<__mmask16>((1u << valid) - 1u);
#pragma GCC unroll 16
  for (std::size_t t = 0; t < 16; ++t) _mm512_mask_storeu_ps(y + (t0 + t) * ys + r0, m, acc[t]);
}

// The q8_0 acts (blocks, their scales and seeds) of tokens [t0, ...): all
// that the AVX-512 variant's q8_0 rows read.
kernel_acts from_token(const kernel_acts& a, std::size_t t0) noexcept {
  kernel_acts r = a;
  r.xq += t0 * a.xq_stride;
  r.xs += t0 * a.xq_stride;
  r.xseed += t0 * a.xq_stride;
  return r;
}

void rows_fn(const model::weight_view& w, const kernel_acts& a, std::size_t n_tokens, float* y, std::size_t ys,
             std::size_t rb, std::size_t re) {
  const kernel_table& avx512 = kernels_for(isa::avx512);
  const std::size_t n_amx = w.type == model::tensor_type::q8_0 ? n_tokens / tile_tokens * tile_tokens : 0;
  if (n_amx == 0 || re <= rb) return avx512.rows(w, a, n_tokens, y, ys, rb, re);
  const std::size_t nb = w.cols / 32;
  const std::size_t gbytes = q8p_group_bytes(w.cols);
  const std::size_t n_rows = re - rb;
  const std::size_t n_groups = (n_rows + q8p_group_rows - 1) / q8p_group_rows;
  const std::byte* const base = q8p_rows(w, rb, re);
  static thread_local aligned_vector<std::byte> xa_store;
  xa_store.resize(n_amx / tile_tokens * nb * 512);
  std::byte* const xa = xa_store.data();
  for (std::size_t t0 = 0; t0 < n_amx; t0 += tile_tokens) gather_tokens(a, t0, nb, xa + t0 / tile_tokens * nb * 512);
  configure_tiles();
  for (std::size_t g = 0; g < n_groups; ++g) {
    const auto valid = static_cast<unsigned>(std::min<std::size_t>(q8p_group_rows, n_rows - g * q8p_group_rows));
    for (std::size_t t0 = 0; t0 < n_amx; t0 += tile_tokens)
      group_tokens(base + g * gbytes, valid, nb, a, t0, xa + t0 / tile_tokens * nb * 512, y, ys,
                   rb + g * q8p_group_rows, t0 == 0 && g + 1 < n_groups ? base + (g + 1) * gbytes : nullptr);
  }
  _tile_release();  // the kernel need not save tile state across a switch
  if (n_amx < n_tokens) avx512.rows(w, from_token(a, n_amx), n_tokens - n_amx, y + n_amx * ys, ys, rb, re);
}

// The roofline probe: the kernel's multiply, 16 tokens × 16 rows × one
// 32-byte block (K = 32: q8_0's block, half a tile), on four accumulators;
// floats are the AVX-512 variant's.
std::uint64_t peak_fn(peak_op op, std::uint64_t rounds) {
  if (op != peak_op::int8_dot) return kernels_for(isa::avx512).peak(op, rounds);
  tile_config c;
  for (int t : {0, 1, 4, 7}) c.rows[t] = 16, c.colsb[t] = 64;
  for (int t : {2, 5}) c.rows[t] = 16, c.colsb[t] = 32;
  for (int t : {3, 6}) c.rows[t] = 8, c.colsb[t] = 64;
  alignas(64) static const std::byte operands[1024]{};
  compiler_fence();
  _tile_loadconfig(&c);
  _tile_loadd(2, operands, 32);
  _tile_loadd(5, operands, 32);
  _tile_loadd(3, operands, 64);
  _tile_loadd(6, operands, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(4);
  _tile_zero(7);
  for (std::uint64_t r = 0; r < rounds; ++r) {
    _tile_dpbsud(0, 2, 3);
    _tile_dpbsud(1, 5, 6);
    _tile_dpbsud(4, 2, 6);
    _tile_dpbsud(7, 5, 3);
  }
  alignas(64) std::int32_t out[16][16];
  _tile_stored(0, out, 64);
  compiler_fence();
  __asm__ volatile("" : : "r"(out[0][0]) : "memory");
  _tile_release();
  return rounds * 4 * 16 * 16 * 32;
}

}  // namespace

// The AVX-512 variant's table with q8_0's rows on tiles; built on first use
// (kernels_avx512::table is another translation unit's object).
const kernel_table& table() noexcept {
  static const kernel_table t = [] {
    kernel_table k = kernels_for(isa::avx512);
    k.id = isa::amx;
    k.rows = rows_fn;
    k.peak = peak_fn;
    return k;
  }();
  return t;
}

}  // namespace exa::engine::kernels_amx

#pragma GCC pop_options
