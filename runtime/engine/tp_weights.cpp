#include "engine/tp_weights.hpp"

#include <cstring>
#include <new>
#include <optional>
#include <string>

#include "common/assert.hpp"
#include "model/tensor_type.hpp"

namespace exa::engine {
namespace {

constexpr std::align_val_t buffer_alignment{64};

std::string str(std::uint64_t v) { return std::to_string(v); }

expected<void> divisible(std::string_view what, std::uint64_t n, std::uint32_t tp) {
  if (n % tp == 0) return {};
  return make_error(errc::invalid_argument, std::string(what) + " (" + str(n) +
                                                ") is not divisible by the tensor-parallel size " + str(tp));
}

// A row-parallel weight's share of input columns must be whole quant blocks.
expected<void> whole_blocks(const model::weight_view& w, std::uint32_t tp) {
  if (auto ok = divisible(w.name + " input columns", w.cols, tp); !ok) return ok;
  const std::uint64_t share = w.cols / tp;
  const std::size_t block = model::block_elems(w.type);
  if (share % block == 0) return {};
  return make_error(errc::invalid_argument,
                    w.name + " (" + std::string(model::to_string(w.type)) + ") would give each of " + str(tp) +
                        " members " + str(share) + " of its " + str(w.cols) +
                        " input columns, not a multiple of its " + str(block) + "-element quant blocks");
}

// Rows [begin, begin + count): contiguous in the file, so a view.
model::weight_view slice_rows(const model::weight_view& w, std::uint64_t begin, std::uint64_t count) {
  EXA_ASSERT(begin + count <= w.rows);
  model::weight_view s = w;
  s.rows = count;
  s.data = w.row(begin);
  s.packed = nullptr;  // packed groups start at row 0: llama_forward packs the shard
  return s;
}

// Elements [begin, begin + count) of a 1-D float tensor (a bias).
model::weight_view slice_vector(const model::weight_view& w, std::uint64_t begin, std::uint64_t count) {
  EXA_ASSERT(w.rows == 1 && begin + count <= w.cols && model::block_elems(w.type) == 1);
  model::weight_view s = w;
  s.cols = count;
  s.data = w.data + model::row_bytes(w.type, begin);
  return s;
}

std::optional<model::weight_view> slice_bias(const std::optional<model::weight_view>& b, std::uint64_t begin,
                                             std::uint64_t count) {
  if (!b) return std::nullopt;
  return slice_vector(*b, begin, count);
}

}  // namespace

void tp_weights::aligned_free::operator()(std::byte* p) const noexcept {
  ::operator delete[](p, buffer_alignment);
}

expected<void> check_tp_split(const model::llama_config& c, const model::llama_weights& w, std::uint32_t tp) {
  if (tp == 0 || tp > max_tensor_parallel)
    return make_error(errc::invalid_argument, "tensor-parallel size " + str(tp) + " is outside [1, " +
                                                  str(max_tensor_parallel) + "]");
  if (auto ok = divisible("attention.head_count", c.n_heads, tp); !ok) return ok;
  if (auto ok = divisible("attention.head_count_kv", c.n_kv_heads, tp); !ok) return ok;
  if (auto ok = divisible("feed_forward_length", c.ff_dim, tp); !ok) return ok;
  for (const auto& l : w.layers) {
    if (auto ok = whole_blocks(l.wo, tp); !ok) return ok;
    if (auto ok = whole_blocks(l.w_down, tp); !ok) return ok;
  }
  return {};
}

model::weight_view tp_weights::repack_cols(const model::weight_view& w, std::uint64_t begin, std::uint64_t count) {
  EXA_ASSERT(begin + count <= w.cols);
  const std::size_t offset = model::row_bytes(w.type, begin);
  const std::size_t share = model::row_bytes(w.type, count);
  const std::size_t bytes = share * w.rows;
  buffer b(static_cast<std::byte*>(::operator new[](bytes, buffer_alignment)));
  for (std::uint64_t r = 0; r < w.rows; ++r) std::memcpy(b.get() + r * share, w.row(r) + offset, share);
  model::weight_view s = w;
  s.cols = count;
  s.data = b.get();
  s.packed = nullptr;
  s.owned = true;
  EXA_ASSERT(s.row_bytes() == share);
  owned_bytes_ += bytes;
  owned_.push_back(std::move(b));
  return s;
}

expected<tp_weights> tp_weights::shard(const model::llama_config& c, const model::llama_weights& weights,
                                       std::uint32_t rank, std::uint32_t size) {
  if (auto ok = check_tp_split(c, weights, size); !ok) return std::unexpected(ok.error());
  if (rank >= size)
    return make_error(errc::invalid_argument, "tensor-parallel rank " + str(rank) + " is outside [0, " + str(size) + ")");
  tp_weights t;
  t.rank_ = rank;
  t.size_ = size;
  t.weights_ = weights;  // shared tensors as they are; the split ones replaced below
  const std::uint64_t hd = c.head_dim();
  const std::uint64_t q = c.n_heads / size * hd, kv = c.n_kv_heads / size * hd, ff = c.ff_dim / size;
  for (auto& l : t.weights_.layers) {
    l.wq = slice_rows(l.wq, rank * q, q);
    l.wk = slice_rows(l.wk, rank * kv, kv);
    l.wv = slice_rows(l.wv, rank * kv, kv);
    l.bq = slice_bias(l.bq, rank * q, q);
    l.bk = slice_bias(l.bk, rank * kv, kv);
    l.bv = slice_bias(l.bv, rank * kv, kv);
    l.w_gate = slice_rows(l.w_gate, rank * ff, ff);
    l.w_up = slice_rows(l.w_up, rank * ff, ff);
    // Row-parallel: this member's input columns. The O bias stays whole: it
    // is added once, after the all-reduce (llama_forward).
    l.wo = t.repack_cols(l.wo, rank * q, q);
    l.w_down = t.repack_cols(l.w_down, rank * ff, ff);
  }
  return t;
}

}  // namespace exa::engine
