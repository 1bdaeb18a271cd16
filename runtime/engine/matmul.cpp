#include "engine/matmul.hpp"

#include <algorithm>
#include <cstring>

#include "common/assert.hpp"
#include "engine/kquant_dot.hpp"
#include "engine/legacy_dot.hpp"
#include "engine/matmul_kernels.hpp"
#include "engine/thread_pool.hpp"
#include "model/half.hpp"
#include "model/quantize.hpp"

namespace exa::engine {
namespace {

using model::tensor_type;
namespace k = kernels;

// Tile heights per token count: what fits in the 32 (AVX-512) or 16 vector
// registers next to the loads. Measured on the bench in docs/PERFORMANCE.md.
#if defined(__AVX512F__)
constexpr int float_rows(int c) { return c == 1 ? 8 : c == 2 ? 8 : 4; }
#else
constexpr int float_rows(int c) { return c == 1 ? 8 : c == 2 ? 4 : 2; }
#endif
#if defined(EXA_QUANT_AVX512)
constexpr int quant_rows(int c) { return c == 1 ? 6 : c == 2 ? 4 : c == 3 ? 4 : 3; }
#else
constexpr int quant_rows(int c) { return c == 1 ? 4 : 2; }
#endif
constexpr int max_tile_tokens = 4;
// Every tile height divides this, so only a matrix's last rows use 1-row tiles.
constexpr std::size_t row_multiple = 24;
// Weight rows processed together across all token tiles, sized so their bytes
// stay in L1/L2 while every token streams past them.
constexpr std::size_t row_block_bytes = 32 * 1024;

// What the tile kernels read, taken from an `activations`.
struct prepared {
  const float* xf = nullptr;
  std::size_t xf_stride = 0;
  k::quant_acts q;
  const model::block_q8_K* xk = nullptr;  // q8_K activations
  std::size_t xk_stride = 0;              // blocks per token
  const void* x32 = nullptr;              // q8_0 or q8_1 blocks, generic layout
  std::size_t x32_stride = 0;             // blocks per token
};

template <int C>
void run_float(const model::weight_view& w, const prepared& p, std::size_t rb, std::size_t re,
               std::size_t t0, float* y, std::size_t ys) {
  constexpr int R = float_rows(C);
  const auto tile = [&]<int RR>(std::size_t r) {
    switch (w.type) {
      case tensor_type::f32: return k::float_tile<k::f32_row, RR, C>(w, r, p.xf, p.xf_stride, t0, y, ys);
      case tensor_type::f16: return k::float_tile<k::f16_row, RR, C>(w, r, p.xf, p.xf_stride, t0, y, ys);
      default: return k::float_tile<k::bf16_row, RR, C>(w, r, p.xf, p.xf_stride, t0, y, ys);
    }
  };
  std::size_t r = rb;
  for (; r + R <= re; r += R) tile.template operator()<R>(r);
  for (; r < re; ++r) tile.template operator()<1>(r);
}

template <int C>
void run_quant(const model::weight_view& w, const prepared& p, std::size_t rb, std::size_t re,
               std::size_t t0, float* y, std::size_t ys) {
  constexpr int R = quant_rows(C);
  const auto tile = [&]<int RR>(std::size_t r) {
    if (w.type == tensor_type::q8_0) return k::quant_tile<k::q8_0_row, RR, C>(w, r, p.q, t0, y, ys);
    return k::quant_tile<k::q4_0_row, RR, C>(w, r, p.q, t0, y, ys);
  };
  std::size_t r = rb;
  for (; r + R <= re; r += R) tile.template operator()<R>(r);
  for (; r < re; ++r) tile.template operator()<1>(r);
}

template <int C>
void run_token_tile(const model::weight_view& w, const prepared& p, std::size_t rb, std::size_t re,
                    std::size_t t0, float* y, std::size_t ys) {
  if (w.type == tensor_type::q8_0 || w.type == tensor_type::q4_0) run_quant<C>(w, p, rb, re, t0, y, ys);
  else run_float<C>(w, p, rb, re, t0, y, ys);
}

// K-quant rows: one fixed-order dot product per (row, token); each row is
// unpacked once per group of tokens (kquant_dot.hpp).
void compute_rows_k_quant(const model::weight_view& w, const prepared& p, std::size_t n_tokens, float* y,
                          std::size_t y_stride, std::size_t row_begin, std::size_t row_end) {
  const kquant::path path = kquant::best_path();
  const std::size_t nb = w.cols / model::qk_k;
  for (std::size_t r = row_begin; r < row_end; ++r)
    kquant::dot_row_tokens(w.type, w.row(r), p.xk, p.xk_stride, n_tokens, nb, path, y + r, y_stride);
}

// Q4_1/Q5_0/Q5_1 rows: as K-quants, one fixed-order dot product per (row,
// token), each block unpacked once per group of tokens (legacy_dot.hpp).
void compute_rows_legacy(const model::weight_view& w, const prepared& p, std::size_t n_tokens, float* y,
                         std::size_t y_stride, std::size_t row_begin, std::size_t row_end) {
  const kquant::path path = kquant::best_path();
  for (std::size_t r = row_begin; r < row_end; ++r)
    legacy::dot_row_tokens(w.type, w.row(r), p.x32, p.x32_stride, n_tokens, w.cols / 32, path, y + r, y_stride);
}

void compute_rows(const model::weight_view& w, const prepared& p, std::size_t n_tokens, float* y,
                  std::size_t y_stride, std::size_t row_begin, std::size_t row_end) {
  if (legacy::handles(w.type)) return compute_rows_legacy(w, p, n_tokens, y, y_stride, row_begin, row_end);
  if (kquant::is_k_quant(w.type)) return compute_rows_k_quant(w, p, n_tokens, y, y_stride, row_begin, row_end);
  const std::size_t rows_per_block =
      std::max<std::size_t>(1, row_block_bytes / std::max<std::uint64_t>(1, w.row_bytes()) / row_multiple) *
      row_multiple;
  for (std::size_t rb = row_begin; rb < row_end; rb += rows_per_block) {
    const std::size_t re = std::min(row_end, rb + rows_per_block);
    // Ask for the next block's weights while this one computes: with many
    // tokens the block is reused from cache, and the next one arrives in time.
    if (re < row_end) {
      const std::byte* next = w.row(re);
      const std::size_t bytes = std::min(row_end - re, rows_per_block) * w.row_bytes();
      for (std::size_t off = 0; off < bytes; off += 64) __builtin_prefetch(next + off, 0, 2);
    }
    std::size_t t = 0;
    for (; t + max_tile_tokens <= n_tokens; t += max_tile_tokens)
      run_token_tile<max_tile_tokens>(w, p, rb, re, t, y, y_stride);
    switch (n_tokens - t) {
      case 0: break;
      case 1: run_token_tile<1>(w, p, rb, re, t, y, y_stride); break;
      case 2: run_token_tile<2>(w, p, rb, re, t, y, y_stride); break;
      case 3: run_token_tile<3>(w, p, rb, re, t, y, y_stride); break;
      default: EXA_ASSERT(false);
    }
  }
}

}  // namespace

struct activations_access {
  static prepared view(const activations& a) {
    prepared p;
    p.xf = a.xf_;
    p.xf_stride = a.xf_stride_;
#if defined(EXA_QUANT_AVX512)
    p.q.xu = a.xu_.data();
    p.q.xu_stride = (a.k_ / 32 + 1) / 2 * 64;
    p.q.xd = a.xd_.data();
    p.q.xd_stride = (a.k_ / 32 + 1) / 2 * 16;
#else
    p.q.xq = a.xq_.data();
    p.q.xq_stride = a.k_ / 32;
#endif
    p.xk = a.xk_.data();
    p.xk_stride = a.k_ / model::qk_k;
    p.x32 = a.format_ == act_format::q8_1 ? static_cast<const void*>(a.x1_.data()) : a.xq_.data();
    p.x32_stride = a.k_ / 32;
    return p;
  }
  static void quantize_token(activations& a, const float* x, std::size_t t);
};

act_format act_format_for(model::tensor_type t) noexcept {
  switch (t) {
    case tensor_type::f32: return act_format::f32;
    case tensor_type::f16: return act_format::f16_rounded;
    case tensor_type::bf16: return act_format::bf16_rounded;
    case tensor_type::q8_0:
    case tensor_type::q4_0:
    case tensor_type::q5_0: return act_format::q8_0;
    case tensor_type::q4_1:
    case tensor_type::q5_1: return act_format::q8_1;
    case tensor_type::q4_K:
    case tensor_type::q5_K:
    case tensor_type::q6_K: return act_format::q8_K;
  }
  return act_format::f32;
}

void quantize_row_q8_0_fast(const float* x, model::block_q8_0* out, std::size_t n) noexcept {
#if defined(EXA_QUANT_AVX512)
  EXA_ASSERT(n % 32 == 0);
  const __m512 sign_mask = _mm512_set1_ps(-0.0f);
  for (std::size_t b = 0; b < n / 32; ++b) {
    const __m512 v0 = _mm512_loadu_ps(x + b * 32), v1 = _mm512_loadu_ps(x + b * 32 + 16);
    const __m512 a = _mm512_max_ps(_mm512_andnot_ps(sign_mask, v0), _mm512_andnot_ps(sign_mask, v1));
    const float amax = _mm512_reduce_max_ps(a);  // max is exact in any order
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = model::float_to_f16(d);
    for (int h = 0; h < 2; ++h) {
      // roundf exactly: trunc, then away from zero when the fraction is >= 0.5
      // (x - trunc(x) is exact for |x| < 2^23).
      const __m512 s = _mm512_mul_ps(h ? v1 : v0, _mm512_set1_ps(id));
      const __m512 t = _mm512_roundscale_ps(s, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      const __m512 frac = _mm512_andnot_ps(sign_mask, _mm512_sub_ps(s, t));
      const __mmask16 up = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
      const __m512 one = _mm512_or_ps(_mm512_set1_ps(1.0f), _mm512_and_ps(s, sign_mask));
      const __m512 r = _mm512_mask_add_ps(t, up, t, one);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out[b].qs + 16 * h),
                       _mm512_cvtsepi32_epi8(_mm512_cvttps_epi32(r)));
    }
  }
#else
  model::quantize_row_q8_0(x, out, n);
#endif
}

