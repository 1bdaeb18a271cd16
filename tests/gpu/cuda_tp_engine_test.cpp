// CUDA tensor parallelism's host side, on any machine: what
// make_cuda_tp_engine refuses before touching a device, and the reason it
// gives where CUDA (or a second GPU) is missing. What it computes is checked
// on GPUs by cuda_tp_gpu_test.

#include <catch2/catch.hpp>

#include "fixtures.hpp"
#include "gpu/cuda_memory_pool.hpp"
#include "gpu/cuda_tp_engine.hpp"

using namespace exa;

namespace {

// Splits over 2 (and 4) members in widths the CUDA kernels take.
std::shared_ptr<const model::llama_model> tp_model(model::tensor_type type = model::tensor_type::f16) {
  auto s = test::tiny_spec(type);
  s.dim = 128;
  s.n_heads = 8;
  s.n_kv_heads = 4;
  s.ff_dim = 256;
  return test::make_model(s);
}

gpu::cuda_tp_options two_devices() {
  gpu::cuda_tp_options o;
  o.devices = {0, 1};
  o.own_kv_blocks = 8;
  return o;
}

error refusal(std::shared_ptr<const model::llama_model> m, gpu::cuda_tp_options o) {
  auto e = gpu::make_cuda_tp_engine(std::move(m), std::move(o));
  REQUIRE_FALSE(e.has_value());
  return e.error();
}

}  // namespace

TEST_CASE("make_cuda_tp_engine refuses a bad group or model before looking for a device", "[gpu][cuda_tp]") {
#if defined(EXASERVE_HAVE_CUDA)
  const auto m = tp_model();
  auto one = two_devices();
  one.devices = {0};
  CHECK(refusal(m, one).message == "a CUDA tensor-parallel group needs two devices or more");
  auto twice = two_devices();
  twice.devices = {1, 1};
  CHECK(refusal(m, twice).message == "CUDA device 1 is listed twice in a tensor-parallel group");
  auto pools = two_devices();
  pools.kv_pools = {nullptr};
  CHECK(refusal(m, pools).code == errc::invalid_argument);
  auto three = two_devices();
  three.devices = {0, 1, 2};
  const auto split = refusal(m, three);
  CHECK(split.code == errc::invalid_argument);
  CHECK_THAT(split.message, Catch::Contains("attention.head_count (8) is not divisible by the tensor-parallel size 3"));
  auto draft = two_devices();
  draft.engine.draft = m;
  CHECK(refusal(m, draft).code == errc::unsupported);
  // A shard whose widths the CUDA matmul does not take (O's 16 input columns
  // per member: not a multiple of 32) is named.
  auto narrow = test::tiny_spec(model::tensor_type::f16);
  narrow.dim = 64;
  narrow.n_heads = 4;
  narrow.n_kv_heads = 4;
  narrow.ff_dim = 128;
  auto eight = two_devices();
  eight.devices = {0, 1, 2, 3};
  const auto width = refusal(test::make_model(narrow), eight);
  CHECK(width.code == errc::unsupported);
  CHECK_THAT(width.message, Catch::Contains("multiple of 32"));
#else
  SUCCEED("without CUDA every request is unavailable (next test)");
#endif
}

TEST_CASE("make_cuda_tp_engine explains why it cannot run here", "[gpu][cuda_tp]") {
  const auto m = tp_model();
  auto e = gpu::make_cuda_tp_engine(m, two_devices());
#if defined(EXASERVE_HAVE_CUDA)
  const auto devices = gpu::cuda_device_count();
  if (!devices) {
    REQUIRE_FALSE(e.has_value());
    CHECK(e.error().code == errc::unavailable);
    CHECK(e.error().message == devices.error().message);  // the CUDA runtime's reason, as is
  } else if (*devices < 2) {
    REQUIRE_FALSE(e.has_value());
    CHECK(e.error().message == "CUDA device 1 does not exist (" + std::to_string(*devices) + " present)");
  } else if (!e) {
    // Two GPUs: only a missing NCCL may stop it (cuda_tp_gpu_test checks the rest).
    CHECK(e.error().code == errc::unavailable);
    CHECK_THAT(e.error().message, Catch::Contains("NCCL"));
  }
#else
  REQUIRE_FALSE(e.has_value());
  CHECK(e.error().code == errc::unavailable);
  CHECK_THAT(e.error().message, Catch::Contains("built without CUDA"));
#endif
}
