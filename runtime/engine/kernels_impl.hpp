// The engine's kernels, written once for every instruction-set variant. Not a
// normal header: only kernels_<isa>.cpp include it, after their own includes,
// inside `#pragma GCC target(...)` for their ISA, with EXA_K_NS naming the
// variant's namespace and exactly one of EXA_K_SCALAR / EXA_K_AVX2 /
// EXA_K_AVX512 defined (the AVX-VNNI variant is EXA_K_AVX2 plus EXA_K_AVXVNNI). Everything defined here lives in that namespace, so
// the variants never share an inline function (which the linker could
// otherwise merge into the wrong ISA's copy).
//
// The contract that makes the variants agree bitwise, element by element:
//  - float dot products run 16 logical lanes: lane l accumulates products
//    k ≡ l (mod 16) with one fused multiply-add each, in k order; then one
//    fixed tree sums the lanes (l + l+8, then + 4, + 2, + 1); then the tail
//    elements follow with fused multiply-adds in order. AVX-512 holds the 16
//    lanes in one register, AVX2 in two, scalar code in an array with fmaf.
//  - q8_0 weights × q8_0 activations: an exact integer sum per 32-element
//    block, then one float step per block in order (q8p below).
//  - q4_0 weights × q8_0 activations: per step of two 32-element blocks,
//    lane l (of 16) takes the exact integer sum of 4 products (elements
//    4l..4l+3 of block 2s for l < 8, of block 2s+1 for l ≥ 8), then
//    acc_l = fma(float(isum) · d_w, d_x, acc_l); a missing odd block counts
//    as zeros; then the same tree.
//  - K-quants and Q4_1/Q5_0/Q5_1: exact integer sums per (super-)block, then
//    one scalar float step per block in order (kquant_dot.hpp, legacy_dot.hpp).
// Nothing here reassociates floating point; the build has -ffp-contract=off.

#if !defined(EXA_K_NS) || (defined(EXA_K_SCALAR) + defined(EXA_K_AVX2) + defined(EXA_K_AVX512)) != 1
#error "include kernels_impl.hpp only from kernels_<isa>.cpp"
#endif

#if defined(EXA_K_AVX2) || defined(EXA_K_AVX512)
#define EXA_K_HAS_AVX2 1
#endif

#include "engine/even_tiles.hpp"
#include "engine/row_blocks.hpp"

namespace exa::engine::EXA_K_NS {

using model::block_q4_0;
using model::block_q4_1;
using model::block_q4_K;
using model::block_q5_0;
using model::block_q5_1;
using model::block_q5_K;
using model::block_q6_K;
using model::block_q8_0;
using model::block_q8_1;
using model::block_q8_K;
using model::tensor_type;

// ================================================================ 16 float lanes

#if defined(EXA_K_AVX512)

struct v16 {
  __m512 v;
};
inline v16 vzero() noexcept { return {_mm512_setzero_ps()}; }
inline v16 vsplat(float x) noexcept { return {_mm512_set1_ps(x)}; }
inline v16 vload(const float* p) noexcept { return {_mm512_loadu_ps(p)}; }
inline void vstore(float* p, v16 a) noexcept { _mm512_storeu_ps(p, a.v); }
inline v16 vfma(v16 a, v16 b, v16 c) noexcept { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline v16 vload_f16(const std::uint16_t* p) noexcept {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
inline v16 vload_bf16(const std::uint16_t* p) noexcept {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(wide, 16))};
}
// Keeps a loaded vector in registers (see float_tile).
inline void pin(v16& a) noexcept { asm("" : "+v"(a.v)); }

#elif defined(EXA_K_AVX2)

struct v16 {
  __m256 lo, hi;  // lanes 0-7, 8-15
};
inline v16 vzero() noexcept { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline v16 vsplat(float x) noexcept { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline v16 vload(const float* p) noexcept { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void vstore(float* p, v16 a) noexcept {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
inline v16 vfma(v16 a, v16 b, v16 c) noexcept {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline v16 vload_f16(const std::uint16_t* p) noexcept {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
}
// A function, not a lambda: GCC 12 does not give a lambda's body the file's
// `#pragma GCC target`, and warned of the AVX return ABI there.
inline __m256 load_bf16_8(const std::uint16_t* q) noexcept {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
inline v16 vload_bf16(const std::uint16_t* p) noexcept { return {load_bf16_8(p), load_bf16_8(p + 8)}; }
inline void pin(v16& a) noexcept { asm("" : "+x"(a.lo), "+x"(a.hi)); }

#else  // scalar

struct v16 {
  float v[16];
};
inline v16 vzero() noexcept { return v16{}; }
inline v16 vsplat(float x) noexcept {
  v16 r;
  for (float& e : r.v) e = x;
  return r;
}
inline v16 vload(const float* p) noexcept {
  v16 r;
  std::memcpy(r.v, p, sizeof r.v);
  return r;
}
inline void vstore(float* p, v16 a) noexcept { std::memcpy(p, a.v, sizeof a.v); }
inline v16 vfma(v16 a, v16 b, v16 c) noexcept {
  v16 r;
  for (int i = 0; i < 16; ++i) r.v[i] = __builtin_fmaf(a.v[i], b.v[i], c.v[i]);
  return r;
}
inline v16 vload_f16(const std::uint16_t* p) noexcept {
  v16 r;
  for (int i = 0; i < 16; ++i) r.v[i] = model::f16_to_float(p[i]);
  return r;
}
inline v16 vload_bf16(const std::uint16_t* p) noexcept {
  v16 r;
  for (int i = 0; i < 16; ++i) r.v[i] = model::bf16_to_float(p[i]);
  return r;
}
inline void pin(v16&) noexcept {}

#endif

/// a · b + c with one rounding, on every variant.
inline float fma1(float a, float b, float c) noexcept {
#if defined(EXA_K_HAS_AVX2)
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
#else
  return __builtin_fmaf(a, b, c);
#endif
}

/// fp16 → float, exact: F16C where the variant has it (llama.cpp uses a
/// table; a software conversion costs a dozen instructions per scale).
inline float h2f(std::uint16_t h) noexcept {
#if defined(EXA_K_HAS_AVX2)
  return _cvtsh_ss(h);
#else
  return model::f16_to_float(h);
#endif
}

#if defined(EXA_K_HAS_AVX2)
// Lanes 0-7 of the tree: (l + l+4), then (+ 2), then (+ 1).
inline float hsum8(__m256 v) noexcept {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
#endif

#if defined(EXA_K_HAS_AVX2)
// Sum of 8 int32 lanes (exact; integer addition has no order).
inline std::int32_t hsum_i32(__m256i v) noexcept {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
  return _mm_cvtsi128_si32(s);
}
#endif

/// The fixed tree over 16 lanes: l + l+8, then l + l+4, l + l+2, l + l+1.
inline float vhsum(v16 a) noexcept {
#if defined(EXA_K_AVX512)
  const __m256 lo = _mm512_castps512_ps256(a.v);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1));
  return hsum8(_mm256_add_ps(lo, hi));
#elif defined(EXA_K_AVX2)
  return hsum8(_mm256_add_ps(a.lo, a.hi));
#else
  float t[16];
  std::memcpy(t, a.v, sizeof t);
  for (int width = 8; width > 0; width /= 2)
    for (int i = 0; i < width; ++i) t[i] = t[i] + t[i + width];
  return t[0];
#endif
}

#if defined(EXA_K_AVX512)
// vhsum of 16 registers at once, the same additions lane for lane (l + l+8,
// + 4, + 2, + 1), by shuffles that pair the registers instead of a tree per
// register: register v's sum lands in lane 4 · (v % 4) + v / 4.
[[gnu::always_inline]] inline __m512 vhsum16(const __m512 (&a)[16]) noexcept {
  __m512 b[8], c[4], d[2];
  for (int p = 0; p < 8; ++p)  // lanes 0-7: register 2p's l + l+8; 8-15: 2p + 1's
    b[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0xee));
  for (int p = 0; p < 4; ++p)  // quarter j: register 4p + j's l + l+4
    c[p] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * p], b[2 * p + 1], 0x88),
                         _mm512_shuffle_f32x4(b[2 * p], b[2 * p + 1], 0xdd));
  for (int p = 0; p < 2; ++p)  // quarter j: 8p + j's l + l+2, then 8p + 4 + j's
    d[p] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * p], c[2 * p + 1], 0x44),
                         _mm512_shuffle_ps(c[2 * p], c[2 * p + 1], 0xee));
  return _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xdd));
}
/// The lane of vhsum16's result that holds register v's sum.
constexpr int vhsum16_lane(int v) noexcept { return 4 * (v % 4) + v / 4; }
#endif

// fn.template operator()<K>(i) for i = 0, Max, 2·Max, ... over whole chunks
// of n (K = Max), then once for the rest (K = n % Max): a tile's token or
// head count as a compile-time constant.
template <int K, class Fn>
void chunk_rest(std::size_t rest, std::size_t i, Fn& fn) {
  if constexpr (K > 0) {
    if (rest == K) fn.template operator()<K>(i);
    else chunk_rest<K - 1>(rest, i, fn);
  }
}
template <int Max, class Fn>
void in_chunks(std::size_t n, Fn&& fn) {
  std::size_t i = 0;
  for (; i + Max <= n; i += Max) fn.template operator()<Max>(i);
  chunk_rest<Max - 1>(n - i, i, fn);
}

// fn.template operator()<K>(i) over n's tokens in even tiles of at most Max
// (even_tiles.hpp: 32 in tiles of at most 6 runs 6, 6, 5, 5, 5, 5).
template <int Max, class Fn>
void in_even_chunks(std::size_t n, Fn&& fn) {
  const even_tiles e(n, Max);
  for (std::size_t k = 0; k < e.tiles; ++k) chunk_rest<Max>(e.size(k), e.start(k), fn);
}

// ================================================================ float weights

struct f32_row {
  static v16 load(const std::byte* row, std::size_t k) noexcept {
    return vload(reinterpret_cast<const float*>(row) + k);
  }
  static float at(const std::byte* row, std::size_t k) noexcept {
    float v;
    std::memcpy(&v, row + k * 4, 4);
    return v;
  }
};
struct f16_row {
  static v16 load(const std::byte* row, std::size_t k) noexcept {
    return vload_f16(reinterpret_cast<const std::uint16_t*>(row) + k);
  }
  static float at(const std::byte* row, std::size_t k) noexcept {
    std::uint16_t h;
    std::memcpy(&h, row + k * 2, 2);
    return h2f(h);
  }
};
struct bf16_row {
  static v16 load(const std::byte* row, std::size_t k) noexcept {
    return vload_bf16(reinterpret_cast<const std::uint16_t*>(row) + k);
  }
  static float at(const std::byte* row, std::size_t k) noexcept {
    std::uint16_t h;
    std::memcpy(&h, row + k * 2, 2);
    return model::bf16_to_float(h);
  }
};

// Rows handed to a tile: base pointer of row r0 and the row pitch in bytes.
struct row_span {
  const std::byte* base;
  std::size_t pitch;
  std::size_t cols;
  const std::byte* end = nullptr;  // past the last row this call streams through
  const std::byte* row(std::size_t r) const noexcept { return base + r * pitch; }
};

// One token (decode) reads every weight byte once, R rows side by side: R
// short streams inside the same pages, which the hardware prefetcher of the
// Sapphire Rapids host we measured followed poorly. Each step of a tile asks
// for its share of the next tile's bytes (the R rows after it, contiguous),
// spread evenly so the miss buffers never fill in one burst (a burst per row
// block measured 27 % slower). There, q8_0 decode, 1 thread: 26-29 -> 34-38
// tok/s (docs/PERFORMANCE.md; q8_0 has since moved to q8p's packed rows, one
// stream per 16 rows; f32/f16/bf16 and q4_0 decode still run these tiles).
// A hint only: it changes no result, and never reaches past `w.end`.
// (line_prefetch below does the same job for the float tiles; in q4_0's
// decode tile it measured 17 % slower on AVX-512, pairs 0.66-0.92, so both
// stay.)
struct next_tile_prefetch {
  const char* next = nullptr;
  const char* end = nullptr;
  std::size_t per_step = 0;
  next_tile_prefetch(const row_span& w, const std::byte* tile_end, std::size_t tile_bytes, std::size_t steps) noexcept
      : next(reinterpret_cast<const char*>(tile_end)),
        end(reinterpret_cast<const char*>(w.end ? w.end : tile_end)),
        per_step(steps ? (tile_bytes + steps - 1) / steps : 0) {}
  void operator()(std::size_t step) const noexcept {
    const char* p = next + step * per_step;
    const char* stop = std::min(p + per_step, end);
    for (; p < stop; p += 64) __builtin_prefetch(p, 0, 3);
  }
};

// The float tiles' form of it: each line of [from, from + bytes) once (never
// past `w.end`), spread evenly over the tile's k steps. A token tile's share
// of the next row block (prefetch_slice) is a few lines per tile: then most
// steps cost one add and compare, where the byte-spread form above issued a
// prefetch every step, the same line many times over (measured 9 % of f16
// prefill). A tile that ran its first steps, the prefetching ones, as a loop
// of their own had GCC spill the accumulators there.
struct line_prefetch {
  const char* p = nullptr;
  const char* stop = nullptr;
  std::size_t lines = 0, steps = 0, due = 0;  // line j goes at the step where due passes (j + 1) · steps
  line_prefetch(const row_span& w, const std::byte* from, std::size_t bytes, std::size_t k_steps) noexcept
      : line_prefetch(from, bytes, k_steps, w.end) {}
  /// [from, from + bytes), never past `end` when given.
  line_prefetch(const std::byte* from, std::size_t bytes, std::size_t k_steps, const std::byte* end = nullptr) noexcept {
    if (from == nullptr || k_steps == 0) return;
    p = reinterpret_cast<const char*>(from);
    stop = std::min(p + bytes, reinterpret_cast<const char*>(end ? end : from + bytes));
    lines = (bytes + 63) / 64;
    steps = k_steps;
  }
  void step() noexcept {
    for (due += lines; due >= steps && p < stop; due -= steps, p += 64) __builtin_prefetch(p, 0, 3);
  }
};

// One tile: R weight rows × C tokens. Each output is one accumulator chain
// over k in steps of 16, then the tree, then the scalar tail: identical for
// every (R, C), which is the batch-invariance guarantee.
//
// `pf`/`pf_bytes`: bytes to prefetch across the k steps (see prefetch_slice);
// none when pf is null.
template <class Row, int R, int C>
void float_tile(row_span w, std::size_t r0, const float* x, std::size_t x_stride, std::size_t t0, float* y,
                std::size_t y_stride, const std::byte* pf, std::size_t pf_bytes) noexcept {
  const std::size_t k_full = w.cols / 16 * 16;
  const std::byte* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = w.row(r0 + r);
  const float* xs[C];
  for (int c = 0; c < C; ++c) xs[c] = x + (t0 + c) * x_stride;

  v16 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = vzero();
  line_prefetch ahead(w, pf, pf_bytes, k_full / 16);
  for (std::size_t k = 0; k < k_full; k += 16) {
    ahead.step();
    v16 wv[R];
    // Keep every loaded vector in a register: left to itself GCC folds the
    // loads into the FMAs, re-reading each one R or C times, and the loop
    // becomes load-bound.
    for (int r = 0; r < R; ++r) {
      wv[r] = Row::load(rows[r], k);
      if constexpr (C > 1) pin(wv[r]);  // one token uses each weight once: let it fold into the FMA
    }
    for (int c = 0; c < C; ++c) {
      v16 xv = vload(xs[c] + k);
      pin(xv);
      for (int r = 0; r < R; ++r) acc[r][c] = vfma(wv[r], xv, acc[r][c]);
    }
  }
#if defined(EXA_K_AVX512)
  if constexpr (R * C >= 8) {
    // The trees of 16 accumulators at a time (vhsum16): a tree per register
    // was 12 % of the batch tile's time, most of it shuffles on the FMA ports.
    constexpr int n = R * C;
#pragma GCC unroll 2
    for (int g = 0; g < n; g += 16) {
      __m512 group[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i)
        group[i] = g + i < n ? acc[(g + i) / C][(g + i) % C].v : _mm512_setzero_ps();
      alignas(64) float sums[16];
      _mm512_store_ps(sums, vhsum16(group));
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        if (g + i >= n) break;
        const int r = (g + i) / C, c = (g + i) % C;
        float s = sums[vhsum16_lane(i)];
        for (std::size_t k = k_full; k < w.cols; ++k) s = fma1(Row::at(rows[r], k), xs[c][k], s);
        y[(t0 + c) * y_stride + r0 + r] = s;
      }
    }
    return;
  }
