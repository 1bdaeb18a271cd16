#include "gpu/cuda_weight_plan.hpp"

#include <cstring>
#include <initializer_list>

#include "common/assert.hpp"
#include "model/half.hpp"

namespace exa::gpu {
namespace {

using model::tensor_type;

std::uint64_t align_up(std::uint64_t n) { return (n + device_alignment - 1) / device_alignment * device_alignment; }

expected<device_format> matrix_format(const model::weight_view& w) {
  switch (w.type) {
    case tensor_type::f16: return device_format::f16;
    case tensor_type::bf16: return device_format::bf16;
    case tensor_type::q8_0: return device_format::q8_0;
    default: break;
  }
  return make_error(errc::unsupported, "tensor " + w.name + " has type " + std::string(model::to_string(w.type)) +
                                           "; the CUDA engine multiplies f16, bf16 and q8_0 weights only");
}

class planner {
 public:
  explicit planner(weight_plan& plan) : plan_(plan) {}

  void add(const model::weight_view& w, device_format f) {
    planned_tensor t{&w, f, 0, device_bytes(f, w.rows, w.cols), 0, device_scale_bytes(f, w.rows, w.cols)};
    t.offset = plan_.total_bytes;
    plan_.total_bytes = align_up(plan_.total_bytes + t.bytes);
    if (t.scales_bytes > 0) {
      t.scales_offset = plan_.total_bytes;
      plan_.total_bytes = align_up(plan_.total_bytes + t.scales_bytes);
    }
    plan_.tensors.push_back(t);
  }

  expected<void> add_matrix(const model::weight_view& w) { return add_matrices({&w}); }

  // Matrices one layer multiplies with the same input (Q, K, V; gate, up):
  // when they share a type and width they go in one piece -- their values
  // back to back, then their scales -- so the forward multiplies them as one
  // matrix (gpu/cuda_forward.cpp: fused()).
  expected<void> add_matrices(std::initializer_list<const model::weight_view*> ms) {
    bool same = true;
    for (const model::weight_view* w : ms) {
      auto f = matrix_format(*w);
      if (!f) return std::unexpected(f.error());
      if (w->cols % 32 != 0)
        return make_error(errc::unsupported, "tensor " + w->name + " has rows of " + std::to_string(w->cols) +
                                                 " values; the CUDA matmul needs a multiple of 32");
      same = same && w->type == (*ms.begin())->type && w->cols == (*ms.begin())->cols;
    }
    if (!same) {
      for (const model::weight_view* w : ms) add(*w, *matrix_format(*w));
      return {};
    }
    const device_format f = *matrix_format(**ms.begin());
    const std::size_t first = plan_.tensors.size();
    for (const model::weight_view* w : ms) {
      plan_.tensors.push_back({w, f, plan_.total_bytes, device_bytes(f, w->rows, w->cols), 0,
                               device_scale_bytes(f, w->rows, w->cols)});
      plan_.total_bytes += plan_.tensors.back().bytes;
    }
    plan_.total_bytes = align_up(plan_.total_bytes);
    if (f != device_format::q8_0) return {};
    for (std::size_t i = first; i < plan_.tensors.size(); ++i) {
      plan_.tensors[i].scales_offset = plan_.total_bytes;
      plan_.total_bytes += plan_.tensors[i].scales_bytes;
    }
    plan_.total_bytes = align_up(plan_.total_bytes);
    return {};
  }

