// Built when nvcc is absent: CUDA tensor parallelism reports itself
// unavailable, so callers need no #ifdef to ask for it.
#include "gpu/cuda_tp_engine.hpp"

namespace exa::gpu {

expected<cuda_tp_engine> make_cuda_tp_engine(std::shared_ptr<const model::llama_model>, cuda_tp_options) {
  return make_error(errc::unavailable, "CUDA tensor parallelism is unavailable: ExaServe was built without CUDA");
}

}  // namespace exa::gpu