#endif
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float s = vhsum(acc[r][c]);
      for (std::size_t k = k_full; k < w.cols; ++k) s = fma1(Row::at(rows[r], k), xs[c][k], s);
      y[(t0 + c) * y_stride + r0 + r] = s;
    }
}

#if defined(EXA_K_AVX2)
// Several tokens on AVX2: lanes 0-7 and 8-15 of every accumulator never meet
// before the tree, so each half runs as its own pass over k (as q256 does for
// q8_0). An accumulator then takes one register instead of two, and a 3 × 4
// tile fits the 16 registers with its weights held: 12 FMAs per 3 weight
// loads and 4 token loads, where the two-register 1 × 4 tile needed 10 loads
// per 8 FMAs and was bound by the loads.
template <class Row>
inline __m256 load8(const std::byte* row, std::size_t k) noexcept;
template <>
inline __m256 load8<f32_row>(const std::byte* row, std::size_t k) noexcept {
  return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k);
}
template <>
inline __m256 load8<f16_row>(const std::byte* row, std::size_t k) noexcept {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const std::uint16_t*>(row) + k)));
}
template <>
inline __m256 load8<bf16_row>(const std::byte* row, std::size_t k) noexcept {
  const __m256i wide = _mm256_cvtepu16_epi32(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const std::uint16_t*>(row) + k)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

template <class Row, int R, int C>
void float_half(const std::byte* const* rows, const float* const* xs, std::size_t k_full, std::size_t h,
                __m256 (&out)[R][C], line_prefetch* ahead) noexcept {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (std::size_t k = 8 * h; k < k_full; k += 16) {
    if (ahead) ahead->step();
    __m256 wv[R];
    for (int r = 0; r < R; ++r) {
      wv[r] = load8<Row>(rows[r], k);
      asm("" : "+x"(wv[r]));  // held for the C tokens, not reloaded per FMA
    }
    for (int c = 0; c < C; ++c) {
      const __m256 xv = _mm256_loadu_ps(xs[c] + k);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(wv[r], xv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r][c] = acc[r][c];
}

template <class Row, int R, int C>
void float_tile_halves(row_span w, std::size_t r0, const float* x, std::size_t x_stride, std::size_t t0, float* y,
                       std::size_t y_stride, const std::byte* pf, std::size_t pf_bytes) noexcept {
  const std::size_t k_full = w.cols / 16 * 16;
  const std::byte* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = w.row(r0 + r);
  const float* xs[C];
  for (int c = 0; c < C; ++c) xs[c] = x + (t0 + c) * x_stride;
  __m256 lo[R][C], hi[R][C];
  line_prefetch ahead(w, pf, pf_bytes, k_full / 16);  // in the first pass only
  float_half<Row, R, C>(rows, xs, k_full, 0, lo, &ahead);
  float_half<Row, R, C>(rows, xs, k_full, 1, hi, nullptr);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float s = vhsum(v16{lo[r][c], hi[r][c]});
      for (std::size_t k = k_full; k < w.cols; ++k) s = fma1(Row::at(rows[r], k), xs[c][k], s);
      y[(t0 + c) * y_stride + r0 + r] = s;
    }
}
#endif

// ================================================================ q4_0 weights

#if defined(EXA_K_AVX512)

// Weight side of one 64-element step for one row: the weights as unsigned
// bytes (vpdpbusd's unsigned operand) and the two scales expanded.
struct wstep {
  __m512i q;
  __m512 d;
};

// [d0 ×8, d1 ×8] from two fp16 scales.
inline __m512 expand_scales(std::uint16_t d0, std::uint16_t d1) noexcept {
  const __m128 pair = _mm_cvtph_ps(_mm_insert_epi16(_mm_cvtsi32_si128(d0), d1, 1));
  const __m512i index = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(index, _mm512_castps128_ps512(pair));
}

// Σ over a lane's 4 bytes of u·x = Σ q·x + offset · Σ x: the seed removes it.
struct q4_0_row {
  using block = block_q4_0;
  static constexpr int seed_shift = 4;  // u = q + 8: seed −8 · Σ x = (−128 · Σ x) / 16
  static wstep load(const block* row, std::size_t b, bool has_second) noexcept {
    const __m128i p0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row[b].qs));
    const __m128i p1 = has_second ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(row[b + 1].qs))
                                  : _mm_setzero_si128();  // against x = 0: contributes 0
    const __m256i packed = _mm256_inserti128_si256(_mm256_castsi128_si256(p0), p1, 1);
    const __m256i mask = _mm256_set1_epi8(0x0f);
    const __m256i lo = _mm256_and_si256(packed, mask);                        // [lo0 | lo1]
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), mask);  // [hi0 | hi1]
    // Element order per block is 16 low nibbles then 16 high nibbles.
    __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);  // [lo0 lo1 hi0 hi1]
    q = _mm512_shuffle_i64x2(q, q, _MM_SHUFFLE(3, 1, 2, 0));            // [lo0 hi0 lo1 hi1]
    return {q, expand_scales(row[b].d, has_second ? row[b + 1].d : std::uint16_t{0})};
  }
};

template <class Row, int R, int C>
void quant_tile(row_span w, std::size_t r0, const kernel_acts& a, std::size_t t0, float* y,
                std::size_t y_stride) noexcept {
  using block = typename Row::block;
  const std::size_t nb = w.cols / 32;
  const block* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = reinterpret_cast<const block*>(w.row(r0 + r));
  const std::uint8_t* xu[C];
  const float* xd[C];
  const std::int32_t* xc[C];
  for (int c = 0; c < C; ++c) {
    xu[c] = a.xu + (t0 + c) * a.xu_stride;
    xd[c] = a.xd + (t0 + c) * a.xd_stride;
    xc[c] = a.xc + (t0 + c) * a.xd_stride;
  }
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (std::size_t b = 0, s = 0; b < nb; b += 2, ++s) {
    wstep ws[R];
    for (int r = 0; r < R; ++r) ws[r] = Row::load(rows[r], b, b + 1 < nb);
    for (int c = 0; c < C; ++c) {
      const __m512i xv = _mm512_loadu_si512(xu[c] + s * 64);
      const __m512 xs = _mm512_loadu_ps(xd[c] + s * 16);
      const __m512i seed = _mm512_srai_epi32(_mm512_loadu_si512(xc[c] + s * 16), Row::seed_shift);
      for (int r = 0; r < R; ++r) {
        const __m512i sum = _mm512_dpbusd_epi32(seed, ws[r].q, xv);
        const __m512 scaled = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), ws[r].d);
        acc[r][c] = _mm512_fmadd_ps(scaled, xs, acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[(t0 + c) * y_stride + r0 + r] = vhsum(v16{acc[r][c]});
}

#elif defined(EXA_K_AVX2)

// The 256-bit kernel below (q256) is the AVX2 variant's.

#else  // scalar

struct q4_0_row {
  using block = block_q4_0;
  static int value(const block& b, int i) noexcept {
    const int nib = i < 16 ? (b.qs[i] & 0x0f) : (b.qs[i - 16] >> 4);
    return nib - 8;
  }
};

template <class Row, int R, int C>
void quant_tile(row_span w, std::size_t r0, const kernel_acts& a, std::size_t t0, float* y,
                std::size_t y_stride) noexcept {
  using block = typename Row::block;
  const std::size_t nb = w.cols / 32;
  for (int r = 0; r < R; ++r) {
    const auto* row = reinterpret_cast<const block*>(w.row(r0 + r));
    for (int c = 0; c < C; ++c) {
      const block_q8_0* x = a.xq + (t0 + c) * a.xq_stride;
      v16 acc = vzero();
      for (std::size_t b = 0; b < nb; b += 2) {
        for (int l = 0; l < 16; ++l) {
          const std::size_t blk = b + static_cast<std::size_t>(l / 8);
          float scaled = 0.0f, d_x = 0.0f;
          if (blk < nb) {
            int isum = 0;
            for (int i = 4 * (l % 8); i < 4 * (l % 8) + 4; ++i) isum += Row::value(row[blk], i) * x[blk].qs[i];
            scaled = static_cast<float>(isum) * h2f(row[blk].d);
            d_x = h2f(x[blk].d);
          }
          acc.v[l] = __builtin_fmaf(scaled, d_x, acc.v[l]);
        }
      }
      y[(t0 + c) * y_stride + r0 + r] = vhsum(acc);
    }
  }
}

#endif

#if defined(EXA_K_HAS_AVX2)
// The 256-bit q4_0 kernel: the AVX2 variant's for every tile, and the
// AVX-512 variant's for one token (decode), where per-row latency rather than
// width bounds the GEMV and 256-bit steps with more rows in flight win. Same
// lanes, same operations: bitwise the AVX-512 tile's results.
namespace q256 {

// The 16-lane tree (vhsum) over lanes 0-7 in `lo` and 8-15 in `hi`.
inline float tree16(__m256 lo, __m256 hi) noexcept { return hsum8(_mm256_add_ps(lo, hi)); }

// maddubs multiplies unsigned by signed bytes: |w| (once per row and block)
// against x carrying w's sign (per token). |w| ≤ 128 reads correctly as
// unsigned and |x| ≤ 127, so the int16 pair sums cannot saturate; madd with
// ones then gives 8 exact int32 sums of 4 products (lane j: bytes 4j..4j+3).
// With AVX-512 VNNI (VL) one vpdpbusd on ymm gives the same exact sums.
inline __m256i dot_i8x32(__m256i abs_w, __m256i w, __m256i x) noexcept {
#if defined(EXA_K_AVX512)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), abs_w, _mm256_sign_epi8(x, w));
#elif defined(EXA_K_AVXVNNI)  // AVX-VNNI (Alder Lake, Zen 4): the same instruction, VEX-encoded
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), abs_w, _mm256_sign_epi8(x, w));
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1));
#endif
}

struct q4_0_row {
  using block = block_q4_0;
  static __m256i load(const block& b) noexcept {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
    const __m128i mask = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(packed, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
    return _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8));
  }
};

// One half of the 16 lanes: lanes 0-7 take blocks 0, 2, 4, ... (h = 0),
// lanes 8-15 blocks 1, 3, 5, ... (h = 1). The halves never meet until the
// final tree, so they can be computed together (decode: every weight byte
// read once) or one after the other (more tokens: twice the tiles fit the 16
// registers, and the second pass finds the row block in cache).
// The weight blocks' scales as floats for the rows of the row block being
// multiplied (rows() fills it once per row block when several tokens will
// read it): a broadcast load per row and block instead of a conversion.
struct row_scales {
  std::vector<float> d;  // (row − first) · nb + block
  std::size_t first = 0;
  std::size_t nb = 0;
};
inline thread_local row_scales tl_row_scales;

template <class Row, int R, int C>
void quant_half(const typename Row::block* const* rows, const block_q8_0* const* xs, const float* const* xsc,
                const float* const* wsc, std::size_t nb, int h, __m256 (&out)[R][C]) noexcept {
  // Local accumulators (not `out`, which would stay in memory). Registers:
  // R·C accumulators, each row's |w| and scale, one token's bytes and scale
  // at a time, and a temporary; w itself is kept unpacked per row (q4_0,
  // whose unpacking is not free).
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (std::size_t b = static_cast<std::size_t>(h); b < nb; b += 2) {
    __m256i aw[R];
    __m256 wd[R];
    __m256i wv[R];
    for (int r = 0; r < R; ++r) {
      const __m256i w = Row::load(rows[r][b]);
      wv[r] = w;
      aw[r] = _mm256_sign_epi8(w, w);
      wd[r] = _mm256_broadcast_ss(wsc[r] + b);
    }
    for (int c = 0; c < C; ++c) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[c][b].qs));
      const __m256 xd = _mm256_broadcast_ss(xsc[c] + b);
      for (int r = 0; r < R; ++r) {
        const __m256 scaled = _mm256_mul_ps(_mm256_cvtepi32_ps(dot_i8x32(aw[r], wv[r], xv)), wd[r]);
        acc[r][c] = _mm256_fmadd_ps(scaled, xd, acc[r][c]);
      }
    }
  }
  // An odd block count: the AVX-512 kernel's last step adds fma(0, 0, acc)
  // for the missing block. That is the identity here (acc starts at +0 and
  // a sum is -0 only when both terms are), so it is left out: kept, it made
  // GCC hold the accumulators in memory as well, a store per FMA.
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r][c] = acc[r][c];
}

template <class Row, int R, int C>
void quant_tile(row_span w, std::size_t r0, const kernel_acts& a, std::size_t t0, float* y,
                std::size_t y_stride) noexcept {
  using block = typename Row::block;
  const std::size_t nb = w.cols / 32;
  const block* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = reinterpret_cast<const block*>(w.row(r0 + r));
  const block_q8_0* xs[C];
  const float* xsc[C];
  for (int c = 0; c < C; ++c) {
    xs[c] = a.xq + (t0 + c) * a.xq_stride;
    xsc[c] = a.xs + (t0 + c) * a.xq_stride;
  }
  if constexpr (C >= 2) {
    const row_scales& sc = tl_row_scales;
    const float* wsc[R];
    for (int r = 0; r < R; ++r) wsc[r] = sc.d.data() + (r0 + r - sc.first) * nb;
    __m256 lo[R][C], hi[R][C];
    quant_half<Row, R, C>(rows, xs, xsc, wsc, nb, 0, lo);
    quant_half<Row, R, C>(rows, xs, xsc, wsc, nb, 1, hi);
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) y[(t0 + c) * y_stride + r0 + r] = tree16(lo[r][c], hi[r][c]);
  } else {
    // One token (decode): both halves in one pass, each weight byte read once
    // while it streams in from memory.
    __m256 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    const next_tile_prefetch ahead(w, w.row(r0 + R), R * w.pitch, (nb + 1) / 2);
    const auto step = [&](std::size_t b, int h) {
      if (h == 0) ahead(b / 2);
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[0][b].qs));
      const __m256 xd = _mm256_broadcast_ss(xsc[0] + b);
      for (int r = 0; r < R; ++r) {
        const __m256i wv = Row::load(rows[r][b]);
        const __m256i prod = dot_i8x32(_mm256_sign_epi8(wv, wv), wv, xv);
        const __m256 scaled = _mm256_mul_ps(_mm256_cvtepi32_ps(prod), _mm256_set1_ps(h2f(rows[r][b].d)));
        acc[r][h] = _mm256_fmadd_ps(scaled, xd, acc[r][h]);
      }
    };
    std::size_t b = 0;
    for (; b + 2 <= nb; b += 2) {  // constant half indices keep acc in registers
      step(b, 0);
      step(b + 1, 1);
    }
    if (b < nb) step(b, 0);
    if (nb % 2 == 1)  // the missing odd block, as in quant_half
      for (int r = 0; r < R; ++r) acc[r][1] = _mm256_fmadd_ps(_mm256_setzero_ps(), _mm256_setzero_ps(), acc[r][1]);
    for (int r = 0; r < R; ++r) y[t0 * y_stride + r0 + r] = tree16(acc[r][0], acc[r][1]);
  }
}

}  // namespace q256
#endif

#if defined(EXA_K_AVX2)
using q256::q4_0_row;
using q256::quant_tile;
#endif

// ============================================================ q8_0 weights
// The q8_0 contract, on every variant: y[t][r] is s after blocks b = 0, 1, ...,
// nb − 1 in order, from s = +0:
//   s = fma(float(isum), d_w · d_x, s),  isum = Σ_{i<32} w_i · x_i exactly,
// with d_w · d_x one float product (the K-quants' and Q5_0's step). The
// scalar variant reads the file's rows; the others read the rows packed in
// groups of 16 (q8_pack.hpp), one register lane per row, and broadcast each
// token's 4 bytes at a time: an exact integer sum per block, and one float
// step per block for 16 rows at once.


