#include "model/legacy_quants.hpp"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "common/assert.hpp"
#include "model/half.hpp"
#include "model/quantize.hpp"

namespace exa::model {

namespace {

constexpr std::size_t half_block = legacy_block_elems / 2;

// Smallest and largest value of a block (Q4_1/Q5_1's range).
void block_range(const float* x, float& min, float& max) noexcept {
  min = FLT_MAX;
  max = -FLT_MAX;
  for (std::size_t j = 0; j < legacy_block_elems; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
}

// Packs 32 five-bit levels: low nibbles as Q4_0, fifth bits into qh.
void pack_q5(const std::uint8_t* L, std::uint8_t* qs, std::uint8_t* qh) noexcept {
  std::uint32_t bits = 0;
  for (std::size_t j = 0; j < half_block; ++j) {
    qs[j] = static_cast<std::uint8_t>((L[j] & 0x0f) | ((L[j + half_block] & 0x0f) << 4));
    bits |= static_cast<std::uint32_t>((L[j] >> 4) & 1) << j;
    bits |= static_cast<std::uint32_t>((L[j + half_block] >> 4) & 1) << (j + half_block);
  }
  for (int b = 0; b < 4; ++b) qh[b] = static_cast<std::uint8_t>(bits >> (8 * b));
}

// Level of element j (0..31) of a Q5 block.
int q5_level(const std::uint8_t* qs, const std::uint8_t* qh, int j) noexcept {
  const int nib = j < 16 ? (qs[j] & 0x0f) : (qs[j - 16] >> 4);
  return nib | q5_high_bit(qh, j);
}

}  // namespace

void quantize_row_q4_1(const float* x, block_q4_1* y, std::size_t n) noexcept {
  EXA_ASSERT(n % legacy_block_elems == 0);
  for (std::size_t b = 0; b < n / legacy_block_elems; ++b, x += legacy_block_elems) {
    float min, max;
    block_range(x, min, max);
    const float d = (max - min) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = float_to_f16(d);
    y[b].m = float_to_f16(min);
    for (std::size_t j = 0; j < half_block; ++j) {
      // ggml truncates (x − min)/d + 0.5 through int8, then caps at 15.
      const int q0 = std::min(15, static_cast<int>(static_cast<std::int8_t>((x[j] - min) * id + 0.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<std::int8_t>((x[j + half_block] - min) * id + 0.5f)));
      y[b].qs[j] = static_cast<std::uint8_t>(q0 | (q1 << 4));
    }
  }
}

void quantize_row_q5_0(const float* x, block_q5_0* y, std::size_t n) noexcept {
  EXA_ASSERT(n % legacy_block_elems == 0);
  for (std::size_t b = 0; b < n / legacy_block_elems; ++b, x += legacy_block_elems) {
    // As Q4_0: the value of largest magnitude maps exactly to level 0 (−16).
    float amax = 0.0f, max = 0.0f;
    for (std::size_t j = 0; j < legacy_block_elems; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = float_to_f16(d);
    std::uint8_t L[legacy_block_elems];
    for (std::size_t j = 0; j < legacy_block_elems; ++j)
      L[j] = static_cast<std::uint8_t>(std::min(31, static_cast<int>(static_cast<std::int8_t>(x[j] * id + 16.5f))));
    pack_q5(L, y[b].qs, y[b].qh);
  }
}

void quantize_row_q5_1(const float* x, block_q5_1* y, std::size_t n) noexcept {
  EXA_ASSERT(n % legacy_block_elems == 0);
  for (std::size_t b = 0; b < n / legacy_block_elems; ++b, x += legacy_block_elems) {
    float min, max;
    block_range(x, min, max);
    const float d = (max - min) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = float_to_f16(d);
    y[b].m = float_to_f16(min);
    std::uint8_t L[legacy_block_elems];
    for (std::size_t j = 0; j < legacy_block_elems; ++j) L[j] = static_cast<std::uint8_t>((x[j] - min) * id + 0.5f);
    pack_q5(L, y[b].qs, y[b].qh);
  }
}

void quantize_row_q8_1(const float* x, block_q8_1* y, std::size_t n) noexcept {
  EXA_ASSERT(n % legacy_block_elems == 0);
  for (std::size_t b = 0; b < n / legacy_block_elems; ++b, x += legacy_block_elems) {
    const std::uint32_t amax_bits = abs_max_bits(x, legacy_block_elems);
    if (amax_bits >= f32_inf_bits) {  // as q8_0: a NaN through every product
      y[b].d = y[b].s = q8_nonfinite_scale;
      std::memset(y[b].qs, 0, sizeof y[b].qs);
      continue;
    }
    const float d = std::bit_cast<float>(amax_bits) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = float_to_f16(d);
    int sum = 0;
    for (std::size_t j = 0; j < legacy_block_elems; ++j) {
      y[b].qs[j] = static_cast<std::int8_t>(std::roundf(x[j] * id));
      sum += y[b].qs[j];
    }
    y[b].s = float_to_f16(static_cast<float>(sum) * d);
  }
}

void dequantize_row_q4_1(const block_q4_1* x, float* y, std::size_t n) noexcept {
  EXA_ASSERT(n % legacy_block_elems == 0);
  for (std::size_t b = 0; b < n / legacy_block_elems; ++b, y += legacy_block_elems) {
    const float d = f16_to_float(x[b].d), m = f16_to_float(x[b].m);
    for (std::size_t j = 0; j < half_block; ++j) {
      y[j] = static_cast<float>(x[b].qs[j] & 0x0f) * d + m;
      y[j + half_block] = static_cast<float>(x[b].qs[j] >> 4) * d + m;
    }
  }
}

void dequantize_row_q5_0(const block_q5_0* x, float* y, std::size_t n) noexcept {
  EXA_ASSERT(n % legacy_block_elems == 0);
  for (std::size_t b = 0; b < n / legacy_block_elems; ++b, y += legacy_block_elems) {
    const float d = f16_to_float(x[b].d);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q5_level(x[b].qs, x[b].qh, j) - 16) * d;
  }
}

void dequantize_row_q5_1(const block_q5_1* x, float* y, std::size_t n) noexcept {
  EXA_ASSERT(n % legacy_block_elems == 0);
  for (std::size_t b = 0; b < n / legacy_block_elems; ++b, y += legacy_block_elems) {
    const float d = f16_to_float(x[b].d), m = f16_to_float(x[b].m);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q5_level(x[b].qs, x[b].qh, j)) * d + m;
  }
}

}  // namespace exa::model
