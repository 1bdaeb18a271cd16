#include "engine/matmul.hpp"

#include <algorithm>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "common/assert.hpp"
#include "engine/kernel_table.hpp"
#include "engine/q8_pack.hpp"
#include "engine/row_blocks.hpp"
#include "engine/thread_pool.hpp"
#include "model/half.hpp"
#include "model/quantize.hpp"

namespace exa::engine {
namespace {

using model::tensor_type;

}  // namespace

struct activations_access {
  static kernel_acts view(const activations& a) {
    kernel_acts p;
    p.xf = a.xf_;
    p.xf_stride = a.xf_stride_;
    p.xq = a.xq_.data();
    p.xq_stride = a.k_ / 32;
    p.xs = a.xs_.data();
    p.xseed = a.xseed_.data();
    p.xu = a.xu_.data();
    p.xu_stride = (a.k_ / 32 + 1) / 2 * 64;
    p.xd = a.xd_.data();
    p.xd_stride = (a.k_ / 32 + 1) / 2 * 16;
    p.xc = a.xc_.data();
    p.xk = a.xk_.data();
    p.xk_stride = a.k_ / model::qk_k;
    p.x32 = a.format_ == act_format::q8_1 ? static_cast<const void*>(a.x1_.data()) : a.xq_.data();
    p.x32_stride = a.k_ / 32;
    return p;
  }
  static void quantize_token(activations& a, const float* x, std::size_t t);
  static const kernel_table& table(const activations& a) { return *a.kernels_; }
};

bool activations::q4_layout_needed() const noexcept { return kernels_ != nullptr && kernels_->q8_0_unsigned_layout; }

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
  EXA_ASSERT(n % 32 == 0);
  active_kernels().quantize_q8_0(x, out, n);
}

namespace {
// Σ of a block's 32 signed bytes, exact: psadbw sums unsigned bytes, so each
// is read as q + 128 (SSE2: every x86-64).
std::int32_t block_sum(const std::int8_t* q) noexcept {
#if defined(__SSE2__)
  const __m128i flip = _mm_set1_epi8(static_cast<char>(0x80));
  const __m128i lo = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)), flip);
  const __m128i hi = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16)), flip);
  const __m128i sad = _mm_add_epi64(_mm_sad_epu8(lo, _mm_setzero_si128()), _mm_sad_epu8(hi, _mm_setzero_si128()));
  const std::int64_t sum = _mm_cvtsi128_si64(sad) + _mm_cvtsi128_si64(_mm_unpackhi_epi64(sad, sad));
  return static_cast<std::int32_t>(sum) - 128 * 32;
#else
  std::int32_t sum = 0;
  for (int i = 0; i < 32; ++i) sum += q[i];
  return sum;
#endif
}
}  // namespace

void activations_access::quantize_token(activations& a, const float* x, std::size_t t) {
  const std::size_t nb = a.k_ / 32;
  model::block_q8_0* blocks = a.xq_.data() + t * nb;
  a.kernels_->quantize_q8_0(x, blocks, a.k_);
  float* scales = a.xs_.data() + t * nb;
  std::int32_t* seeds = a.xseed_.data() + t * nb;
  for (std::size_t b = 0; b < nb; ++b) {
    scales[b] = model::f16_to_float(blocks[b].d);
    seeds[b] = -128 * block_sum(blocks[b].qs);
  }
  if (!a.q4_layout_) return;
  const std::size_t steps = (nb + 1) / 2;
  auto* u = reinterpret_cast<std::int8_t*>(a.xu_.data()) + t * steps * 64;
  float* d = a.xd_.data() + t * steps * 16;
  std::int32_t* c = a.xc_.data() + t * steps * 16;
  for (std::size_t b = 0; b < nb; ++b) {
    std::memcpy(u + b * 32, blocks[b].qs, 32);
    // vpdpbusd multiplies unsigned by signed bytes: the kernel feeds w + 128
    // and seeds each lane with −128 · (its 4 activations' sum), exactly.
    for (int l = 0; l < 8; ++l)
      c[b * 8 + l] = -128 * (blocks[b].qs[4 * l] + blocks[b].qs[4 * l + 1] + blocks[b].qs[4 * l + 2] +
                             blocks[b].qs[4 * l + 3]);
    const float scale = model::f16_to_float(blocks[b].d);
    for (int i = 0; i < 8; ++i) d[b * 8 + i] = scale;
  }
}