namespace q8p {

// One token (decode) streams each group once: asking for the block 4 ahead
// (2 KiB) measured, 1 thread on the Sapphire Rapids host, AVX-512 40-42 tok/s
// against 33-38 without (2, 8 and 16 ahead: less), AVX2 39-40 against 35-36.
// A hint: it changes no result (and a prefetch past the end never faults).
constexpr std::size_t decode_prefetch_blocks = 4;
// The block `blocks` after `blk`, which may lie past the buffer's end (so
// the address is formed as an integer).
inline void prefetch_block(const std::byte* blk, std::size_t blocks) noexcept {
  const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(blk) + blocks * q8p_block_bytes;
  for (std::uintptr_t l = 0; l < 9; ++l) _mm_prefetch(reinterpret_cast<const char*>(at + 64 * l), _MM_HINT_T0);
}


#if !defined(EXA_K_HAS_AVX2)

inline void rows(const model::weight_view& w, const kernel_acts& a, std::size_t n_tokens, float* y,
                 std::size_t ys, std::size_t rb, std::size_t re) noexcept {
  const std::size_t nb = w.cols / 32;
  for (std::size_t r = rb; r < re; ++r) {
    const auto* row = reinterpret_cast<const block_q8_0*>(w.row(r));
    for (std::size_t t = 0; t < n_tokens; ++t) {
      const block_q8_0* x = a.xq + t * a.xq_stride;
      const float* xs = a.xs + t * a.xq_stride;
      float s = 0.0f;
      for (std::size_t b = 0; b < nb; ++b) {
        std::int32_t isum = 0;
        for (int i = 0; i < 32; ++i) isum += row[b].qs[i] * x[b].qs[i];
        s = fma1(static_cast<float>(isum), h2f(row[b].d) * xs[b], s);
      }
      y[t * ys + r] = s;
    }
  }
}

#else

inline std::int32_t load4(const std::int8_t* p) noexcept {
  std::int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// A tile's tokens: token t0 + c's q8_0 blocks, their scales and seeds.
template <int C>
struct token_rows {
  const block_q8_0* x[C];
  const float* xs[C];
  const std::int32_t* seed[C];
  token_rows(const kernel_acts& a, std::size_t t0) noexcept {
    for (int c = 0; c < C; ++c) {
      x[c] = a.xq + (t0 + c) * a.xq_stride;
      xs[c] = a.xs + (t0 + c) * a.xq_stride;
      seed[c] = a.xseed + (t0 + c) * a.xq_stride;
    }
  }
};

#if defined(EXA_K_AVX512)

// G groups of 16 rows × C tokens. `grp[g]` is group g's first block; `valid`
// its rows that exist (16 but in a matrix's last group).
//
// `pf`, `pf_bytes`: this token tile's share of the next G groups' bytes,
// prefetched a few lines a block (line_prefetch) while its own weights come
// from cache; none when pf is null.
template <int G, int C>
void tile(const std::byte* const* grp, const unsigned* valid, std::size_t nb, const kernel_acts& a,
          std::size_t t0, float* y, std::size_t ys, std::size_t r0, const std::byte* pf = nullptr,
          std::size_t pf_bytes = 0) noexcept {
  const token_rows<C> tok(a, t0);
  line_prefetch ahead(pf, pf_bytes, nb);
  __m512 acc[G][C];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) acc[g][c] = _mm512_setzero_ps();
  for (std::size_t b = 0; b < nb; ++b) {
    __m512i is[G][C];
    for (int c = 0; c < C; ++c) {
      const __m512i sd = _mm512_set1_epi32(tok.seed[c][b]);
      for (int g = 0; g < G; ++g) is[g][c] = sd;
    }
    if constexpr (C == 1)
      prefetch_block(grp[0] + b * q8p_block_bytes, decode_prefetch_blocks);
    else
      ahead.step();
    for (int j = 0; j < 8; ++j) {
      __m512i wv[G];
      for (int g = 0; g < G; ++g) wv[g] = _mm512_loadu_si512(grp[g] + b * q8p_block_bytes + 64 * j);
      for (int c = 0; c < C; ++c) {
        const __m512i xb = _mm512_set1_epi32(load4(tok.x[c][b].qs + 4 * j));
        for (int g = 0; g < G; ++g) is[g][c] = _mm512_dpbusd_epi32(is[g][c], wv[g], xb);
      }
    }
    for (int g = 0; g < G; ++g) {
      const __m512 dw = _mm512_cvtph_ps(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(grp[g] + b * q8p_block_bytes + q8p_quant_bytes)));
      for (int c = 0; c < C; ++c)
        acc[g][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[g][c]), _mm512_mul_ps(dw, _mm512_set1_ps(tok.xs[c][b])),
                                    acc[g][c]);
    }
  }
  for (int g = 0; g < G; ++g) {
    const __mmask16 m = static_cast<__mmask16>((1u << valid[g]) - 1u);
    for (int c = 0; c < C; ++c) _mm512_mask_storeu_ps(y + (t0 + c) * ys + r0 + 16 * g, m, acc[g][c]);
  }
}

constexpr int max_groups = 2;
constexpr int max_tokens = 6;
constexpr std::size_t prefetch_shares = 6;  // token tiles that prefetch the next groups: a batch of 32's all
constexpr int decode_groups = 1;

#else  // AVX2, AVX-VNNI: 8 rows per register, half h of a group at bytes 32h

// H halves (1 or 2, of one group) × C tokens. `pf`, `pf_bytes`: a share of
// the next group's bytes to prefetch over the blocks, as on AVX-512.
template <int H, int C>
void tile(const std::byte* grp, int h0, const unsigned* valid, std::size_t nb, const kernel_acts& a,
          std::size_t t0, float* y, std::size_t ys, std::size_t r0, const std::byte* pf = nullptr,
          std::size_t pf_bytes = 0) noexcept {
  const token_rows<C> tok(a, t0);
  line_prefetch ahead(pf, pf_bytes, nb);
  __m256 acc[H][C];
  for (int h = 0; h < H; ++h)
    for (int c = 0; c < C; ++c) acc[h][c] = _mm256_setzero_ps();
  for (std::size_t b = 0; b < nb; ++b) {
    const std::byte* blk = grp + b * q8p_block_bytes;
    if constexpr (C == 1)
      prefetch_block(blk, decode_prefetch_blocks);
    else
      ahead.step();
    __m256i is[H][C];
    for (int c = 0; c < C; ++c) {
#if defined(EXA_K_AVXVNNI)
      const __m256i sd = _mm256_set1_epi32(tok.seed[c][b]);
#else
      const __m256i sd = _mm256_setzero_si256();
#endif
      for (int h = 0; h < H; ++h) is[h][c] = sd;
    }
    for (int j = 0; j < 8; ++j) {
      __m256i u[H];
      [[maybe_unused]] __m256i sw[H], aw[H];
      for (int h = 0; h < H; ++h) {
        u[h] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * j + 32 * (h0 + h)));
#if !defined(EXA_K_AVXVNNI)
        // maddubs multiplies unsigned by signed bytes: |w| against x carrying
        // w's sign (|w| ≤ 128, |x| ≤ 127: the int16 pair sums cannot saturate).
        sw[h] = _mm256_xor_si256(u[h], _mm256_set1_epi8(static_cast<char>(0x80)));
        aw[h] = _mm256_sign_epi8(sw[h], sw[h]);
#endif
      }
      for (int c = 0; c < C; ++c) {
        const __m256i xb = _mm256_set1_epi32(load4(tok.x[c][b].qs + 4 * j));
        for (int h = 0; h < H; ++h) {
#if defined(EXA_K_AVXVNNI)
          is[h][c] = _mm256_dpbusd_avx_epi32(is[h][c], u[h], xb);
#else
          const __m256i pairs = _mm256_maddubs_epi16(aw[h], _mm256_sign_epi8(xb, sw[h]));
          is[h][c] = _mm256_add_epi32(is[h][c], _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
#endif
        }
      }
    }
    for (int h = 0; h < H; ++h) {
      const __m256 dw = _mm256_cvtph_ps(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + q8p_quant_bytes + 16 * (h0 + h))));
      for (int c = 0; c < C; ++c)
        acc[h][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[h][c]), _mm256_mul_ps(dw, _mm256_set1_ps(tok.xs[c][b])),
                                    acc[h][c]);
    }
  }
  for (int h = 0; h < H; ++h) {
    const int live = static_cast<int>(valid[0]) - 8 * (h0 + h);
    if (live <= 0) continue;
    for (int c = 0; c < C; ++c) {
      float* out = y + (t0 + c) * ys + r0 + 8 * (h0 + h);
      if (live >= 8) {
        _mm256_storeu_ps(out, acc[h][c]);
      } else {
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(live), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        _mm256_maskstore_ps(out, m, acc[h][c]);
      }
    }
  }
}

constexpr int max_tokens = 4;
constexpr std::size_t prefetch_shares = 8;  // a batch of 32's token tiles

#endif

// With few token tiles per group (batched decode) the weights stream from
// memory once per step: the next groups (after these in memory, `span`
// bytes) are prefetched while these run, each token tile taking an even
// share of their bytes, spread over its blocks (line_prefetch). All of it in
// the first tile, 18 prefetches a block on AVX-512, stalled on full miss
// buffers: a fifth of the batch-32 tile's samples sat on its prefetch
// instructions. A prefill's many tiles: the first few share it. The tiles
// are even (in_even_chunks), so only a lone token runs the decode tile, which
// does not prefetch the next groups.
struct next_groups {
  const std::byte* next = nullptr;
  std::size_t span = 0, shares = 1;
  even_tiles tiles;  // the token tiles (in_even_chunks); one token alone is the decode tile
  next_groups(const std::byte* after, std::size_t span_bytes, std::size_t n_tokens) noexcept
      : next(n_tokens > 1 ? after : nullptr), span(span_bytes), tiles(n_tokens, max_tokens) {
    shares = std::max<std::size_t>(1, std::min(tiles.tiles, prefetch_shares));
  }
  /// The share of the token tile that starts at token t: its first byte
  /// (null for none) and its length.
  std::pair<const std::byte*, std::size_t> share(std::size_t t) const noexcept {
    const std::size_t k = tiles.index(t);
    if (next == nullptr || k >= shares) return {nullptr, 0};
    const std::size_t from = span * k / shares, to = span * (k + 1) / shares;
    return {next + from, to - from};
  }
};

// Runs even token tiles (in_even_chunks) over groups [g0, g0 + G).
template <int G>
void groups(const std::byte* base, std::size_t gbytes, std::size_t g0, std::size_t n_rows, std::size_t nb,
            const kernel_acts& a, std::size_t n_tokens, float* y, std::size_t ys, std::size_t rb) noexcept {
  const std::byte* grp[G];
  unsigned valid[G];
  for (int g = 0; g < G; ++g) {
    grp[g] = base + (g0 + g) * gbytes;
    const std::size_t first = (g0 + g) * q8p_group_rows;
    valid[g] = static_cast<unsigned>(std::min<std::size_t>(q8p_group_rows, n_rows - first));
  }
  const std::size_t r0 = rb + g0 * q8p_group_rows;
  const std::size_t n_groups = (n_rows + q8p_group_rows - 1) / q8p_group_rows;
  const next_groups ahead(g0 + 2 * G <= n_groups ? grp[G - 1] + gbytes : nullptr, G * gbytes, n_tokens);
#if defined(EXA_K_AVX512)
  const auto run = [&]<int C>(std::size_t t) {
    const auto [pf, pf_bytes] = ahead.share(t);
    tile<G, C>(grp, valid, nb, a, t, y, ys, r0, pf, pf_bytes);
  };
#else
  static_assert(G == 1);
  const auto run = [&]<int C>(std::size_t t) {
    if constexpr (C == 1) {
      tile<2, 1>(grp[0], 0, valid, nb, a, t, y, ys, r0);  // one token: each weight byte read once
    } else {
      const auto [pf, pf_bytes] = ahead.share(t);  // the first half's pass takes the tile's share
      tile<1, C>(grp[0], 0, valid, nb, a, t, y, ys, r0, pf, pf_bytes);
      if (valid[0] > 8) tile<1, C>(grp[0], 1, valid, nb, a, t, y, ys, r0);
    }
  };
#endif
  in_even_chunks<max_tokens>(n_tokens, run);
}

// Packed rows [rb, re): the weight's own copy when it has one and rb starts a
// group, else packed here for this call.
inline void rows(const model::weight_view& w, const kernel_acts& a, std::size_t n_tokens, float* y,
                 std::size_t ys, std::size_t rb, std::size_t re) {
  const std::size_t nb = w.cols / 32;
  const std::size_t gbytes = q8p_group_bytes(w.cols);
  const std::size_t n_rows = re - rb;
  const std::size_t n_groups = (n_rows + q8p_group_rows - 1) / q8p_group_rows;
  const std::byte* const base = q8p_rows(w, rb, re);
  std::size_t g = 0;
#if defined(EXA_K_AVX512)
  if (n_tokens > 1)
    for (; g + max_groups <= n_groups; g += max_groups)
      groups<max_groups>(base, gbytes, g, n_rows, nb, a, n_tokens, y, ys, rb);
#endif
  for (; g < n_groups; ++g) groups<1>(base, gbytes, g, n_rows, nb, a, n_tokens, y, ys, rb);
}

#endif

}  // namespace q8p

// ================================================================ K-quants

