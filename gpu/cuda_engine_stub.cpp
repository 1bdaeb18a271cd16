// Built when nvcc is absent: the CUDA engine reports itself unavailable, so
// callers need no #ifdef to ask for it.
#include "gpu/cuda_engine.hpp"

namespace exa::gpu {

std::optional<cuda_engine_counters> cuda_counters(const engine::inference_engine&) { return std::nullopt; }

expected<std::unique_ptr<engine::inference_engine>> make_cuda_engine(std::shared_ptr<const model::llama_model>, int,
                                                                     cuda_engine_options) {
  return make_error(errc::unavailable, "the CUDA engine is unavailable: ExaServe was built without CUDA");
}

}  // namespace exa::gpu