void activations::convert(model::tensor_type type, const float* x, std::size_t x_stride,
                          std::size_t n_tokens, std::size_t k, thread_pool* pool) {
  format_ = act_format_for(type);
  kernels_ = &active_kernels();
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
        if (half) return kernels_->round_f16(x + t * x_stride, xf_store_.data() + t * k, k);
        for (std::size_t i = 0; i < k; ++i)
          xf_store_[t * k + i] = model::bf16_to_float(model::float_to_bf16(x[t * x_stride + i]));
      });
      xf_ = xf_store_.data();
      xf_stride_ = k;
      return;
    }
    case act_format::q8_0: {
      EXA_ASSERT_MSG(k % 32 == 0, "quantized matmul needs a width divisible by 32");
      xq_.resize(n_tokens * (k / 32));
      xs_.resize(n_tokens * (k / 32));
      xseed_.resize(n_tokens * (k / 32));
      // The AVX-512 q4_0 kernel's own layout, only for q4_0 weights.
      q4_layout_ = kernels_->q8_0_unsigned_layout && type == tensor_type::q4_0;
      if (q4_layout_) {
        const std::size_t steps = (k / 32 + 1) / 2;
        xu_.assign(n_tokens * steps * 64, 0);  // an odd block count pads with q = 0
        xd_.assign(n_tokens * steps * 16, 0.0f);
        xc_.assign(n_tokens * steps * 16, 0);
      }
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
  activations_access::table(a).rows(w, activations_access::view(a), a.tokens(), y, y_stride, row_begin, row_end);
}

namespace {

// Threads take chunks of whole tiles: units of 24 rows, which every tile
// height divides, so only a matrix's last rows fall to 1-row tiles. Units
// of 96 rows split 256 rows 160 : 96 between two threads, 25 % over an even
// share. Q8_0 runs 16-row groups (q8_pack.hpp): units of 16 keep each chunk
// on whole groups of the packed copy.
std::size_t row_unit(const model::weight_view& w) noexcept {
  return w.type == tensor_type::q8_0 ? q8p_group_rows : row_multiple / 2;
}

// How many chunks a thread's share is cut into: a prefill's many tokens
// make each unit a lot of work, so small chunks (16 a thread) cost little
// and even out an uneven core. A batch of decodes (4-64 tokens) streams
// each chunk's weights from memory once, and the tiles prefetch the next
// rows only within a chunk (q8p: the next pair of groups; float tiles: the
// next row block): 2 a thread keep those streams long. Alternated pairs on
// the Emerald Rapids host, 2 threads, batch 32 against 16 a thread: q8_0
// 1.15x, f32 1.11x, f16 1.16x; against 4 a thread, q8_0 1.16x, f32 1.04x;
// 8 a thread was slower than 4 (0.93x). One or two tokens: 4 a thread.
// (One thread runs the whole matrix as one chunk whatever this says.)
std::size_t chunks_per_thread(std::size_t tokens) noexcept { return tokens < 4 ? 4 : tokens <= 64 ? 2 : 16; }

}  // namespace

void matmul(const model::weight_view& w, const activations& a, float* y, std::size_t y_stride,
            thread_pool& pool) {
  const matmul_target one{&w, y, y_stride};
  matmul_many(std::span<const matmul_target>(&one, 1), a, pool);
}

void matmul_many(std::span<const matmul_target> targets, const activations& a, thread_pool& pool) {
  if (a.tokens() == 0 || targets.empty()) return;
  const kernel_acts p = activations_access::view(a);
  const kernel_table& k = activations_access::table(a);
  // Each target's units, numbered one after another.
  constexpr std::size_t max_targets = 4;
  EXA_ASSERT_MSG(targets.size() <= max_targets, "matmul_many takes at most 4 matrices");
  std::size_t first[max_targets + 1] = {};
  for (std::size_t i = 0; i < targets.size(); ++i) {
    const model::weight_view& w = *targets[i].w;
    EXA_ASSERT_MSG(a.serves(w.type, w.cols), "activations converted for another weight");
    first[i + 1] = first[i] + (w.rows + row_unit(w) - 1) / row_unit(w);
  }
  pool.parallel_for(
      first[targets.size()], 1,
      [&](std::size_t begin, std::size_t end) {
        for (std::size_t i = 0; i < targets.size(); ++i) {
          const std::size_t b = std::max(begin, first[i]), e = std::min(end, first[i + 1]);
          if (b >= e) continue;
          const model::weight_view& w = *targets[i].w;
          const std::size_t unit = row_unit(w);
          k.rows(w, p, a.tokens(), targets[i].y, targets[i].y_stride, (b - first[i]) * unit,
                 std::min<std::size_t>((e - first[i]) * unit, w.rows));
        }
      },
      chunks_per_thread(a.tokens()));
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