namespace kq {

// Integer results of one super-block: sum_q = Σ_sub scale·Σ q·x, and for
// Q4_K/Q5_K sum_m = Σ_sub min·Σ x (from bsums). Both exact in int32: at most
// 63·31·127·256 ≈ 6.4e7 for Q5_K and 127·63·127·256 ≈ 2.6e8 for Q6_K.
struct block_sums {
  std::int32_t sum_q = 0;
  std::int32_t sum_m = 0;
};

// The float step, shared by every path so that all of them round alike.
inline float scale_min_step(float s, block_sums b, float d_w, float dmin_w, float d_x) noexcept {
  s = fma1(static_cast<float>(b.sum_q), d_w * d_x, s);
  return fma1(static_cast<float>(-b.sum_m), dmin_w * d_x, s);
}

inline float scale_step(float s, std::int32_t sum_q, float d_w, float d_x) noexcept {
  return fma1(static_cast<float>(sum_q), d_w * d_x, s);
}

#if !defined(EXA_K_HAS_AVX2)

// Σ_sub m_sub · (bsum of its 32 elements): the part of Q4_K/Q5_K's dot
// product the mins contribute.
inline std::int32_t mins_sum(const std::uint8_t* scales, const block_q8_K& x) noexcept {
  std::int32_t sum = 0;
  for (int j = 0; j < 8; ++j) {
    std::uint8_t sc, m;
    model::scale_min_k4(j, scales, sc, m);
    sum += m * (x.bsums[2 * j] + x.bsums[2 * j + 1]);
  }
  return sum;
}

// Q4_K and Q5_K differ only in the fifth bit; `qh` is null for Q4_K.
inline block_sums sums_scale_min(const std::uint8_t* scales, const std::uint8_t* qs, const std::uint8_t* qh,
                                 const block_q8_K& x) noexcept {
  block_sums out;
  for (int c = 0; c < 4; ++c) {
    std::int32_t lo = 0, hi = 0;
    for (int l = 0; l < 32; ++l) {
      int q_lo = qs[32 * c + l] & 0x0f;
      int q_hi = qs[32 * c + l] >> 4;
      if (qh != nullptr) {
        q_lo |= ((qh[l] >> (2 * c)) & 1) << 4;
        q_hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
      }
      lo += q_lo * x.qs[64 * c + l];
      hi += q_hi * x.qs[64 * c + 32 + l];
    }
    std::uint8_t sc, m;
    model::scale_min_k4(2 * c, scales, sc, m);
    out.sum_q += sc * lo;
    model::scale_min_k4(2 * c + 1, scales, sc, m);
    out.sum_q += sc * hi;
  }
  out.sum_m = mins_sum(scales, x);
  return out;
}

inline std::int32_t sum_q6_K(const block_q6_K& w, const block_q8_K& x) noexcept {
  std::int32_t group[16] = {};
  for (int h = 0; h < 2; ++h) {
    const std::uint8_t* ql = w.ql + 64 * h;
    const std::uint8_t* qh = w.qh + 32 * h;
    const std::int8_t* xq = x.qs + 128 * h;
    for (int l = 0; l < 32; ++l) {
      const int q1 = static_cast<int>((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = static_cast<int>((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = static_cast<int>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = static_cast<int>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      const int is = 8 * h + l / 16;
      group[is + 0] += q1 * xq[l];
      group[is + 2] += q2 * xq[l + 32];
      group[is + 4] += q3 * xq[l + 64];
      group[is + 6] += q4 * xq[l + 96];
    }
  }
  std::int32_t sum = 0;
  for (int i = 0; i < 16; ++i) sum += w.scales[i] * group[i];
  return sum;
}

template <class Block>
void dot_scale_min_tokens(const std::byte* row, const block_q8_K* x, std::size_t x_stride, std::size_t n_tokens,
                          std::size_t nb, float* y, std::size_t y_stride) noexcept {
  const auto* w = reinterpret_cast<const Block*>(row);
  for (std::size_t t = 0; t < n_tokens; ++t) {
    const block_q8_K* xt = x + t * x_stride;
    float s = 0.0f;
    for (std::size_t b = 0; b < nb; ++b) {
      const std::uint8_t* qh = nullptr;
      if constexpr (requires { w[b].qh; }) qh = w[b].qh;
      const block_sums bs = sums_scale_min(w[b].scales, w[b].qs, qh, xt[b]);
      s = scale_min_step(s, bs, h2f(w[b].d), h2f(w[b].dmin), xt[b].d);
    }
    y[t * y_stride] = s;
  }
}

inline void dot_q6_K_tokens(const std::byte* row, const block_q8_K* x, std::size_t x_stride, std::size_t n_tokens,
                            std::size_t nb, float* y, std::size_t y_stride) noexcept {
  const auto* w = reinterpret_cast<const block_q6_K*>(row);
  for (std::size_t t = 0; t < n_tokens; ++t) {
    const block_q8_K* xt = x + t * x_stride;
    float s = 0.0f;
    for (std::size_t b = 0; b < nb; ++b) s = scale_step(s, sum_q6_K(w[b], xt[b]), h2f(w[b].d), xt[b].d);
    y[t * y_stride] = s;
  }
}

inline void row_tokens(tensor_type type, const std::byte* row, const block_q8_K* x, std::size_t x_stride,
                       std::size_t n_tokens, std::size_t nb, float* y, std::size_t y_stride) noexcept {
  switch (type) {
    case tensor_type::q4_K: return dot_scale_min_tokens<block_q4_K>(row, x, x_stride, n_tokens, nb, y, y_stride);
    case tensor_type::q5_K: return dot_scale_min_tokens<block_q5_K>(row, x, x_stride, n_tokens, nb, y, y_stride);
    default: return dot_q6_K_tokens(row, x, x_stride, n_tokens, nb, y, y_stride);
  }
}

#else  // AVX2 (also what the AVX-512 variant runs for K-quants)

inline __m256i load32(const void* p) noexcept { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// maddubs (u8 × s8, adjacent pairs; no saturation: |q| ≤ 63, |x| ≤ 128) then
// madd with the 16-bit scales `sc` (pairs again) gives 8 exact int32 lanes.
inline __m256i scaled_dot(__m256i q_u8, __m256i x_s8, __m256i sc) noexcept {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(q_u8, x_s8), sc);
}

// A Q4_K/Q5_K super-block unpacked once and multiplied with several tokens:
// sub-block j's 32 values (unsigned, 0..31) and its integer scale and min.
struct unpacked_scale_min {
  __m256i q[8];
  __m256i m_pairs;  // int16: m_j at lanes 2j and 2j + 1, to meet bsums[2j], bsums[2j + 1]
  std::int16_t sc[8];
  float d, dmin;

  template <class Block>
  explicit unpacked_scale_min(const Block& w) noexcept {
    const __m256i nib = _mm256_set1_epi8(0x0f);
    for (int c = 0; c < 4; ++c) {
      const __m256i packed = load32(w.qs + 32 * c);
      q[2 * c] = _mm256_and_si256(packed, nib);
      q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nib);
    }
    if constexpr (requires { w.qh; }) {
      // Bit 2c (2c + 1) of each qh byte is the fifth bit of sub-block 2c (2c + 1).
      const __m256i one = _mm256_set1_epi8(1);
      const __m256i bits = load32(w.qh);
      for (int j = 0; j < 8; ++j) {
        const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(bits, j), one);
        q[j] = _mm256_or_si256(q[j], _mm256_slli_epi16(hb, 4));
      }
    }
    // scale_min_k4 on 32-bit words: bytes 0-3 hold sc0-3 (low 6 bits) and
    // the top bits of sc4-7; bytes 4-7 likewise for the mins; bytes 8-11 the
    // low nibbles of sc4-7 (low) and m4-7 (high).
    std::uint32_t word[3];
    std::memcpy(word, w.scales, sizeof word);
    const std::uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, low2 = 0x03030303;
    const std::uint32_t sc_words[2] = {word[0] & low6, (word[2] & low4) | (((word[0] >> 6) & low2) << 4)};
    const std::uint32_t m_words[2] = {word[1] & low6, ((word[2] >> 4) & low4) | (((word[1] >> 6) & low2) << 4)};
    std::uint8_t scale8[8], min8[8];
    std::memcpy(scale8, sc_words, 8);
    std::memcpy(min8, m_words, 8);
    std::int16_t m_rep[16];
    for (int j = 0; j < 8; ++j) {
      sc[j] = scale8[j];
      m_rep[2 * j] = m_rep[2 * j + 1] = min8[j];
    }
    m_pairs = load32(m_rep);
    d = h2f(w.d);
    dmin = h2f(w.dmin);
  }

  float step(float s, const block_q8_K& x) const noexcept {
    __m256i acc = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j)
      acc = _mm256_add_epi32(acc, scaled_dot(q[j], load32(x.qs + 32 * j), _mm256_set1_epi16(sc[j])));
    // |bsum| <= 16·127 and m <= 63: the pair products fit int32 exactly.
    const std::int32_t sum_m = hsum_i32(_mm256_madd_epi16(load32(x.bsums), m_pairs));
    return scale_min_step(s, {hsum_i32(acc), sum_m}, d, dmin, x.d);
  }
};

// A Q6_K super-block unpacked once: 32-element quarter i (of 8) as unsigned
// 6-bit values; the offset 32 is removed exactly through the bsums.
struct unpacked_q6_K {
  __m256i q[8];
  const std::int8_t* scales;
  float d;

  explicit unpacked_q6_K(const block_q6_K& w) noexcept : scales(w.scales), d(h2f(w.d)) {
    const __m256i nib = _mm256_set1_epi8(0x0f);
    const __m256i two_bits = _mm256_set1_epi8(3);
    const auto high = [&](__m256i qh, int shift) {
      return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, shift), two_bits), 4);
    };
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = load32(w.ql + 64 * h);
      const __m256i ql1 = load32(w.ql + 64 * h + 32);
      const __m256i qh = load32(w.qh + 32 * h);
      q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(ql0, nib), high(qh, 0));
      q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, nib), high(qh, 2));
      q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), nib), high(qh, 4));
      q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), nib), high(qh, 6));
    }
  }

  float step(float s, const block_q8_K& x) const noexcept {
    __m256i acc = _mm256_setzero_si256();
    for (int i = 0; i < 8; ++i) {
      // Quarter i holds 16-element groups 2i and 2i + 1.
      const __m256i sc = _mm256_set_m128i(_mm_set1_epi16(scales[2 * i + 1]), _mm_set1_epi16(scales[2 * i]));
      acc = _mm256_add_epi32(acc, scaled_dot(q[i], load32(x.qs + 32 * i), sc));
    }
    std::int32_t offset = 0;
    for (int g = 0; g < 16; ++g) offset += scales[g] * x.bsums[g];
    return scale_step(s, hsum_i32(acc) - 32 * offset, d, x.d);
  }
};

// Each super-block unpacked once per group of up to 8 tokens; each token's
// accumulator still takes the super-blocks in order.
template <class Unpacked, class Block>
void dot_tokens(const std::byte* row, const block_q8_K* x, std::size_t x_stride, std::size_t n_tokens,
                std::size_t nb, float* y, std::size_t y_stride) noexcept {
  constexpr std::size_t group = 8;
  const auto* w = reinterpret_cast<const Block*>(row);
  for (std::size_t t0 = 0; t0 < n_tokens; t0 += group) {
    const std::size_t n = n_tokens - t0 < group ? n_tokens - t0 : group;
    float s[group] = {};
    for (std::size_t b = 0; b < nb; ++b) {
      const Unpacked u(w[b]);
      for (std::size_t c = 0; c < n; ++c) s[c] = u.step(s[c], x[(t0 + c) * x_stride + b]);
    }
    for (std::size_t c = 0; c < n; ++c) y[(t0 + c) * y_stride] = s[c];
  }
}

inline void row_tokens(tensor_type type, const std::byte* row, const block_q8_K* x, std::size_t x_stride,
                       std::size_t n_tokens, std::size_t nb, float* y, std::size_t y_stride) noexcept {
  switch (type) {
    case tensor_type::q4_K:
      return dot_tokens<unpacked_scale_min, block_q4_K>(row, x, x_stride, n_tokens, nb, y, y_stride);
    case tensor_type::q5_K:
      return dot_tokens<unpacked_scale_min, block_q5_K>(row, x, x_stride, n_tokens, nb, y, y_stride);
    default: return dot_tokens<unpacked_q6_K, block_q6_K>(row, x, x_stride, n_tokens, nb, y, y_stride);
  }
}

#endif

}  // namespace kq

// ======================================================= Q4_1 / Q5_0 / Q5_1

namespace lg {

inline float offset_step(float s, std::int32_t isum, float d_w, float d_x) noexcept {
  return fma1(static_cast<float>(isum), d_w * d_x, s);
}
inline float min_step(float s, std::int32_t isum, float d_w, float d_x, float m_w, float s_x) noexcept {
  return fma1(m_w, s_x, offset_step(s, isum, d_w, d_x));
}

#if !defined(EXA_K_HAS_AVX2)

// Level (0..15 or 0..31) of element j of a weight block.
template <class Block>
int level(const Block& b, int j) noexcept {
  int nib = j < 16 ? (b.qs[j] & 0x0f) : (b.qs[j - 16] >> 4);
  if constexpr (requires { b.qh; }) nib |= model::q5_high_bit(b.qh, j);
  return nib;
}

template <class Block, class Act>
float step(float s, const Block& w, const Act& x) noexcept {
  std::int32_t isum = 0;
  constexpr int offset = std::is_same_v<Block, block_q5_0> ? 16 : 0;
  for (int j = 0; j < 32; ++j) isum += (level(w, j) - offset) * x.qs[j];
  const float d_w = h2f(w.d), d_x = h2f(x.d);
  if constexpr (requires { w.m; }) {
    return min_step(s, isum, d_w, d_x, h2f(w.m), h2f(x.s));
  } else {
    return offset_step(s, isum, d_w, d_x);
  }
}

template <class Block, class Act>
void dot_tokens(const std::byte* row, const Act* x, std::size_t x_stride, std::size_t n_tokens, std::size_t nb,
                float* y, std::size_t y_stride) noexcept {
  const auto* w = reinterpret_cast<const Block*>(row);
  for (std::size_t t = 0; t < n_tokens; ++t) {
    float s = 0.0f;
    for (std::size_t b = 0; b < nb; ++b) s = step(s, w[b], x[t * x_stride + b]);
    y[t * y_stride] = s;
  }
}

#else

// 0xff in byte j where bit j of `bits` is set: each byte takes the bits byte
// it belongs to, ORs in every bit but its own, and compares with all-ones.
inline __m256i bytes_from_bits(std::uint32_t bits) noexcept {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
  return _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi64x(-1));
}

// A weight block unpacked once for several tokens: 32 levels (elements in
// order), signed for Q5_0, and its scales.
template <class Block>
struct unpacked {
  __m256i q;  // levels; Q5_0: level − 16
  float d, m = 0.0f;

  explicit unpacked(const Block& w) noexcept : d(h2f(w.d)) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.qs));
    const __m128i nib = _mm_set1_epi8(0x0f);
    q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), nib), _mm_and_si128(packed, nib));
    if constexpr (requires { w.qh; }) {
      std::uint32_t bits;
      std::memcpy(&bits, w.qh, 4);
      q = _mm256_or_si256(q, _mm256_and_si256(bytes_from_bits(bits), _mm256_set1_epi8(0x10)));
    }
    if constexpr (std::is_same_v<Block, block_q5_0>) q = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
    if constexpr (requires { w.m; }) m = h2f(w.m);
  }

  template <class Act>
  float step(float s, const Act& x) const noexcept {
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs));
    __m256i pairs;
    if constexpr (std::is_same_v<Block, block_q5_0>) {
      // maddubs multiplies unsigned by signed bytes: move w's sign onto x.
      pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(xv, q));
    } else {
      pairs = _mm256_maddubs_epi16(q, xv);
    }
    const std::int32_t isum = hsum_i32(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
    const float d_x = h2f(x.d);
    if constexpr (requires { x.s; }) return min_step(s, isum, d, d_x, m, h2f(x.s));
    else return offset_step(s, isum, d, d_x);
  }
};

template <class Block, class Act>
void dot_tokens(const std::byte* row, const Act* x, std::size_t x_stride, std::size_t n_tokens, std::size_t nb,
                float* y, std::size_t y_stride) noexcept {
  constexpr std::size_t group = 8;
  const auto* w = reinterpret_cast<const Block*>(row);
  for (std::size_t t0 = 0; t0 < n_tokens; t0 += group) {
    const std::size_t n = n_tokens - t0 < group ? n_tokens - t0 : group;
    float s[group] = {};
    for (std::size_t b = 0; b < nb; ++b) {
      const unpacked<Block> u(w[b]);
      for (std::size_t c = 0; c < n; ++c) s[c] = u.step(s[c], x[(t0 + c) * x_stride + b]);
    }
    for (std::size_t c = 0; c < n; ++c) y[(t0 + c) * y_stride] = s[c];
  }
}

#endif

inline void row_tokens(tensor_type type, const std::byte* row, const void* x, std::size_t x_stride,
                       std::size_t n_tokens, std::size_t nb, float* y, std::size_t y_stride) noexcept {
  switch (type) {
    case tensor_type::q5_0:
      return dot_tokens<block_q5_0>(row, static_cast<const block_q8_0*>(x), x_stride, n_tokens, nb, y, y_stride);
    case tensor_type::q4_1:
      return dot_tokens<block_q4_1>(row, static_cast<const block_q8_1*>(x), x_stride, n_tokens, nb, y, y_stride);
    default:
      return dot_tokens<block_q5_1>(row, static_cast<const block_q8_1*>(x), x_stride, n_tokens, nb, y, y_stride);
  }
}

}  // namespace lg

// ================================================================ the row driver

// Tile heights per token count: what fits in the registers next to the loads.
#if defined(EXA_K_AVX512)
// Up to 6 tokens 4 rows, 7 or 8 tokens 3 rows: 24 accumulators either way,
// and a batch of 32 runs four 3 × 8 tiles instead of five 4 × 6 and an 8 × 2
// whose 10 loads served only 16 FMAs (7 % of a batch-32 f32 step). On an
// Emerald Rapids host, alternated pairs against 4 × 6: batch 32 1.04× (f32,
// 1 thread, six pairs), 1.05× (2 threads), 1.03× (f16); prefill 0.99-1.05×.
// Each f16 weight vector's conversion (two uops on the FMA ports) serves 8
// FMAs. The loads bound the tile: 11 a step cost it about a quarter of the
// core's FMA rate even from L1 (bench/matmul_probe).
constexpr int float_rows(int c) { return c == 1 ? 12 : c == 2 ? 8 : c <= 6 ? 4 : 3; }
// One token over 2-byte weights (f16, bf16): 6 rows, not 12. On the Zen 5
// host 12 row streams of 32 bytes a step read 6-13 % slower than 6 (f16
// decode, one and two threads, alternated runs); f32's 64-byte steps keep 12.
constexpr int half_decode_rows = 6;
constexpr int max_float_tokens = 8;
// Several tokens over long rows (a down projection's 2048 columns): 8 tokens'
// activations, 64 KiB, do not stay in the 48 KiB L1 while the weights stream
// past, and the 3 x 8 tile took them from L2 each step, at 52 % of the f32
// peak where the 768-column shapes ran at 73-78 % (Zen 5 host,
// bench/matmul_probe). 6 rows x 4 tokens (32 KiB of activations, 10 loads
// per 24 multiply-adds) ran that shape 1.20x (median of six alternated pairs,
// 0.94-1.34x), the 768-column shapes 0.8-1.0x: so only past this size, and
// only for 8 tokens or more (fewer run one tile, as before). Measured on the
// Zen 5 host only: f32 batch 32 (1.16x one thread, 1.08x two), f32 and f16
// prefill of 256 tokens level; not on an Intel host. Past 2,560 columns 4
// tokens outgrow a 48 KiB L1 too; there (4,096 and 11,008 columns) the tile
// was measured with the blocks of row_blocks.hpp, which keep a block and the
// next one's prefetch within the L2 (f32 40-44 % of the peak from memory,
// f16 71-75 %; column parts, which would keep the activations in L1, were
// not faster: docs/PERFORMANCE.md, "Results (5 December 2026, afternoon ...)").
constexpr std::size_t long_row_tile_bytes = 40 * 1024;
constexpr int long_row_tokens = 4, long_row_rows = 6;
static_assert(long_row_step % long_row_rows == 0 && long_row_step % float_rows(long_row_tokens - 1) == 0,
              "a long-row block step holds whole tiles");
