// Built when CUDA or nccl.h was not found: NCCL groups report themselves
// unavailable, so callers need no #ifdef to ask for one.
#include "gpu/nccl_communicator.hpp"

namespace exa::gpu {
namespace {
constexpr const char* no_nccl =
    "NCCL is not usable: this build of ExaServe has no NCCL support (CUDA or nccl.h was not found)";
}

expected<void> nccl_available() { return make_error(errc::unavailable, no_nccl); }

expected<nccl_unique_id> nccl_make_unique_id() { return make_error(errc::unavailable, no_nccl); }

expected<std::unique_ptr<nccl_communicator>> nccl_communicator::create(const nccl_unique_id&, int, int, int,
                                                                       void*, std::chrono::milliseconds) {
  return make_error(errc::unavailable, no_nccl);
}

}  // namespace exa::gpu