void activations_access::quantize_token(activations& a, const float* x, std::size_t t) {
  const std::size_t nb = a.k_ / 32;
  model::block_q8_0* blocks = a.xq_.data() + t * nb;
  quantize_row_q8_0_fast(x, blocks, a.k_);
#if defined(EXA_QUANT_AVX512)
  const std::size_t steps = (nb + 1) / 2;
  std::uint8_t* u = a.xu_.data() + t * steps * 64;
  float* d = a.xd_.data() + t * steps * 16;
  for (std::size_t b = 0; b < nb; ++b) {
    for (int i = 0; i < 32; ++i) u[b * 32 + i] = static_cast<std::uint8_t>(blocks[b].qs[i] + 128);
    const float scale = model::f16_to_float(blocks[b].d);
    for (int i = 0; i < 8; ++i) d[b * 8 + i] = scale;
  }
#endif
}

void activations::convert(model::tensor_type type, const float* x, std::size_t x_stride,
                          std::size_t n_tokens, std::size_t k, thread_pool* pool) {
  format_ = act_format_for(type);
  n_tokens_ = n_tokens;
  k_ = k;
  const auto each_token = [&](auto&& fn) {
    if (pool) pool->parallel_for(n_tokens, 1, [&](std::size_t b, std::size_t e) { for (auto t = b; t < e; ++t) fn(t); });
    else for (std::size_t t = 0; t < n_tokens; ++t) fn(t);
  };
  switch (format_) {
    case act_format::f32:
      xf_ = x;
      xf_stride_ = x_stride;
      return;
    case act_format::f16_rounded:
    case act_format::bf16_rounded: {
      // llama.cpp multiplies f16/bf16 weights with activations rounded to the
      // same precision; so do we.
      xf_store_.resize(n_tokens * k);
      const bool half = format_ == act_format::f16_rounded;
      each_token([&](std::size_t t) {
        for (std::size_t i = 0; i < k; ++i) {
          const float v = x[t * x_stride + i];
          xf_store_[t * k + i] = half ? model::f16_to_float(model::float_to_f16(v))
                                      : model::bf16_to_float(model::float_to_bf16(v));
        }
      });
      xf_ = xf_store_.data();
      xf_stride_ = k;
      return;
    }
    case act_format::q8_0: {
      EXA_ASSERT_MSG(k % 32 == 0, "quantized matmul needs a width divisible by 32");
      xq_.resize(n_tokens * (k / 32));
#if defined(EXA_QUANT_AVX512)
      const std::size_t steps = (k / 32 + 1) / 2;
      xu_.assign(n_tokens * steps * 64, 128);  // an odd block count pads with q = 0
      xd_.assign(n_tokens * steps * 16, 0.0f);
#endif
      each_token([&](std::size_t t) { activations_access::quantize_token(*this, x + t * x_stride, t); });
      return;
    }
    case act_format::q8_1: {
      EXA_ASSERT_MSG(k % 32 == 0, "quantized matmul needs a width divisible by 32");
      x1_.resize(n_tokens * (k / 32));
      each_token([&](std::size_t t) { model::quantize_row_q8_1(x + t * x_stride, x1_.data() + t * (k / 32), k); });
      return;
    }
    case act_format::q8_K: {
      EXA_ASSERT_MSG(k % model::qk_k == 0, "K-quant matmul needs a width divisible by 256");
      const std::size_t nb = k / model::qk_k;
      xk_.resize(n_tokens * nb);
      each_token([&](std::size_t t) { model::quantize_row_q8_K(x + t * x_stride, xk_.data() + t * nb, k); });
      return;
    }
  }
}