// One token runs the 256-bit kernel with 32 ymm registers.
constexpr int quant_rows(int c) { return c == 1 ? 12 : c == 2 ? 6 : c == 3 ? 4 : 4; }
#elif defined(EXA_K_AVX2)
// 16 ymm registers; a 16-lane accumulator takes two.
constexpr int float_rows(int c) { return c == 1 ? 6 : c == 2 ? 4 : 3; }  // c > 1: float_tile_halves
constexpr int half_decode_rows = float_rows(1);
constexpr int max_float_tokens = 4;
constexpr int quant_rows(int c) { return c == 1 ? 12 : c == 2 ? 4 : c == 3 ? 3 : 2; }
#else
constexpr int float_rows(int) { return 1; }
constexpr int half_decode_rows = 1;
constexpr int max_float_tokens = 4;
constexpr int quant_rows(int) { return 1; }
#endif
constexpr int max_tile_tokens = 4;
// Weight rows processed together across all token tiles: row_blocks.hpp.

// What one token tile of a row block prefetches of the next block: `bytes`
// from `begin`, shared among its row tiles in proportion to their rows, each
// spreading its share over its k steps. Spread so thinly, the next block's
// lines arrive while this block computes; asked for in one burst at the
// block's start, they filled the miss buffers and the core waited on them
// (18 % of a batch-32 f32 decode step).
struct prefetch_slice {
  const std::byte* begin = nullptr;
  std::size_t bytes = 0;
};

// The span by reference down to the tile, which takes its copy from the
// caller's object: passed by value here, GCC rebuilt the 32-byte argument
// each call from a fresh 8-byte store and one 32-byte load, a failed store
// forward that held about 4 % of a two-thread batch-32 f32 step's samples
// at the call (Zen 5). End to end within that host's noise: two threads
// 1.04x median of five alternated pairs with the new build second, 0.97x with
// it first. The tile itself taking it by reference ran 0.8x (not looked
// into). run_quant (q4_0) takes it the same way, not measured.
template <int C, int R>
void run_float_rows(tensor_type type, const row_span& w, const kernel_acts& p, std::size_t rb, std::size_t re,
                    std::size_t t0, float* y, std::size_t ys, prefetch_slice slice) noexcept {
  const auto tile = [&]<int RR>(std::size_t r) {
    // Without a slice, one token streams every weight once: a tile asks for
    // the rows after it (line_prefetch).
    const std::size_t a = slice.bytes * (r - rb) / (re - rb), b = slice.bytes * (r + RR - rb) / (re - rb);
    const std::byte* pf = slice.begin ? slice.begin + a : C == 1 ? w.row(r + RR) : nullptr;
    const std::size_t pf_bytes = slice.begin ? b - a : RR * w.pitch;
#if defined(EXA_K_AVX2)
    if constexpr (C > 1) {
      const auto halves = [&]<class Row>() {
        float_tile_halves<Row, RR, C>(w, r, p.xf, p.xf_stride, t0, y, ys, pf, pf_bytes);
      };
      switch (type) {
        case tensor_type::f32: return halves.template operator()<f32_row>();
        case tensor_type::f16: return halves.template operator()<f16_row>();
        default: return halves.template operator()<bf16_row>();
      }
    }
#endif
    switch (type) {
      case tensor_type::f32: return float_tile<f32_row, RR, C>(w, r, p.xf, p.xf_stride, t0, y, ys, pf, pf_bytes);
      case tensor_type::f16: return float_tile<f16_row, RR, C>(w, r, p.xf, p.xf_stride, t0, y, ys, pf, pf_bytes);
      default: return float_tile<bf16_row, RR, C>(w, r, p.xf, p.xf_stride, t0, y, ys, pf, pf_bytes);
    }
  };
  std::size_t r = rb;
  for (; r + R <= re; r += R) tile.template operator()<R>(r);
  for (; r < re; ++r) tile.template operator()<1>(r);
}

template <int C>
void run_float(tensor_type type, const row_span& w, const kernel_acts& p, std::size_t rb, std::size_t re,
               std::size_t t0, float* y, std::size_t ys, prefetch_slice slice) noexcept {
  if constexpr (C == 1 && half_decode_rows != float_rows(1))
    if (type != tensor_type::f32) return run_float_rows<C, half_decode_rows>(type, w, p, rb, re, t0, y, ys, slice);
  run_float_rows<C, float_rows(C)>(type, w, p, rb, re, t0, y, ys, slice);
}

template <int C>
void run_quant(tensor_type type, const row_span& w, const kernel_acts& p, std::size_t rb, std::size_t re,
               std::size_t t0, float* y, std::size_t ys) noexcept {
  constexpr int R = quant_rows(C);
  const auto tile = [&]<int RR>(std::size_t r) {
#if defined(EXA_K_AVX512)
    if constexpr (C == 1) return q256::quant_tile<q256::q4_0_row, RR, C>(w, r, p, t0, y, ys);
#endif
    (void)type;  // q4_0: q8_0 runs q8p
    return quant_tile<q4_0_row, RR, C>(w, r, p, t0, y, ys);
  };
  std::size_t r = rb;
  for (; r + R <= re; r += R) tile.template operator()<R>(r);
  for (; r < re; ++r) tile.template operator()<1>(r);
}


inline void rows(const model::weight_view& w, const kernel_acts& p, std::size_t n_tokens, float* y,
                 std::size_t y_stride, std::size_t row_begin, std::size_t row_end) {
  const std::size_t pitch = w.row_bytes();
  if (kquant::is_k_quant(w.type)) {
    const std::size_t nb = w.cols / model::qk_k;
    for (std::size_t r = row_begin; r < row_end; ++r)
      kq::row_tokens(w.type, w.data + r * pitch, p.xk, p.xk_stride, n_tokens, nb, y + r, y_stride);
    return;
  }
  if (w.type == tensor_type::q8_0) return q8p::rows(w, p, n_tokens, y, y_stride, row_begin, row_end);
  if (legacy::handles(w.type)) {
    for (std::size_t r = row_begin; r < row_end; ++r)
      lg::row_tokens(w.type, w.data + r * pitch, p.x32, p.x32_stride, n_tokens, w.cols / 32, y + r, y_stride);
    return;
  }
  const row_span span{w.data, pitch, w.cols, w.data + row_end * pitch};
#if defined(EXA_K_AVX512)
  // The long-row tile's batches (q4_0, which runs its own tiles, keeps its blocks).
  const bool long_rows = w.type != tensor_type::q4_0 && n_tokens >= max_float_tokens &&
                         w.cols * sizeof(float) * max_float_tokens > long_row_tile_bytes;
#else
  constexpr bool long_rows = false;
#endif
  const std::size_t rows_per_block = float_block_rows(pitch, long_rows);
  for (std::size_t rb = row_begin; rb < row_end; rb += rows_per_block) {
    const std::size_t re = std::min(row_end, rb + rows_per_block);
    // Ask for the next block's weights while this one computes: with many
    // tokens the block is reused from cache, and the next one arrives in time.
    // Not for a token or two: the block streams through once, the hardware
    // prefetcher follows it, and a burst of prefetches only fills the miss
    // buffers ahead of the loads the tile needs now (27 % of decode time).
    // Float tiles spread the request over their steps (prefetch_slice); q4_0
    // still asks in one burst.
    const bool ahead = re < row_end && n_tokens >= max_tile_tokens;
    const std::byte* next = ahead ? span.row(re) : nullptr;
    const std::size_t next_bytes = ahead ? std::min(row_end - re, rows_per_block) * pitch : 0;
    if (ahead && w.type == tensor_type::q4_0)
      for (std::size_t off = 0; off < next_bytes; off += 64) __builtin_prefetch(next + off, 0, 2);
    // The float tiles' share of it: token tile i of n takes the i-th n-th.
    const auto slice_of = [&](const even_tiles& tiles, std::size_t t) {
      const std::size_t n = tiles.tiles, i = tiles.index(t);
      const std::size_t a = next_bytes * i / n, b = next_bytes * (i + 1) / n;
      return prefetch_slice{next ? next + a : nullptr, b - a};
    };
#if defined(EXA_K_AVX2)
    if (n_tokens >= 2 && w.type == tensor_type::q4_0) {
      // Each weight block's scale as a float, once for all the token tiles.
      q256::row_scales& sc = q256::tl_row_scales;
      const std::size_t nb = w.cols / 32;
      sc.first = rb;
      sc.nb = nb;
      sc.d.resize((re - rb) * nb);
      const std::size_t bb = sizeof(block_q4_0);
      for (std::size_t r = rb; r < re; ++r) {
        const std::byte* row = span.row(r);
        float* out = sc.d.data() + (r - rb) * nb;
        for (std::size_t b = 0; b < nb; ++b) {
          std::uint16_t d;  // the block begins with its fp16 scale
          std::memcpy(&d, row + b * bb, sizeof d);
          out[b] = h2f(d);
        }
      }
    }
#endif
    if (w.type == tensor_type::q4_0)
      in_chunks<max_tile_tokens>(n_tokens, [&]<int C>(std::size_t t) {
        run_quant<C>(w.type, span, p, rb, re, t, y, y_stride);
      });
#if defined(EXA_K_AVX512)
    else if (long_rows)
      in_even_chunks<long_row_tokens>(n_tokens, [&, tiles = even_tiles(n_tokens, long_row_tokens)]<int C>(
                                                    std::size_t t) {
        const prefetch_slice slice = slice_of(tiles, t);
        if constexpr (C == long_row_tokens)
          run_float_rows<C, long_row_rows>(w.type, span, p, rb, re, t, y, y_stride, slice);
        else
          run_float<C>(w.type, span, p, rb, re, t, y, y_stride, slice);
      });
#endif
    else
      in_even_chunks<max_float_tokens>(n_tokens, [&, tiles = even_tiles(n_tokens, max_float_tokens)]<int C>(
                                                     std::size_t t) {
        run_float<C>(w.type, span, p, rb, re, t, y, y_stride, slice_of(tiles, t));
      });
  }
}

// ================================================================ the rest

inline void quantize_q8_0(const float* x, block_q8_0* out, std::size_t n) {
#if defined(EXA_K_AVX512)
  const __m512 sign_mask = _mm512_set1_ps(-0.0f);
  const auto block_amax_bits = [&](std::size_t b) {  // as model::abs_max_bits
    const __m512i abs = _mm512_set1_epi32(0x7fffffff);
    const __m512i v0 = _mm512_and_si512(_mm512_loadu_si512(x + b * 32), abs);
    const __m512i v1 = _mm512_and_si512(_mm512_loadu_si512(x + b * 32 + 16), abs);
    return static_cast<std::uint32_t>(_mm512_reduce_max_epi32(_mm512_max_epi32(v0, v1)));
  };
  const auto emit = [&](std::size_t b, float id) {
    for (int h = 0; h < 2; ++h) {
      // roundf exactly: trunc, then away from zero when the fraction is >= 0.5
      // (x - trunc(x) is exact for |x| < 2^23).
      const __m512 s = _mm512_mul_ps(_mm512_loadu_ps(x + b * 32 + 16 * h), _mm512_set1_ps(id));
      const __m512 t = _mm512_roundscale_ps(s, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      const __m512 frac = _mm512_andnot_ps(sign_mask, _mm512_sub_ps(s, t));
      const __mmask16 up = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
      const __m512 one = _mm512_or_ps(_mm512_set1_ps(1.0f), _mm512_and_ps(s, sign_mask));
      const __m512 r = _mm512_mask_add_ps(t, up, t, one);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out[b].qs + 16 * h), _mm512_cvtsepi32_epi8(_mm512_cvttps_epi32(r)));
    }
  };
#elif defined(EXA_K_AVX2)
  // The AVX-512 steps on 8 lanes: the same roundf, exactly.
  const __m256 sign8 = _mm256_set1_ps(-0.0f);
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
  const auto block_amax_bits = [&](std::size_t b) {  // as model::abs_max_bits
    const __m256i abs = _mm256_set1_epi32(0x7fffffff);
    const auto load = [&](int i) {
      return _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + b * 32 + 8 * i)), abs);
    };
    const __m256i a = _mm256_max_epi32(_mm256_max_epi32(load(0), load(1)), _mm256_max_epi32(load(2), load(3)));
    __m128i m = _mm_max_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(1, 0, 3, 2)));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
    return static_cast<std::uint32_t>(_mm_cvtsi128_si32(m));
  };
  const auto emit = [&](std::size_t b, float id) {
    __m256i q[4];
    for (int i = 0; i < 4; ++i) {
      const __m256 sc = _mm256_mul_ps(_mm256_loadu_ps(x + b * 32 + 8 * i), _mm256_set1_ps(id));
      const __m256 t = _mm256_round_ps(sc, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      const __m256 frac = _mm256_andnot_ps(sign8, _mm256_sub_ps(sc, t));
      const __m256 up = _mm256_cmp_ps(frac, half, _CMP_GE_OQ);
      const __m256 step = _mm256_and_ps(up, _mm256_or_ps(one, _mm256_and_ps(sc, sign8)));
      q[i] = _mm256_cvttps_epi32(_mm256_add_ps(t, step));  // t + 0 where not rounding up: the same integer
    }
    // int32 → int8 (|q| ≤ 127: no saturation), then undo the packs' lane interleave.
    const __m256i p16 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    const __m256i ordered = _mm256_permutevar8x32_epi32(p16, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b].qs), ordered);
  };
#endif
#if defined(EXA_K_HAS_AVX2)
  // The scales of 8 blocks at once: d = amax / 127, id = 1 / d (0 for 0),
  // d's f16 bits by F16C, as the scalar steps below give them (d is never a
  // NaN here: non-finite blocks are written apart). One block at a time, the
  // two divisions and the conversion were a chain the core waited on for
  // every block.
  // A block with a NaN or an infinity is written as the scalar steps write
  // it: d = q8_nonfinite_scale, q = 0.
  const auto nonfinite = [&](std::size_t b) {
    out[b].d = model::q8_nonfinite_scale;
    std::memset(out[b].qs, 0, sizeof out[b].qs);
  };
  const std::size_t nb = n / 32;
  std::size_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    alignas(32) std::uint32_t amax[8];
    alignas(32) float id[8];
    alignas(16) std::uint16_t dh[8];
    for (int j = 0; j < 8; ++j) amax[j] = block_amax_bits(b + j);
    const __m256i bits = _mm256_load_si256(reinterpret_cast<const __m256i*>(amax));
    const int bad = _mm256_movemask_ps(
        _mm256_castsi256_ps(_mm256_cmpgt_epi32(bits, _mm256_set1_epi32(static_cast<int>(model::f32_inf_bits - 1)))));
    const __m256 dv = _mm256_div_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(127.0f));
    const __m256 nonzero = _mm256_cmp_ps(dv, _mm256_setzero_ps(), _CMP_NEQ_UQ);  // d != 0
    _mm256_store_ps(id, _mm256_and_ps(nonzero, _mm256_div_ps(_mm256_set1_ps(1.0f), dv)));
    _mm_store_si128(reinterpret_cast<__m128i*>(dh), _mm256_cvtps_ph(dv, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (int j = 0; j < 8; ++j) {
      if ((bad >> j) & 1) [[unlikely]] {
        nonfinite(b + j);
        continue;
      }
      out[b + j].d = dh[j];
      emit(b + j, id[j]);
    }
  }
  for (; b < nb; ++b) {
    const std::uint32_t amax = block_amax_bits(b);
    if (amax >= model::f32_inf_bits) [[unlikely]] {
      nonfinite(b);
      continue;
    }
    const float d = std::bit_cast<float>(amax) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = model::float_to_f16(d);
    emit(b, id);
  }
#else
  model::quantize_row_q8_0(x, out, n);
#endif
}