 private:
  weight_plan& plan_;
};

}  // namespace

std::string_view to_string(device_format f) noexcept {
  switch (f) {
    case device_format::f32: return "f32";
    case device_format::f16: return "f16";
    case device_format::bf16: return "bf16";
    case device_format::q8_0: return "q8_0";
  }
  return "unknown";
}

std::uint64_t device_bytes(device_format format, std::uint64_t rows, std::uint64_t cols) noexcept {
  switch (format) {
    case device_format::f32: return rows * cols * 4;
    case device_format::f16:
    case device_format::bf16: return rows * cols * 2;
    case device_format::q8_0: return rows * cols;
  }
  return 0;
}

std::uint64_t device_scale_bytes(device_format format, std::uint64_t rows, std::uint64_t cols) noexcept {
  return format == device_format::q8_0 ? rows * (cols / 32) * sizeof(float) : 0;
}

const planned_tensor* weight_plan::find(const model::weight_view& w) const noexcept {
  for (const planned_tensor& t : tensors)
    if (t.src == &w) return &t;
  return nullptr;
}

bool weight_plan::contiguous(std::initializer_list<const model::weight_view*> ws) const noexcept {
  const planned_tensor* prev = nullptr;
  for (const model::weight_view* w : ws) {
    const planned_tensor* t = find(*w);
    if (t == nullptr) return false;
    if (prev != nullptr) {
      if (t->format != prev->format || t->src->cols != prev->src->cols) return false;
      if (t->offset != prev->offset + prev->bytes) return false;
      if (t->scales_bytes > 0 && t->scales_offset != prev->scales_offset + prev->scales_bytes) return false;
    }
    prev = t;
  }
  return prev != nullptr;
}

expected<weight_plan> plan_weights(const model::llama_config& c, const model::llama_weights& weights) {
  const std::uint32_t hd = c.head_dim();
  if (hd > cuda_max_head_dim || hd % 2 != 0)
    return make_error(errc::unsupported, "head width " + std::to_string(hd) + ": the CUDA attention takes even widths up to " +
                                             std::to_string(cuda_max_head_dim));
  if (c.dim % 32 != 0 || c.ff_dim % 32 != 0)
    return make_error(errc::unsupported, "embedding width " + std::to_string(c.dim) + " and feed-forward width " +
                                             std::to_string(c.ff_dim) + " must be multiples of 32 for the CUDA engine");
  weight_plan plan;
  planner p(plan);
  // The embedding is gathered; when it is also the output head it must be a
  // matrix the matmul takes.
  if (weights.tied_output) {
    if (auto ok = p.add_matrix(weights.token_embd); !ok) return std::unexpected(ok.error());
  } else {
    auto f = matrix_format(weights.token_embd);
    p.add(weights.token_embd, f ? *f : device_format::f32);
    if (auto ok = p.add_matrix(weights.output); !ok) return std::unexpected(ok.error());
  }
  p.add(weights.output_norm, device_format::f32);
  if (weights.rope_freqs) p.add(*weights.rope_freqs, device_format::f32);
  for (const model::llama_layer_weights& l : weights.layers) {
    for (auto group : {std::initializer_list<const model::weight_view*>{&l.wq, &l.wk, &l.wv},
                       std::initializer_list<const model::weight_view*>{&l.wo},
                       std::initializer_list<const model::weight_view*>{&l.w_gate, &l.w_up},
                       std::initializer_list<const model::weight_view*>{&l.w_down}})
      if (auto ok = p.add_matrices(group); !ok) return std::unexpected(ok.error());
    p.add(l.attn_norm, device_format::f32);
    p.add(l.ffn_norm, device_format::f32);
    for (const std::optional<model::weight_view>* b : {&l.bq, &l.bk, &l.bv, &l.bo})
      if (*b) p.add(**b, device_format::f32);
  }
  return plan;
}

void repack_q8_0(const std::byte* src, std::size_t rows, std::size_t cols, std::int8_t* quants, float* scales) {
  EXA_ASSERT(cols % model::q8_0_block_elems == 0);
  const std::size_t nb = cols / model::q8_0_block_elems;
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t b = 0; b < nb; ++b) {
      model::block_q8_0 block;
      std::memcpy(&block, src + (r * nb + b) * sizeof(model::block_q8_0), sizeof block);
      scales[r * nb + b] = model::f16_to_float(block.d);
      std::memcpy(quants + r * cols + b * model::q8_0_block_elems, block.qs, model::q8_0_block_elems);
    }
  }
}

}  // namespace exa::gpu
