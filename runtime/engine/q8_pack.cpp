#include "engine/q8_pack.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/assert.hpp"
#include "model/legacy_quants.hpp"
#include "model/quantize.hpp"

namespace exa::engine {

void q8p_pack_rows(const model::weight_view& w, std::size_t row_begin, std::size_t row_end,
                   std::byte* out) noexcept {
  EXA_ASSERT(w.type == model::tensor_type::q8_0 && row_begin <= row_end && row_end <= w.rows);
  const std::size_t nb = w.cols / 32;
  const std::size_t groups = (row_end - row_begin + q8p_group_rows - 1) / q8p_group_rows;
  for (std::size_t g = 0; g < groups; ++g) {
    std::byte* group = out + g * q8p_group_bytes(w.cols);
    for (std::size_t b = 0; b < nb; ++b) {
      auto* q = reinterpret_cast<std::uint8_t*>(group + b * q8p_block_bytes);
      std::uint16_t scales[q8p_group_rows] = {};
      std::memset(q, 0x80, q8p_quant_bytes);  // padding rows: q = 0
      for (std::size_t i = 0; i < q8p_group_rows; ++i) {
        const std::size_t r = row_begin + g * q8p_group_rows + i;
        if (r >= row_end) break;
        const auto& blk = reinterpret_cast<const model::block_q8_0*>(w.row(r))[b];
        scales[i] = blk.d;
        for (std::size_t j = 0; j < 8; ++j) {  // 4 bytes at a time, each q + 128
          std::uint32_t word;
          std::memcpy(&word, blk.qs + 4 * j, 4);
          word ^= 0x80808080u;
          std::memcpy(q + 64 * j + 4 * i, &word, 4);
        }
      }
      std::memcpy(q + q8p_quant_bytes, scales, sizeof scales);
    }
  }
}

const std::byte* q8p_rows(const model::weight_view& w, std::size_t row_begin, std::size_t row_end) {
  if (w.packed != nullptr && row_begin % q8p_group_rows == 0)
    return w.packed + row_begin / q8p_group_rows * q8p_group_bytes(w.cols);
  static thread_local std::vector<std::byte> scratch;
  scratch.resize((row_end - row_begin + q8p_group_rows - 1) / q8p_group_rows * q8p_group_bytes(w.cols));
  q8p_pack_rows(w, row_begin, row_end, scratch.data());
  return scratch.data();
}

}  // namespace exa::engine