// ------------------------------------------------ e^x, SiLU and softmax
// det::expf lane by lane: the same double steps (det_math.cpp), so the same
// bits; only the table lookup differs (permutes on AVX-512, a gather on AVX2).
// SiLU and softmax take up to vexpf_groups groups of lanes at once (then
// the rest in one call: in_chunks): exp_probe measured 8 groups faster than
// 4 and 4 than 2 on both AVX-512 and AVX2 (Emerald Rapids).
constexpr int vexpf_groups = 8;
#if defined(EXA_K_HAS_AVX2)
// det_math.cpp's expf steps on N vectors of doubles of either width
// (__m256d, __m512d): the reduction k = round(x · 64/ln2), r = x − k·ln2/64
// in two parts, and the polynomial p(r), each operator one IEEE operation
// (GCC's vector operators; the build's -ffp-contract=off keeps them unfused).
template <class VD, int N>
[[gnu::always_inline]] inline void vexpf_steps(const VD (&x)[N], VD (&kd)[N], VD (&p)[N]) noexcept {
  namespace e = det::expf_parts;
  VD r[N];
  for (int c = 0; c < N; ++c) kd[c] = (x[c] * e::scale + e::shifter) - e::shifter;
  for (int c = 0; c < N; ++c) r[c] = (x[c] - kd[c] * e::ln2_64_hi) - kd[c] * e::ln2_64_lo;
  for (int c = 0; c < N; ++c) p[c] = VD{} + 1.0 / 120.0;
  for (const double k : {1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0})
    for (int c = 0; c < N; ++c) p[c] = k + r[c] * p[c];
}
#endif
#if defined(EXA_K_AVX512)
// N independent groups of 8 lanes at once, each step written for all of
// them together: one group's chain (about 80 cycles of dependent double
// operations) left the core waiting; with several in flight the same
// operations overlap. Lane by lane the same steps, so the same bits.
template <int N>
[[gnu::always_inline]] inline void vexpf_n(const __m256 (&xf)[N], __m256 (&out)[N]) noexcept {
  namespace e = det::expf_parts;
  const double* tab = e::table();
  __m512d x[N], kd[N], p[N];
  // Lanes in [lower, upper] take the steps below; the others (NaN, too big,
  // too small: rare in SiLU and softmax) are replaced at the end, and only
  // when there are any.
  __mmask8 in[N];
  unsigned odd = 0;
  for (int c = 0; c < N; ++c) {
    x[c] = _mm512_cvtps_pd(xf[c]);
    in[c] = _mm512_cmp_pd_mask(x[c], _mm512_set1_pd(e::lower), _CMP_GE_OQ) &
            _mm512_cmp_pd_mask(x[c], _mm512_set1_pd(e::upper), _CMP_LE_OQ);
    odd |= static_cast<__mmask8>(~in[c]);
  }
  if (odd != 0) [[unlikely]]
    for (int c = 0; c < N; ++c) x[c] = _mm512_maskz_mov_pd(in[c], x[c]);  // the others: any finite value
  vexpf_steps(x, kd, p);
  for (int c = 0; c < N; ++c) {
    const __m256i n = _mm512_cvtpd_epi32(kd[c]);  // kd is an integer: exact
    const __m256i j = _mm256_and_si256(n, _mm256_set1_epi32(63));
    const __m256i k = _mm256_srai_epi32(_mm256_sub_epi32(n, j), 6);
    // The table's 64 entries from eight registers, not a gather: each pair
    // of registers serves 16 entries by j's low 4 bits, bits 4 and 5 pick
    // the pair. The same entries, so the same bits.
    const __m512i jj = _mm512_cvtepi32_epi64(j);
    const __m512d t01 = _mm512_permutex2var_pd(_mm512_loadu_pd(tab), jj, _mm512_loadu_pd(tab + 8));
    const __m512d t23 = _mm512_permutex2var_pd(_mm512_loadu_pd(tab + 16), jj, _mm512_loadu_pd(tab + 24));
    const __m512d t45 = _mm512_permutex2var_pd(_mm512_loadu_pd(tab + 32), jj, _mm512_loadu_pd(tab + 40));
    const __m512d t67 = _mm512_permutex2var_pd(_mm512_loadu_pd(tab + 48), jj, _mm512_loadu_pd(tab + 56));
    const __mmask8 b4 = _mm512_test_epi64_mask(jj, _mm512_set1_epi64(16));
    const __mmask8 b5 = _mm512_test_epi64_mask(jj, _mm512_set1_epi64(32));
    const __m512d t =
        _mm512_mask_blend_pd(b5, _mm512_mask_blend_pd(b4, t01, t23), _mm512_mask_blend_pd(b4, t45, t67));
    const __m512i bits = _mm512_slli_epi64(_mm512_cvtepi32_epi64(_mm256_add_epi32(k, _mm256_set1_epi32(1023))), 52);
    out[c] = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_mul_pd(t, p[c]), _mm512_castsi512_pd(bits)));
  }
  if (odd != 0) [[unlikely]]
    for (int c = 0; c < N; ++c) {
      const __m512d xd = _mm512_cvtps_pd(xf[c]);
      const __mmask8 nan = _mm512_cmp_pd_mask(xd, xd, _CMP_UNORD_Q);
      const __mmask8 big = _mm512_cmp_pd_mask(xd, _mm512_set1_pd(e::upper), _CMP_GT_OQ);
      const __mmask8 small = _mm512_cmp_pd_mask(xd, _mm512_set1_pd(e::lower), _CMP_LT_OQ);
      __m256 y = _mm256_mask_blend_ps(small, out[c], _mm256_setzero_ps());
      y = _mm256_mask_blend_ps(big, y, _mm256_set1_ps(__builtin_inff()));
      out[c] = _mm256_mask_blend_ps(nan, y, xf[c]);
    }
}
constexpr std::size_t vexpf_lanes = 8;
template <int N>
inline void vexpf_minus_n(float* x, float sub) noexcept {  // x[0..8N) = e^(x − sub)
  __m256 in[N], out[N];
  for (int c = 0; c < N; ++c) in[c] = _mm256_sub_ps(_mm256_loadu_ps(x + 8 * c), _mm256_set1_ps(sub));
  vexpf_n<N>(in, out);
  for (int c = 0; c < N; ++c) _mm256_storeu_ps(x + 8 * c, out[c]);
}
inline void vexpf_minus_rest(float* x, float sub, std::size_t m) noexcept {  // x[0..m), m < 8: masked
  const __mmask8 k = static_cast<__mmask8>((1u << m) - 1u);
  __m256 in[1] = {_mm256_sub_ps(_mm256_maskz_loadu_ps(k, x), _mm256_set1_ps(sub))}, out[1];
  vexpf_n<1>(in, out);
  _mm256_mask_storeu_ps(x, k, out[0]);
}
#elif defined(EXA_K_AVX2)
// vexpf_n on 4 lanes a group (double needs a whole 256-bit register for 4).
template <int N>
[[gnu::always_inline]] inline void vexpf_n(const __m128 (&xf)[N], __m128 (&out)[N]) noexcept {
  namespace e = det::expf_parts;
  __m256d x[N], kd[N], p[N], in[N];
  int odd = 0;
  for (int c = 0; c < N; ++c) {
    x[c] = _mm256_cvtps_pd(xf[c]);
    in[c] = _mm256_and_pd(_mm256_cmp_pd(x[c], _mm256_set1_pd(e::lower), _CMP_GE_OQ),
                          _mm256_cmp_pd(x[c], _mm256_set1_pd(e::upper), _CMP_LE_OQ));
    odd |= _mm256_movemask_pd(in[c]) ^ 0xf;
  }
  if (odd != 0) [[unlikely]]
    for (int c = 0; c < N; ++c) x[c] = _mm256_and_pd(in[c], x[c]);  // the others compute e^0, replaced below
  vexpf_steps(x, kd, p);
  for (int c = 0; c < N; ++c) {
    const __m128i n = _mm256_cvtpd_epi32(kd[c]);  // kd is an integer: exact
    const __m128i j = _mm_and_si128(n, _mm_set1_epi32(63));
    const __m128i k = _mm_srai_epi32(_mm_sub_epi32(n, j), 6);
    // (The masked form with every lane on: the plain one's undefined source
    // trips GCC 12's -Wuninitialized once inlined here.)
    const __m256d t = _mm256_mask_i32gather_pd(_mm256_setzero_pd(), e::table(), j,
                                               _mm256_castsi256_pd(_mm256_set1_epi64x(-1)), 8);
    const __m256i bits = _mm256_slli_epi64(_mm256_cvtepi32_epi64(_mm_add_epi32(k, _mm_set1_epi32(1023))), 52);
    out[c] = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_mul_pd(t, p[c]), _mm256_castsi256_pd(bits)));
  }
  if (odd != 0) [[unlikely]]
    for (int c = 0; c < N; ++c) {
      const __m256d xd = _mm256_cvtps_pd(xf[c]);
      const __m128 small = _mm256_cvtpd_ps(_mm256_cmp_pd(xd, _mm256_set1_pd(e::lower), _CMP_LT_OQ));
      const __m128 big = _mm256_cvtpd_ps(_mm256_cmp_pd(xd, _mm256_set1_pd(e::upper), _CMP_GT_OQ));
      __m128 y = _mm_blendv_ps(out[c], _mm_setzero_ps(), small);  // all-ones lanes → NaN: sign bit set
      y = _mm_blendv_ps(y, _mm_set1_ps(__builtin_inff()), big);
      out[c] = _mm_blendv_ps(y, xf[c], _mm_cmpunord_ps(xf[c], xf[c]));
    }
}
constexpr std::size_t vexpf_lanes = 4;
template <int N>
inline void vexpf_minus_n(float* x, float sub) noexcept {  // x[0..4N) = e^(x − sub)
  __m128 in[N], out[N];
  for (int c = 0; c < N; ++c) in[c] = _mm_sub_ps(_mm_loadu_ps(x + 4 * c), _mm_set1_ps(sub));
  vexpf_n<N>(in, out);
  for (int c = 0; c < N; ++c) _mm_storeu_ps(x + 4 * c, out[c]);
}
inline void vexpf_minus_rest(float* x, float sub, std::size_t m) noexcept {  // x[0..m), m < 4: masked
  const __m128i k = _mm_cmpgt_epi32(_mm_set1_epi32(static_cast<int>(m)), _mm_setr_epi32(0, 1, 2, 3));
  __m128 in[1] = {_mm_sub_ps(_mm_maskload_ps(x, k), _mm_set1_ps(sub))}, out[1];
  vexpf_n<1>(in, out);
  _mm_maskstore_ps(x, k, out[0]);
}
#endif

// The scalar order (ops.cpp): g / (1 + e^(−g)), then · u.
#if defined(EXA_K_AVX512)
template <int N>
inline void silu_groups(float* g, const float* u) noexcept {  // g[0..8N)
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
  __m256 gv[N], e[N];
  for (int c = 0; c < N; ++c) gv[c] = _mm256_xor_ps(_mm256_loadu_ps(g + 8 * c), sign);
  vexpf_n<N>(gv, e);
  for (int c = 0; c < N; ++c)
    _mm256_storeu_ps(g + 8 * c, _mm256_mul_ps(_mm256_div_ps(_mm256_loadu_ps(g + 8 * c), _mm256_add_ps(one, e[c])),
                                              _mm256_loadu_ps(u + 8 * c)));
}
inline void silu_rest(float* g, const float* u, std::size_t m) noexcept {  // g[0..m), m < 8: one masked group
  const __mmask8 k = static_cast<__mmask8>((1u << m) - 1u);
  const __m256 gx = _mm256_maskz_loadu_ps(k, g);
  __m256 gv[1] = {_mm256_xor_ps(gx, _mm256_set1_ps(-0.0f))}, e[1];
  vexpf_n<1>(gv, e);
  _mm256_mask_storeu_ps(
      g, k, _mm256_mul_ps(_mm256_div_ps(gx, _mm256_add_ps(_mm256_set1_ps(1.0f), e[0])), _mm256_maskz_loadu_ps(k, u)));
}
#elif defined(EXA_K_AVX2)
template <int N>
inline void silu_groups(float* g, const float* u) noexcept {  // g[0..4N)
  const __m128 one = _mm_set1_ps(1.0f), sign = _mm_set1_ps(-0.0f);
  __m128 gv[N], e[N];
  for (int c = 0; c < N; ++c) gv[c] = _mm_xor_ps(_mm_loadu_ps(g + 4 * c), sign);
  vexpf_n<N>(gv, e);
  for (int c = 0; c < N; ++c)
    _mm_storeu_ps(g + 4 * c,
                  _mm_mul_ps(_mm_div_ps(_mm_loadu_ps(g + 4 * c), _mm_add_ps(one, e[c])), _mm_loadu_ps(u + 4 * c)));
}
inline void silu_rest(float* g, const float* u, std::size_t m) noexcept {  // g[0..m), m < 4: one masked group
  const __m128i k = _mm_cmpgt_epi32(_mm_set1_epi32(static_cast<int>(m)), _mm_setr_epi32(0, 1, 2, 3));
  const __m128 gx = _mm_maskload_ps(g, k);
  __m128 gv[1] = {_mm_xor_ps(gx, _mm_set1_ps(-0.0f))}, e[1];
  vexpf_n<1>(gv, e);
  _mm_maskstore_ps(g, k, _mm_mul_ps(_mm_div_ps(gx, _mm_add_ps(_mm_set1_ps(1.0f), e[0])), _mm_maskload_ps(u, k)));
}
#endif
inline void silu_mul(float* g, const float* u, std::size_t n) noexcept {
  std::size_t i = 0;
#if defined(EXA_K_HAS_AVX2)
  constexpr std::size_t lanes = vexpf_lanes;
  in_chunks<vexpf_groups>(n / lanes,
                          [&]<int N>(std::size_t group) { silu_groups<N>(g + lanes * group, u + lanes * group); });
  i = n / lanes * lanes;
  if (i < n) silu_rest(g + i, u + i, n - i);  // a call of det::expf each cost more than a group
  i = n;
#endif
  for (; i < n; ++i) g[i] = g[i] / (1.0f + det::expf(-g[i])) * u[i];
}

// The scalar order (ops.cpp): the max, e^(x − max) per element, their sum in
// double (8 lanes, a fixed tree, the rest in order: ops.hpp), then
// · (float)(1 / sum).
inline void softmax(float* x, std::size_t n) noexcept {
  float mx = -__builtin_inff();
  std::size_t i = 0;
#if defined(EXA_K_HAS_AVX2)
  // The max in 8 lanes: max_ps(x, m) keeps m for a NaN x, as std::max(m, x)
  // does. Only the sign of a zero maximum can differ from the scalar loop,
  // and x − (±0) and e^(±0) do not see it. (GCC kept the scalar loop's max
  // in memory: a store-to-load round trip per element.)
  if (n >= 8) {
    __m256 m = _mm256_set1_ps(-__builtin_inff());
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    mx = _mm_cvtss_f32(h);
  }
#endif
  for (; i < n; ++i) mx = std::max(mx, x[i]);
  i = 0;
#if defined(EXA_K_HAS_AVX2)
  in_chunks<vexpf_groups>(n / vexpf_lanes,
                          [&]<int N>(std::size_t group) { vexpf_minus_n<N>(x + group * vexpf_lanes, mx); });
  i = n / vexpf_lanes * vexpf_lanes;
  // The last few as one more group, masked: a call of det::expf each cost
  // more than a group, and attention's rows at short contexts are mostly
  // tail.
  if (i < n) vexpf_minus_rest(x + i, mx, n - i);
  i = n;
#endif
  for (; i < n; ++i) x[i] = det::expf(x[i] - mx);
  // The sum's order (ops.hpp): exp i in double lane i mod 8 over the whole
  // groups of 8, the lanes by the fixed tree, then the rest in order.
  alignas(64) double lane[8] = {};
  std::size_t j = 0;
#if defined(EXA_K_AVX512)
  __m512d acc = _mm512_setzero_pd();
  for (; j + 8 <= n; j += 8) acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm256_loadu_ps(x + j)));
  _mm512_store_pd(lane, acc);
