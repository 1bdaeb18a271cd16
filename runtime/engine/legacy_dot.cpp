#include "engine/legacy_dot.hpp"

#include "common/assert.hpp"
#include "engine/kernel_table.hpp"

// The kernels live in kernels_impl.hpp, one copy per ISA variant.

namespace exa::engine::legacy {

void dot_row_tokens(model::tensor_type type, const std::byte* row, const void* x, std::size_t x_stride,
                    std::size_t n_tokens, std::size_t nb, path p, float* y, std::size_t y_stride) noexcept {
  EXA_ASSERT_MSG(kquant::available(p), "kernel path not supported by this CPU");
  EXA_ASSERT_MSG(handles(type), "legacy::dot_row_tokens: not a Q4_1/Q5_0/Q5_1 type");
  kernels_for(kquant::isa_of(p)).legacy_row_tokens(type, row, x, x_stride, n_tokens, nb, y, y_stride);
}

}  // namespace exa::engine::legacy
