#pragma once
// One tensor-parallel member's share of a Llama model's weights, Megatron
// style. Column-parallel Q, K, V, gate and up: the member owns a contiguous
// range of output rows (n_heads / G query heads, n_kv_heads / G KV heads,
// ff / G MLP rows) and its views point into the file's mapping (no copy), as
// do its Q/K/V bias slices. Row-parallel O and down: the member owns the
// matching input columns, repacked here into buffers of its own (a column
// range of a row is not contiguous in the file), cut on whole quant blocks so
// every block stays intact. Embedding, norms, the O bias and the output head
// are shared by every member.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/error.hpp"
#include "model/llama_config.hpp"
#include "model/llama_weights.hpp"

namespace exa::engine {

/// The most members a tensor-parallel group may have.
inline constexpr std::uint32_t max_tensor_parallel = 64;

/// Whether `config`/`weights` split evenly over `tp` members: head count, KV
/// head count and ff size divisible by tp, and each row-parallel weight's
/// share of input columns a whole number of its quant blocks (32 elements for
/// q8_0, 256 for K-quants). Errors: invalid_argument naming the dimension,
/// its size and the divisor (tp 0 or above max_tensor_parallel too).
expected<void> check_tp_split(const model::llama_config& config, const model::llama_weights& weights,
                              std::uint32_t tp);

class tp_weights {
 public:
  /// Member `rank` of `size`'s weights. `weights` (and the file it maps) must
  /// outlive the result. Errors: those of check_tp_split, and
  /// invalid_argument for a rank outside [0, size).
  static expected<tp_weights> shard(const model::llama_config& config, const model::llama_weights& weights,
                                    std::uint32_t rank, std::uint32_t size);

  const model::llama_weights& weights() const noexcept { return weights_; }
  std::uint32_t rank() const noexcept { return rank_; }
  std::uint32_t size() const noexcept { return size_; }
  /// Bytes this member copied (its O and down columns).
  std::size_t owned_bytes() const noexcept { return owned_bytes_; }

 private:
  struct aligned_free {
    void operator()(std::byte* p) const noexcept;
  };
  using buffer = std::unique_ptr<std::byte[], aligned_free>;

  /// Member's columns [begin, begin + count) of every row of `w`, copied.
  model::weight_view repack_cols(const model::weight_view& w, std::uint64_t begin, std::uint64_t count);

  model::llama_weights weights_;
  std::vector<buffer> owned_;  // heap buffers: views stay valid when this moves
  std::size_t owned_bytes_ = 0;
  std::uint32_t rank_ = 0;
  std::uint32_t size_ = 1;
};

}  // namespace exa::engine