#elif defined(EXA_K_AVX2)
  __m256d lo = _mm256_setzero_pd(), hi = lo;
  for (; j + 8 <= n; j += 8) {
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm_loadu_ps(x + j)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm_loadu_ps(x + j + 4)));
  }
  _mm256_store_pd(lane, lo);
  _mm256_store_pd(lane + 4, hi);
#else
  for (; j + 8 <= n; j += 8)
    for (std::size_t l = 0; l < 8; ++l) lane[l] += x[j + l];
#endif
  for (std::size_t l = 0; l < 4; ++l) lane[l] += lane[l + 4];
  for (std::size_t l = 0; l < 2; ++l) lane[l] += lane[l + 2];
  double sum = lane[0] + lane[1];
  for (; j < n; ++j) sum += x[j];
  const float inv = static_cast<float>(1.0 / sum);
  for (std::size_t j = 0; j < n; ++j) x[j] *= inv;
}

inline float dot_f16(const float* q, const std::uint16_t* k, std::size_t n) {
  v16 acc = vzero();
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) acc = vfma(vload(q + i), vload_f16(k + i), acc);
  float s = vhsum(acc);
  for (; i < n; ++i) s = fma1(q[i], h2f(k[i]), s);
  return s;
}

inline void axpy_f16(float w, const std::uint16_t* v, float* out, std::size_t n) {
  const v16 wv = vsplat(w);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) vstore(out + i, vfma(wv, vload_f16(v + i), vload(out + i)));
  for (; i < n; ++i) out[i] = fma1(w, h2f(v[i]), out[i]);
}

// Attention over one KV block: `rows` fp16 vectors `stride` elements apart,
// against `heads` query heads (those sharing the KV head), H at a time: each
// 16 elements of k converted once for H heads; per (head, row) the same
// operations as dot_f16.
#if defined(EXA_K_AVX512)
constexpr int attn_heads = 8;  // accumulators: one register each
#else
constexpr int attn_heads = 4;  // AVX2: two registers each, of 16
#endif

#if defined(EXA_K_AVX512)
// 16 / H rows × H heads (rounded down: H = 3 takes 5 rows, 15 of the 16
// accumulators; the rest stay zero and are not read): summed by vhsum16.
template <std::size_t H>
void dot_f16_heads16(const float* q, std::size_t q_stride, const std::uint16_t* k, std::size_t stride,
                     std::size_t n, float* out, std::size_t out_stride) noexcept {
  constexpr std::size_t R = 16 / H;
  __m512 acc[16];
  for (auto& a : acc) a = _mm512_setzero_ps();
  std::size_t e = 0;
  for (; e + 16 <= n; e += 16) {
    __m512 qv[H];
    for (std::size_t h = 0; h < H; ++h) qv[h] = _mm512_loadu_ps(q + h * q_stride + e);
    for (std::size_t r = 0; r < R; ++r) {
      const __m512 kv = vload_f16(k + r * stride + e).v;
      for (std::size_t h = 0; h < H; ++h) acc[r * H + h] = _mm512_fmadd_ps(qv[h], kv, acc[r * H + h]);
    }
  }
  alignas(64) float sums[16];
  _mm512_store_ps(sums, vhsum16(acc));
  for (std::size_t v = 0; v < R * H; ++v) {
    const std::size_t r = v / H, h = v % H;
    float s = sums[vhsum16_lane(static_cast<int>(v))];
    for (std::size_t t = e; t < n; ++t) s = fma1(q[h * q_stride + t], h2f(k[r * stride + t]), s);
    out[h * out_stride + r] = s;
  }
}
#endif

template <std::size_t H>
void dot_f16_heads(const float* q, std::size_t q_stride, const std::uint16_t* k, std::size_t stride,
                   std::size_t rows, std::size_t n, float* out, std::size_t out_stride) noexcept {
  std::size_t i = 0;
#if defined(EXA_K_AVX512)
  if constexpr (H <= 16)
    for (; i + 16 / H <= rows; i += 16 / H)
      dot_f16_heads16<H>(q, q_stride, k + i * stride, stride, n, out + i, out_stride);
#endif
  for (; i < rows; ++i) {
    const std::uint16_t* kr = k + i * stride;
    v16 acc[H];
    for (std::size_t h = 0; h < H; ++h) acc[h] = vzero();
    std::size_t e = 0;
    for (; e + 16 <= n; e += 16) {
      const v16 kv = vload_f16(kr + e);
      for (std::size_t h = 0; h < H; ++h) acc[h] = vfma(vload(q + h * q_stride + e), kv, acc[h]);
    }
    for (std::size_t h = 0; h < H; ++h) {
      float s = vhsum(acc[h]);
      for (std::size_t t = e; t < n; ++t) s = fma1(q[h * q_stride + t], h2f(kr[t]), s);
      out[h * out_stride + i] = s;
    }
  }
}

// out[e] = fma(w[i], v_i[e], out[e]) for i in order, per head: each 16-lane
// chunk of every head's `out` stays in a register across the rows, and each
// v chunk is converted once for H heads (the same operations per element as
// one axpy per row and head).
template <std::size_t H>
void axpy_f16_heads(const float* w, std::size_t w_stride, const std::uint16_t* v, std::size_t stride,
                    std::size_t rows, std::size_t n, float* out, std::size_t out_stride) noexcept {
  std::size_t e = 0;
  for (; e + 16 <= n; e += 16) {
    v16 acc[H];
    for (std::size_t h = 0; h < H; ++h) acc[h] = vload(out + h * out_stride + e);
    for (std::size_t i = 0; i < rows; ++i) {
      const v16 vv = vload_f16(v + i * stride + e);
      for (std::size_t h = 0; h < H; ++h) acc[h] = vfma(vsplat(w[h * w_stride + i]), vv, acc[h]);
    }
    for (std::size_t h = 0; h < H; ++h) vstore(out + h * out_stride + e, acc[h]);
  }
  for (; e < n; ++e)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < rows; ++i)
        out[h * out_stride + e] = fma1(w[h * w_stride + i], h2f(v[i * stride + e]), out[h * out_stride + e]);
}

#if defined(EXA_K_HAS_AVX2)
// Dot products for the rows held as lanes (rows_of(e): element e of 8 or 16
// rows as one register, __m256 or __m512): lane l of dot_f16's accumulator
// for all of them is one register fed the same fused multiply-adds in the
// same order from zero (lanes l and l + 8 taken together, as dot_f16's .lo
// and .hi on 8-wide registers), vhsum's tree (l + l+8, + 4, + 2, + 1) is
// additions of whole registers, and the tail lane-wise fused multiply-adds:
// lane j is row j's dot_f16, bit for bit, on either width. No horizontal
// step: for short heads (64) that step, not the multiply-adds, was most of
// the per-row kernel's cost. lanes_dot_heads does it for H heads over the
// same rows at once: each row register is loaded once for all H, each head's
// accumulation unchanged. For several heads the loads, not the
// multiply-adds, were the limit (a broadcast and a row for every
// multiply-add).
[[gnu::always_inline]] inline __m256 lanes_fma(__m256 a, __m256 b, __m256 c) noexcept { return _mm256_fmadd_ps(a, b, c); }
[[gnu::always_inline]] inline __m256 lanes_add(__m256 a, __m256 b) noexcept { return _mm256_add_ps(a, b); }
[[gnu::always_inline]] inline void lanes_set1(float x, __m256& v) noexcept { v = _mm256_set1_ps(x); }
#if defined(EXA_K_AVX512)
[[gnu::always_inline]] inline __m512 lanes_fma(__m512 a, __m512 b, __m512 c) noexcept { return _mm512_fmadd_ps(a, b, c); }
[[gnu::always_inline]] inline __m512 lanes_add(__m512 a, __m512 b) noexcept { return _mm512_add_ps(a, b); }
[[gnu::always_inline]] inline void lanes_set1(float x, __m512& v) noexcept { v = _mm512_set1_ps(x); }
#endif
template <class V>
[[gnu::always_inline]] inline V lanes_bcast(float x) noexcept {
  V v;
  lanes_set1(x, v);
  return v;
}

template <int H, class V, class RowsOf>
[[gnu::always_inline]] inline void lanes_dot_heads(const float* const (&qh)[H], std::size_t n, RowsOf&& rows_of,
                                                   V (&res)[H]) noexcept {
  const std::size_t full = n / 16 * 16;
  V y[H][8];
  for (std::size_t l = 0; l < 8; ++l) {
    V a[H], b[H];
    for (int h = 0; h < H; ++h) a[h] = b[h] = lanes_bcast<V>(0.0f);
    for (std::size_t c = 0; c < full; c += 16) {
      const V lo = rows_of(c + l), hi = rows_of(c + 8 + l);
      for (int h = 0; h < H; ++h) {
        a[h] = lanes_fma(lanes_bcast<V>(qh[h][c + l]), lo, a[h]);
        b[h] = lanes_fma(lanes_bcast<V>(qh[h][c + 8 + l]), hi, b[h]);
      }
    }
    for (int h = 0; h < H; ++h) y[h][l] = lanes_add(a[h], b[h]);
  }
  for (int h = 0; h < H; ++h) {
    for (int w = 4; w > 0; w /= 2)
      for (int l = 0; l < w; ++l) y[h][l] = lanes_add(y[h][l], y[h][l + w]);
    res[h] = y[h][0];
  }
  for (std::size_t t = full; t < n; ++t) {
    const V row = rows_of(t);
    for (int h = 0; h < H; ++h) res[h] = lanes_fma(lanes_bcast<V>(qh[h][t]), row, res[h]);
  }
}
template <class RowsOf>
[[gnu::always_inline]] inline auto lanes_dot(const float* qh, std::size_t n, RowsOf&& rows_of) noexcept {
  using V = std::decay_t<decltype(rows_of(std::size_t{0}))>;
  const float* const q[1] = {qh};
  V res[1];
  lanes_dot_heads<1>(q, n, rows_of, res);
  return res[0];
}
// Every head (q + h · q_stride) over the same rows, two heads a pass; head
// h's result goes to store(h, register).
template <class RowsOf, class Store>
[[gnu::always_inline]] inline void lanes_dot_each_head(const float* q, std::size_t q_stride, std::size_t heads,
                                                       std::size_t n, RowsOf&& rows_of, Store&& store) noexcept {
  using V = std::decay_t<decltype(rows_of(std::size_t{0}))>;
  std::size_t h = 0;
  for (; h + 2 <= heads; h += 2) {
    const float* const qh[2] = {q + h * q_stride, q + (h + 1) * q_stride};
    V res[2];
    lanes_dot_heads<2>(qh, n, rows_of, res);
    store(h, res[0]);
    store(h + 1, res[1]);
  }
  if (h < heads) store(h, lanes_dot(q + h * q_stride, n, rows_of));
}
#endif

#if defined(EXA_K_AVX512)
// r[j]'s element i to r[i]'s lane j (a 16 × 16 transpose of floats):
// pairs of rows interleaved, then pairs of pairs, then 128-bit blocks.
[[gnu::always_inline]] inline void transpose16(__m512 (&r)[16]) noexcept {
  __m512 a[16], b[16];
  for (int p = 0; p < 8; ++p) {  // lane block L: rows 2p, 2p+1 at columns 4L, 4L+1 (lo), 4L+2, 4L+3 (hi)
    a[2 * p] = _mm512_unpacklo_ps(r[2 * p], r[2 * p + 1]);
    a[2 * p + 1] = _mm512_unpackhi_ps(r[2 * p], r[2 * p + 1]);
  }
  for (int g = 0; g < 4; ++g) {  // b[4g + s]'s block L: column 4L + s, rows 4g..4g+3
    const __m512d lo0 = _mm512_castps_pd(a[4 * g]), lo1 = _mm512_castps_pd(a[4 * g + 2]);
    const __m512d hi0 = _mm512_castps_pd(a[4 * g + 1]), hi1 = _mm512_castps_pd(a[4 * g + 3]);
    b[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo0, lo1));
    b[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo0, lo1));
    b[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(hi0, hi1));
    b[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(hi0, hi1));
  }
  for (int s = 0; s < 4; ++s) {  // column 4L + s: block g from b[4g + s]'s block L
    const __m512 c0 = _mm512_shuffle_f32x4(b[s], b[4 + s], 0x44), c1 = _mm512_shuffle_f32x4(b[s], b[4 + s], 0xee);
    const __m512 c2 = _mm512_shuffle_f32x4(b[8 + s], b[12 + s], 0x44);
    const __m512 c3 = _mm512_shuffle_f32x4(b[8 + s], b[12 + s], 0xee);
    r[s] = _mm512_shuffle_f32x4(c0, c2, 0x88);
    r[4 + s] = _mm512_shuffle_f32x4(c0, c2, 0xdd);
    r[8 + s] = _mm512_shuffle_f32x4(c1, c3, 0x88);
    r[12 + s] = _mm512_shuffle_f32x4(c1, c3, 0xdd);
  }
}


constexpr std::size_t dot_t16_max_n = 256;  // kt's size: 16 KiB
// 16 rows against every head with the lanes as rows: the 16 rows' elements
// are transposed once (kt[16c + l]'s lane j: row j's element 16c + l), then
// each head is lanes_dot over them, its 16 dot products stored at once. n:
// a multiple of 16, at most dot_t16_max_n.
inline void dot_f16_rows16_t(const float* q, std::size_t q_stride, std::size_t heads, const std::uint16_t* k,
                             std::size_t stride, std::size_t n, float* out, std::size_t out_stride) noexcept {
  alignas(64) float kt[16 * dot_t16_max_n];
  const std::size_t chunks = n / 16;
  for (std::size_t c = 0; c < chunks; ++c) {
    __m512 r[16];
    for (std::size_t j = 0; j < 16; ++j) r[j] = vload_f16(k + j * stride + 16 * c).v;
    transpose16(r);
    for (std::size_t l = 0; l < 16; ++l) _mm512_store_ps(kt + (16 * c + l) * 16, r[l]);
  }
  const auto transposed = [&](std::size_t e) { return _mm512_load_ps(kt + 16 * e); };
  lanes_dot_each_head(q, q_stride, heads, n, transposed,
                      [&](std::size_t h, __m512 r) { _mm512_storeu_ps(out + h * out_stride, r); });
}
#endif

#if defined(EXA_K_AVX2)
// r[j]'s element i to r[i]'s lane j (8 × 8 floats): pairs of rows
// interleaved, then pairs of pairs, then 128-bit halves.
[[gnu::always_inline]] inline void transpose8(__m256 (&r)[8]) noexcept {
  __m256 a[8], b[8];
  for (int p = 0; p < 4; ++p) {  // half L: rows 2p, 2p+1 at columns 4L, 4L+1 (lo), 4L+2, 4L+3 (hi)
    a[2 * p] = _mm256_unpacklo_ps(r[2 * p], r[2 * p + 1]);
    a[2 * p + 1] = _mm256_unpackhi_ps(r[2 * p], r[2 * p + 1]);
  }
  for (int g = 0; g < 2; ++g) {  // b[4g + s]'s half L: column 4L + s, rows 4g..4g+3
    b[4 * g] = _mm256_shuffle_ps(a[4 * g], a[4 * g + 2], 0x44);
    b[4 * g + 1] = _mm256_shuffle_ps(a[4 * g], a[4 * g + 2], 0xee);
    b[4 * g + 2] = _mm256_shuffle_ps(a[4 * g + 1], a[4 * g + 3], 0x44);
    b[4 * g + 3] = _mm256_shuffle_ps(a[4 * g + 1], a[4 * g + 3], 0xee);
  }
  for (int s = 0; s < 4; ++s) {
    r[s] = _mm256_permute2f128_ps(b[s], b[4 + s], 0x20);
    r[4 + s] = _mm256_permute2f128_ps(b[s], b[4 + s], 0x31);
  }
}


