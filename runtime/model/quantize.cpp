#include "model/quantize.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/assert.hpp"
#include "model/half.hpp"
#include "model/kquants.hpp"
#include "model/legacy_quants.hpp"

namespace exa::model {

std::uint32_t abs_max_bits(const float* x, std::size_t n) noexcept {
  std::uint32_t m = 0;
  for (std::size_t j = 0; j < n; ++j) m = std::max(m, std::bit_cast<std::uint32_t>(x[j]) & 0x7fffffffu);
  return m;
}

void quantize_row_q8_0(const float* x, block_q8_0* y, std::size_t n) noexcept {
  EXA_ASSERT(n % q8_0_block_elems == 0);
  for (std::size_t b = 0; b < n / q8_0_block_elems; ++b) {
    const float* xb = x + b * q8_0_block_elems;
    const std::uint32_t amax_bits = abs_max_bits(xb, q8_0_block_elems);
    if (amax_bits >= f32_inf_bits) {
      y[b].d = q8_nonfinite_scale;
      std::memset(y[b].qs, 0, sizeof y[b].qs);
      continue;
    }
    const float amax = std::bit_cast<float>(amax_bits);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = float_to_f16(d);
    for (std::size_t j = 0; j < q8_0_block_elems; ++j) {
      y[b].qs[j] = static_cast<std::int8_t>(std::roundf(xb[j] * id));
    }
  }
}

void quantize_row_q4_0(const float* x, block_q4_0* y, std::size_t n) noexcept {
  EXA_ASSERT(n % q4_0_block_elems == 0);
  constexpr std::size_t half = q4_0_block_elems / 2;
  for (std::size_t b = 0; b < n / q4_0_block_elems; ++b) {
    const float* xb = x + b * q4_0_block_elems;
    // ggml keeps the sign of the value of largest magnitude, so that value
    // maps exactly to -8 and the asymmetric range [-8, 7] is used fully.
    float amax = 0.0f;
    float max = 0.0f;
    for (std::size_t j = 0; j < q4_0_block_elems; ++j) {
      if (amax < std::fabs(xb[j])) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = float_to_f16(d);
    for (std::size_t j = 0; j < half; ++j) {
      const float x0 = xb[j] * id;
      const float x1 = xb[half + j] * id;
      const auto q0 = static_cast<std::uint8_t>(std::min(15, static_cast<int>(static_cast<std::int8_t>(x0 + 8.5f))));
      const auto q1 = static_cast<std::uint8_t>(std::min(15, static_cast<int>(static_cast<std::int8_t>(x1 + 8.5f))));
      y[b].qs[j] = static_cast<std::uint8_t>(q0 | (q1 << 4));
    }
  }
}

void dequantize_row_q8_0(const block_q8_0* x, float* y, std::size_t n) noexcept {
  EXA_ASSERT(n % q8_0_block_elems == 0);
  for (std::size_t b = 0; b < n / q8_0_block_elems; ++b) {
    const float d = f16_to_float(x[b].d);
    for (std::size_t j = 0; j < q8_0_block_elems; ++j) {
      y[b * q8_0_block_elems + j] = static_cast<float>(x[b].qs[j]) * d;
    }
  }
}

void dequantize_row_q4_0(const block_q4_0* x, float* y, std::size_t n) noexcept {
  EXA_ASSERT(n % q4_0_block_elems == 0);
  constexpr std::size_t half = q4_0_block_elems / 2;
  for (std::size_t b = 0; b < n / q4_0_block_elems; ++b) {
    const float d = f16_to_float(x[b].d);
    float* yb = y + b * q4_0_block_elems;
    for (std::size_t j = 0; j < half; ++j) {
      yb[j] = static_cast<float>((x[b].qs[j] & 0x0f) - 8) * d;
      yb[half + j] = static_cast<float>((x[b].qs[j] >> 4) - 8) * d;
    }
  }
}

namespace {

// Quantizes/dequantizes a row block by block through an aligned local, since
// tensor bytes inside a file or buffer have no alignment guarantee.
template <class Block, std::size_t Elems, class Fn>
void quantize_blocks(std::span<const float> x, std::byte* out, Fn quantize) noexcept {
  EXA_ASSERT(x.size() % Elems == 0);
  for (std::size_t b = 0; b < x.size() / Elems; ++b) {
    Block blk;
    quantize(x.data() + b * Elems, &blk, Elems);
    std::memcpy(out + b * sizeof blk, &blk, sizeof blk);
  }
}

template <class Block, std::size_t Elems, class Fn>
void dequantize_blocks(const std::byte* in, std::span<float> y, Fn dequantize) noexcept {
  EXA_ASSERT(y.size() % Elems == 0);
  for (std::size_t b = 0; b < y.size() / Elems; ++b) {
    Block blk;
    std::memcpy(&blk, in + b * sizeof blk, sizeof blk);
    dequantize(&blk, y.data() + b * Elems, Elems);
  }
}

}  // namespace

// The byte-pointer entry points copy block by block through a local, because
// tensor data inside a file or buffer has no alignment guarantee for the
// block structs.
void convert_row(std::span<const float> x, tensor_type type, std::byte* out) noexcept {
  const std::size_t n = x.size();
  switch (type) {
    case tensor_type::f32:
      std::memcpy(out, x.data(), n * sizeof(float));
      return;
    case tensor_type::f16:
    case tensor_type::bf16:
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint16_t h = type == tensor_type::f16 ? float_to_f16(x[i]) : float_to_bf16(x[i]);
        std::memcpy(out + i * 2, &h, 2);
      }
      return;
    case tensor_type::q8_0:
      EXA_ASSERT(n % q8_0_block_elems == 0);
      for (std::size_t b = 0; b < n / q8_0_block_elems; ++b) {
        block_q8_0 blk;
        quantize_row_q8_0(x.data() + b * q8_0_block_elems, &blk, q8_0_block_elems);
        std::memcpy(out + b * sizeof blk, &blk, sizeof blk);
      }
      return;
    case tensor_type::q4_0:
      EXA_ASSERT(n % q4_0_block_elems == 0);
      for (std::size_t b = 0; b < n / q4_0_block_elems; ++b) {
        block_q4_0 blk;
        quantize_row_q4_0(x.data() + b * q4_0_block_elems, &blk, q4_0_block_elems);
        std::memcpy(out + b * sizeof blk, &blk, sizeof blk);
      }
      return;
    case tensor_type::q4_1: return quantize_blocks<block_q4_1, legacy_block_elems>(x, out, quantize_row_q4_1);
    case tensor_type::q5_0: return quantize_blocks<block_q5_0, legacy_block_elems>(x, out, quantize_row_q5_0);
    case tensor_type::q5_1: return quantize_blocks<block_q5_1, legacy_block_elems>(x, out, quantize_row_q5_1);
    case tensor_type::q4_K: return quantize_blocks<block_q4_K, qk_k>(x, out, quantize_row_q4_K);
    case tensor_type::q5_K: return quantize_blocks<block_q5_K, qk_k>(x, out, quantize_row_q5_K);
    case tensor_type::q6_K: return quantize_blocks<block_q6_K, qk_k>(x, out, quantize_row_q6_K);
  }
  EXA_ASSERT_MSG(false, "convert_row: tensor_type outside the enum");
}

void dequantize_row(tensor_type type, const std::byte* in, std::span<float> y) noexcept {
  const std::size_t n = y.size();
  switch (type) {
    case tensor_type::f32:
      std::memcpy(y.data(), in, n * sizeof(float));
      return;
    case tensor_type::f16:
    case tensor_type::bf16:
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t h = 0;
        std::memcpy(&h, in + i * 2, 2);
        y[i] = type == tensor_type::f16 ? f16_to_float(h) : bf16_to_float(h);
      }
      return;
    case tensor_type::q8_0:
      EXA_ASSERT(n % q8_0_block_elems == 0);
      for (std::size_t b = 0; b < n / q8_0_block_elems; ++b) {
        block_q8_0 blk;
        std::memcpy(&blk, in + b * sizeof blk, sizeof blk);
        dequantize_row_q8_0(&blk, y.data() + b * q8_0_block_elems, q8_0_block_elems);
      }
      return;
    case tensor_type::q4_0:
      EXA_ASSERT(n % q4_0_block_elems == 0);
      for (std::size_t b = 0; b < n / q4_0_block_elems; ++b) {
        block_q4_0 blk;
        std::memcpy(&blk, in + b * sizeof blk, sizeof blk);
        dequantize_row_q4_0(&blk, y.data() + b * q4_0_block_elems, q4_0_block_elems);
      }
      return;
    case tensor_type::q4_1: return dequantize_blocks<block_q4_1, legacy_block_elems>(in, y, dequantize_row_q4_1);
    case tensor_type::q5_0: return dequantize_blocks<block_q5_0, legacy_block_elems>(in, y, dequantize_row_q5_0);
    case tensor_type::q5_1: return dequantize_blocks<block_q5_1, legacy_block_elems>(in, y, dequantize_row_q5_1);
    case tensor_type::q4_K: return dequantize_blocks<block_q4_K, qk_k>(in, y, dequantize_row_q4_K);
    case tensor_type::q5_K: return dequantize_blocks<block_q5_K, qk_k>(in, y, dequantize_row_q5_K);
    case tensor_type::q6_K: return dequantize_blocks<block_q6_K, qk_k>(in, y, dequantize_row_q6_K);
  }
  EXA_ASSERT_MSG(false, "dequantize_row: tensor_type outside the enum");
}

}  // namespace exa::model
