#include "engine/kernel_table.hpp"

namespace exa::engine {

const kernel_table& kernels_for(isa i) noexcept {
  switch (i) {
    case isa::amx: return kernels_amx::table();
    case isa::avx512: return kernels_avx512::table;
    case isa::avxvnni: return kernels_avxvnni::table;
    case isa::avx2: return kernels_avx2::table;
    case isa::scalar: break;
  }
  return kernels_scalar::table;
}

}  // namespace exa::engine
