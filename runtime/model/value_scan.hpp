#pragma once
// Reads every value of a GGUF file's tensors, as the engine will see them
// (dequantized), and finds the ones that are not finite: NaN or infinite
// values, or a block scale that makes its block so. Such a file makes the
// engine stop requests with finish_reason::nonfinite_logits; this says which
// tensor and row to blame before it serves (`exaserve check-model`).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/gguf.hpp"

namespace exa::model {

struct tensor_values {
  std::string name;
  std::uint64_t values = 0;
  /// NaN or infinite values after dequantization.
  std::uint64_t nonfinite = 0;
  /// The first one's row (index over the dimensions after the first) and column.
  std::uint64_t first_row = 0, first_col = 0;
  /// Values a block of the tensor's type holds (1 for float types, 32 or 256
  /// for quantized ones), and the blocks holding a non-finite value. In a
  /// quantized type the values are integers times the block's f16 scale (and
  /// minus its f16 min), so a non-finite value means those fields are.
  std::uint64_t block_values = 1;
  std::uint64_t nonfinite_blocks = 0;
  /// Whether the type's blocks have a min field as well (has_block_min).
  bool block_min = false;
  /// The largest finite magnitude (0 when none).
  float max_abs = 0;
};

struct value_scan {
  std::uint64_t tensors = 0, values = 0, bytes = 0;
  /// Every tensor read, in file order.
  std::vector<tensor_values> read;
  /// Tensors of a type the engine cannot read, by name (not scanned).
  std::vector<std::string> skipped;

  std::uint64_t nonfinite() const noexcept;
};

/// Scans every tensor of `f`. `progress(done_bytes, total_bytes)` is called
/// after each tensor and every 64 MiB within one.
value_scan scan_values(const gguf_file& f,
                       const std::function<void(std::uint64_t done, std::uint64_t total)>& progress = {});

}  // namespace exa::model