void matmul_rows(const model::weight_view& w, const activations& a, float* y, std::size_t y_stride,
                 std::size_t row_begin, std::size_t row_end) {
  EXA_ASSERT(row_begin <= row_end && row_end <= w.rows);
  EXA_ASSERT_MSG(a.serves(w.type, w.cols) || a.tokens() == 0, "activations converted for another weight");
  if (a.tokens() == 0) return;
  compute_rows(w, activations_access::view(a), a.tokens(), y, y_stride, row_begin, row_end);
}

void matmul(const model::weight_view& w, const activations& a, float* y, std::size_t y_stride,
            thread_pool& pool) {
  if (a.tokens() == 0) return;
  EXA_ASSERT_MSG(a.serves(w.type, w.cols), "activations converted for another weight");
  const prepared p = activations_access::view(a);
  // Threads take groups of whole tiles, enough rows to be worth a wake-up.
  constexpr std::size_t group = 2 * row_multiple;
  pool.parallel_for((w.rows + group - 1) / group, 1, [&](std::size_t begin, std::size_t end) {
    compute_rows(w, p, a.tokens(), y, y_stride, begin * group, std::min<std::size_t>(end * group, w.rows));
  });
}

void matmul(const model::weight_view& w, const float* x, std::size_t x_stride, std::size_t n_tokens,
            float* y, std::size_t y_stride, thread_pool& pool, activations& scratch) {
  if (n_tokens == 0) return;
  scratch.convert(w.type, x, x_stride, n_tokens, w.cols, &pool);
  matmul(w, scratch, y, y_stride, pool);
}

void dequantize_row(const model::weight_view& w, std::size_t r, float* out) noexcept {
  model::dequantize_row(w.type, w.row(r), std::span<float>(out, w.cols));
}

}  // namespace exa::engine
