#include "engine/kquant_dot.hpp"

#include "common/assert.hpp"
#include "engine/kernel_table.hpp"

// The kernels themselves live in kernels_impl.hpp, one copy per ISA variant;
// this is the path-selecting entry point tests and tools use.

namespace exa::engine::kquant {

isa isa_of(path p) noexcept { return p == path::avx2 ? isa::avx2 : isa::scalar; }

bool available(path p) noexcept { return supports(detect_cpu(), isa_of(p)); }

path best_path() noexcept { return active_isa() == isa::scalar ? path::scalar : path::avx2; }

void dot_row_tokens(model::tensor_type type, const std::byte* row, const model::block_q8_K* x,
                    std::size_t x_stride, std::size_t n_tokens, std::size_t nb, path p, float* y,
                    std::size_t y_stride) noexcept {
  EXA_ASSERT_MSG(available(p), "kquant path not supported by this CPU");
  EXA_ASSERT_MSG(is_k_quant(type), "dot_row_tokens: not a K-quant type");
  kernels_for(isa_of(p)).kquant_row_tokens(type, row, x, x_stride, n_tokens, nb, y, y_stride);
}

float dot_row(model::tensor_type type, const std::byte* row, const model::block_q8_K* x, std::size_t nb,
              path p) noexcept {
  float y = 0.0f;
  dot_row_tokens(type, row, x, nb, 1, nb, p, &y, 1);
  return y;
}

}  // namespace exa::engine::kquant
