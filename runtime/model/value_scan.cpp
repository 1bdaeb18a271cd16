#include "model/value_scan.hpp"

#include <algorithm>
#include <cmath>
#include <span>

#include "model/quantize.hpp"
#include "model/tensor_type.hpp"

namespace exa::model {

namespace {
constexpr std::uint64_t chunk = 1u << 16;  // values a piece; 256 | chunk, and 256 is the largest block
}  // namespace

std::uint64_t value_scan::nonfinite() const noexcept {
  std::uint64_t n = 0;
  for (const auto& t : read) n += t.nonfinite;
  return n;
}

value_scan scan_values(const gguf_file& f, const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  value_scan out;
  std::uint64_t total = 0;
  for (const auto& t : f.tensors())
    if (t.type) total += t.size_bytes;
  constexpr std::uint64_t report_every = 64ull << 20;
  std::uint64_t done = 0, next_report = report_every;
  std::vector<float> row;
  for (const auto& t : f.tensors()) {
    if (!t.type || t.shape.empty() || t.shape[0] == 0) {
      out.skipped.push_back(t.name);
      continue;
    }
    const std::uint64_t cols = t.shape[0];
    const std::uint64_t rows = t.elements() / cols;
    const std::size_t pitch = row_bytes(*t.type, static_cast<std::size_t>(cols));
    tensor_values tv;
    tv.name = t.name;
    tv.values = rows * cols;
    tv.block_values = block_elems(*t.type);
    tv.block_min = has_block_min(*t.type);
    std::uint64_t last_bad_block = ~std::uint64_t{0};  // a block's index over the whole tensor
    // A row in pieces of at most `chunk` values (a multiple of every block
    // size): a file may hold one row of billions.
    const std::uint64_t piece = std::min<std::uint64_t>(cols, chunk);
    row.resize(static_cast<std::size_t>(piece));
    for (std::uint64_t r = 0; r < rows; ++r) {
      for (std::uint64_t c0 = 0; c0 < cols; c0 += piece) {
        const std::size_t n = static_cast<std::size_t>(std::min(piece, cols - c0));
        dequantize_row(*t.type, t.data + r * pitch + row_bytes(*t.type, static_cast<std::size_t>(c0)),
                       std::span<float>(row.data(), n));
        for (std::size_t c = 0; c < n; ++c) {
          const float v = std::fabs(row[c]);
          if (std::isfinite(v)) {
            tv.max_abs = std::max(tv.max_abs, v);
          } else {
            if (tv.nonfinite++ == 0) {
              tv.first_row = r;
              tv.first_col = c0 + c;
            }
            // Rows hold whole blocks (row_bytes), so blocks count row by row.
            const std::uint64_t b = (r * cols + c0 + c) / tv.block_values;
            if (b != last_bad_block) ++tv.nonfinite_blocks, last_bad_block = b;
          }
        }
      }
      done += pitch;
      if (progress && done >= next_report) {
        progress(done, total);
        next_report = done + report_every;
      }
    }
    ++out.tensors;
    out.values += tv.values;
    out.bytes += t.size_bytes;
    out.read.push_back(std::move(tv));
    if (progress) progress(done, total);
  }
  return out;
}

}  // namespace exa::model