constexpr std::size_t dot_t8_max_n = 256;  // kt's size: 8 KiB
// dot_f16_rows16_t's idea on 8-wide registers, 8 rows at a time: lanes l and
// l + 8 of dot_f16's accumulator (its .lo and .hi) for 8 rows are two
// registers, added first as vhsum does (lo + hi), then the tree of hsum8
// (l + l+4, + 2, + 1) as additions of whole registers: lane j of the result
// is row j's dot product, bit for bit.
inline void dot_f16_rows8_t(const float* q, std::size_t q_stride, std::size_t heads, const std::uint16_t* k,
                            std::size_t stride, std::size_t n, float* out, std::size_t out_stride) noexcept {
  alignas(32) float kt[8 * dot_t8_max_n];
  const std::size_t chunks = n / 16;
  for (std::size_t c = 0; c < chunks; ++c) {
    __m256 lo[8], hi[8];
    for (std::size_t j = 0; j < 8; ++j) {
      const v16 row = vload_f16(k + j * stride + 16 * c);
      lo[j] = row.lo;
      hi[j] = row.hi;
    }
    transpose8(lo);
    transpose8(hi);
    for (std::size_t l = 0; l < 8; ++l) {
      _mm256_store_ps(kt + (16 * c + l) * 8, lo[l]);
      _mm256_store_ps(kt + (16 * c + 8 + l) * 8, hi[l]);
    }
  }
  const auto transposed = [&](std::size_t e) { return _mm256_load_ps(kt + 8 * e); };
  lanes_dot_each_head(q, q_stride, heads, n, transposed,
                      [&](std::size_t h, __m256 r) { _mm256_storeu_ps(out + h * out_stride, r); });
}
#endif

inline void dot_f16_rows(const float* q, std::size_t q_stride, std::size_t heads, const std::uint16_t* k,
                         std::size_t stride, std::size_t rows, std::size_t n, float* out, std::size_t out_stride) {
#if defined(EXA_K_AVX2)
  // Here the transpose pays from 6 heads at 64 elements, 12 at 128
  // (bench/attn_probe with EXA_ENGINE_ISA=avx2: about 1.1-1.5x per dot
  // there; 0.4-0.8x for 1-4 heads).
  if (n % 16 == 0 && n <= dot_t8_max_n && heads * 64 >= 6 * n) {
    std::size_t i = 0;
    for (; i + 8 <= rows; i += 8) dot_f16_rows8_t(q, q_stride, heads, k + i * stride, stride, n, out + i, out_stride);
    k += i * stride;
    out += i;
    rows -= i;
  }
#endif
#if defined(EXA_K_AVX512)
  // The transpose pays for itself from 3 heads at 64 elements, 6 at 128
  // (bench/attn_probe: 1.28× and 1.42× there; 0.75× for one head at 64,
  // 0.81× for four at 128).
  if (n % 16 == 0 && n <= dot_t16_max_n && heads * 64 >= 3 * n) {
    std::size_t i = 0;
    for (; i + 16 <= rows; i += 16) dot_f16_rows16_t(q, q_stride, heads, k + i * stride, stride, n, out + i, out_stride);
    k += i * stride;
    out += i;
    rows -= i;
  }
#endif
  in_chunks<attn_heads>(heads, [&]<int H>(std::size_t h) {
    dot_f16_heads<H>(q + h * q_stride, q_stride, k, stride, rows, n, out + h * out_stride, out_stride);
  });
}

// Scores against a KV block whose K is stored transposed (kv_pages::k_block):
// element e of row r at kt[e · kt_stride + r]. out[h · out_stride + r] =
// dot_f16(q_h, row r, n) bit for bit, by lanes_dot (8-wide on AVX2):
// the rows come already as lanes, so this is dot_f16_rows16_t without its
// transpose (most of that kernel's time for a decode's few heads). Each
// element's rows are converted once for all heads (one head: as they are
// used). kt_stride: a multiple of 16; the rows
// up to the next multiple of 16 must be readable (their lanes are dropped);
// n at most dot_kt_max_n.
constexpr std::size_t dot_kt_max_n = 256;
inline void dot_f16_kt(const float* q, std::size_t q_stride, std::size_t heads, const std::uint16_t* kt,
                       std::size_t kt_stride, std::size_t rows, std::size_t n, float* out, std::size_t out_stride) {
#if defined(EXA_K_AVX512)
  alignas(64) float kf[16 * dot_kt_max_n];
  for (std::size_t r0 = 0; r0 < rows; r0 += 16) {
    const std::size_t live = std::min<std::size_t>(16, rows - r0);
    const auto mask = static_cast<__mmask16>((1u << live) - 1u);
    const auto converted = [&](std::size_t e) {
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(kt + e * kt_stride + r0)));
    };
    if (heads == 1) {  // nothing to share a conversion with: converted as used (1.1x at head dim 128)
      _mm512_mask_storeu_ps(out + r0, mask, lanes_dot(q, n, converted));
      continue;
    }
    for (std::size_t e = 0; e < n; ++e) _mm512_store_ps(kf + 16 * e, converted(e));
    const auto buffered = [&](std::size_t e) { return _mm512_load_ps(kf + 16 * e); };
    lanes_dot_each_head(q, q_stride, heads, n, buffered,
                        [&](std::size_t h, __m512 r) { _mm512_mask_storeu_ps(out + h * out_stride + r0, mask, r); });
  }
#elif defined(EXA_K_AVX2)
  alignas(32) float kf[8 * dot_kt_max_n];
  for (std::size_t r0 = 0; r0 < rows; r0 += 8) {
    const std::size_t live = std::min<std::size_t>(8, rows - r0);
    const __m256i mask =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(live)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const auto converted = [&](std::size_t e) {
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kt + e * kt_stride + r0)));
    };
    if (heads == 1) {  // nothing to share a conversion with: converted as used
      _mm256_maskstore_ps(out + r0, mask, lanes_dot(q, n, converted));
      continue;
    }
    for (std::size_t e = 0; e < n; ++e) _mm256_store_ps(kf + 8 * e, converted(e));
    const auto buffered = [&](std::size_t e) { return _mm256_load_ps(kf + 8 * e); };
    lanes_dot_each_head(q, q_stride, heads, n, buffered,
                        [&](std::size_t h, __m256 r) { _mm256_maskstore_ps(out + h * out_stride + r0, mask, r); });
  }
#else
  const std::size_t full = n / 16 * 16;
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t h = 0; h < heads; ++h) {
      const float* qh = q + h * q_stride;
      float t[16] = {};
      for (std::size_t c = 0; c < full; c += 16)
        for (std::size_t l = 0; l < 16; ++l) t[l] = fma1(qh[c + l], h2f(kt[(c + l) * kt_stride + r]), t[l]);
      for (std::size_t width = 8; width > 0; width /= 2)
        for (std::size_t l = 0; l < width; ++l) t[l] = t[l] + t[l + width];
      float s = t[0];
      for (std::size_t e = full; e < n; ++e) s = fma1(qh[e], h2f(kt[e * kt_stride + r]), s);
      out[h * out_stride + r] = s;
    }
#endif
}

inline void axpy_f16_rows(const float* w, std::size_t w_stride, std::size_t heads, const std::uint16_t* v,
                          std::size_t stride, std::size_t rows, std::size_t n, float* out, std::size_t out_stride) {
  in_chunks<attn_heads>(heads, [&]<int H>(std::size_t h) {
    axpy_f16_heads<H>(w + h * w_stride, w_stride, v, stride, rows, n, out + h * out_stride, out_stride);
  });
}

void rows_fn(const model::weight_view& w, const kernel_acts& a, std::size_t n_tokens, float* y,
             std::size_t y_stride, std::size_t row_begin, std::size_t row_end) {
  rows(w, a, n_tokens, y, y_stride, row_begin, row_end);
}
void quantize_fn(const float* x, block_q8_0* out, std::size_t n) { quantize_q8_0(x, out, n); }
float dot_f16_fn(const float* q, const std::uint16_t* k, std::size_t n) { return dot_f16(q, k, n); }
void axpy_f16_fn(float w, const std::uint16_t* v, float* out, std::size_t n) { axpy_f16(w, v, out, n); }
void kquant_fn(tensor_type type, const std::byte* row, const block_q8_K* x, std::size_t x_stride,
               std::size_t n_tokens, std::size_t nb, float* y, std::size_t y_stride) {
  kq::row_tokens(type, row, x, x_stride, n_tokens, nb, y, y_stride);
}
void dot_f16_rows_fn(const float* q, std::size_t q_stride, std::size_t heads, const std::uint16_t* k,
                     std::size_t stride, std::size_t rows, std::size_t n, float* out, std::size_t out_stride) {
  dot_f16_rows(q, q_stride, heads, k, stride, rows, n, out, out_stride);
}
void dot_f16_kt_fn(const float* q, std::size_t q_stride, std::size_t heads, const std::uint16_t* kt,
                   std::size_t kt_stride, std::size_t rows, std::size_t n, float* out, std::size_t out_stride) {
  dot_f16_kt(q, q_stride, heads, kt, kt_stride, rows, n, out, out_stride);
}
void axpy_f16_rows_fn(const float* w, std::size_t w_stride, std::size_t heads, const std::uint16_t* v,
                      std::size_t stride, std::size_t rows, std::size_t n, float* out, std::size_t out_stride) {
  axpy_f16_rows(w, w_stride, heads, v, stride, rows, n, out, out_stride);
}
void silu_mul_fn(float* g, const float* u, std::size_t n) { silu_mul(g, u, n); }
void round_f16_fn(const float* x, float* out, std::size_t n) {
  std::size_t i = 0;
#if defined(EXA_K_HAS_AVX2)
  // F16C rounds to nearest even as float_to_f16 does, subnormals and
  // overflow to infinity included; only a NaN's payload could differ, so
  // NaN lanes take float_to_f16's quiet NaN.
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 qnan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000));
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 r = _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    _mm256_storeu_ps(out + i, _mm256_blendv_ps(r, _mm256_or_ps(_mm256_and_ps(v, sign), qnan), nan));
  }
#endif
  for (; i < n; ++i) out[i] = model::f16_to_float(model::float_to_f16(x[i]));
}
void to_f16_fn(const float* x, std::uint16_t* out, std::size_t n) {
  std::size_t i = 0;
#if defined(EXA_K_HAS_AVX2)
  // F16C rounds as float_to_f16 does (round_f16_fn above); a NaN's payload
  // could differ, so a group with a NaN takes float_to_f16 for those lanes.
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (const int nan = _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)); nan != 0) [[unlikely]]
      for (int l = 0; l < 8; ++l)
        if (nan & (1 << l)) out[i + l] = model::float_to_f16(x[i + l]);
  }
#endif
  for (; i < n; ++i) out[i] = model::float_to_f16(x[i]);
}
void softmax_fn(float* x, std::size_t n) { softmax(x, n); }
// ------------------------------------------------ roofline probes (bench-engine)
// 16 independent chains acc = step(acc, w, x), more than each instruction's
// latency times its ports; the asm statements keep the operands opaque, so
// nothing is folded or hoisted.
constexpr int peak_chains = 16;
template <class T, class Step>
void run_chains(std::uint64_t rounds, T w, T x, Step step) noexcept {
  T acc[peak_chains];
  for (int i = 0; i < peak_chains; ++i) acc[i] = Step::init(i);  // distinct: no two chains alike
  for (std::uint64_t r = 0; r < rounds; ++r) {
#pragma GCC unroll 16
    for (auto& a : acc) a = step(a, w, x);
    if constexpr (std::is_integral_v<T>) __asm__ volatile("" : "+r"(w), "+r"(x));
    else if constexpr (std::is_floating_point_v<T>) __asm__ volatile("" : "+x"(w), "+x"(x));
    else __asm__ volatile("" : "+v"(w), "+v"(x));
  }
  for (auto& a : acc) {
    if constexpr (std::is_arithmetic_v<T>) __asm__ volatile("" : : "m"(a));
    else __asm__ volatile("" : : "v"(a));
  }
}

// The steps (function objects, not lambdas: a lambda's static invoker
// would not carry this variant's target).
#if defined(EXA_K_AVX512)
struct int8_step {
  static __m512i init(int i) noexcept { return _mm512_set1_epi32(i); }
  __m512i operator()(__m512i a, __m512i w, __m512i x) const noexcept { return _mm512_dpbusd_epi32(a, w, x); }
};
struct fma_step {
  static __m512 init(int i) noexcept { return _mm512_set1_ps(static_cast<float>(i)); }
  __m512 operator()(__m512 a, __m512 w, __m512 x) const noexcept { return _mm512_fmadd_ps(a, w, x); }
};
#elif defined(EXA_K_AVX2)
struct int8_step {
  static __m256i init(int i) noexcept { return _mm256_set1_epi32(i); }
  __m256i operator()(__m256i a, __m256i w, __m256i x) const noexcept {
#if defined(EXA_K_AVXVNNI)
    return _mm256_dpbusd_avx_epi32(a, w, x);
#else
    return _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
#endif
  }
};
struct fma_step {
  static __m256 init(int i) noexcept { return _mm256_set1_ps(static_cast<float>(i)); }
  __m256 operator()(__m256 a, __m256 w, __m256 x) const noexcept { return _mm256_fmadd_ps(a, w, x); }
};
#else
struct int8_step {
  static std::int32_t init(int i) noexcept { return i; }
  std::int32_t operator()(std::int32_t a, std::int32_t w, std::int32_t x) const noexcept { return a + w * x; }
};
struct fma_step {
  static float init(int i) noexcept { return static_cast<float>(i); }
  float operator()(float a, float w, float x) const noexcept { return fma1(a, w, x); }
};
#endif

std::uint64_t peak_fn(peak_op op, std::uint64_t rounds) {
  const bool dot = op == peak_op::int8_dot;
#if defined(EXA_K_AVX512)
  if (dot) run_chains(rounds, _mm512_set1_epi32(0x01020304), _mm512_set1_epi32(0x05060708), int8_step{});
  else run_chains(rounds, _mm512_set1_ps(0.999f), _mm512_set1_ps(0.001f), fma_step{});
  return rounds * peak_chains * (dot ? 64 : 16);
#elif defined(EXA_K_AVX2)
  if (dot) run_chains(rounds, _mm256_set1_epi32(0x01020304), _mm256_set1_epi32(0x05060708), int8_step{});
  else run_chains(rounds, _mm256_set1_ps(0.999f), _mm256_set1_ps(0.001f), fma_step{});
  return rounds * peak_chains * (dot ? 32 : 8);
#else
  if (dot) run_chains(rounds, std::int32_t{3}, std::int32_t{5}, int8_step{});
  else run_chains(rounds, 0.999f, 0.001f, fma_step{});
  return rounds * peak_chains;
#endif
}

std::uint64_t read_sum_fn(const std::byte* p, std::size_t n) {
#if defined(EXA_K_AVX512)
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (std::size_t i = 0; i < n; i += 256) {
    a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(p + i + 64));
    a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(p + i + 128));
    a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(p + i + 192));
  }
  return static_cast<std::uint64_t>(_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3))));
#elif defined(EXA_K_AVX2)
  __m256i a[8];
  for (auto& v : a) v = _mm256_setzero_si256();
  for (std::size_t i = 0; i < n; i += 256)
    for (int j = 0; j < 8; ++j)
      a[j] = _mm256_add_epi64(a[j], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32 * j)));
  std::uint64_t lanes[4], s = 0;
  for (int j = 0; j < 8; ++j) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lanes), a[j]);
    for (const auto l : lanes) s += l;
  }
  return s;
#else
  std::uint64_t s[4] = {0, 0, 0, 0};
  for (std::size_t i = 0; i < n; i += 32)
    for (int j = 0; j < 4; ++j) {
      std::uint64_t v;
      std::memcpy(&v, p + i + 8 * j, sizeof v);
      s[j] += v;
    }
  return s[0] + s[1] + s[2] + s[3];
#endif
}

void legacy_fn(tensor_type type, const std::byte* row, const void* x, std::size_t x_stride, std::size_t n_tokens,
               std::size_t nb, float* y, std::size_t y_stride) {
  lg::row_tokens(type, row, x, x_stride, n_tokens, nb, y, y_stride);
}

}  // namespace exa::engine::EXA_K_NS
