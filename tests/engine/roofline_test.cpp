// bench-engine's roofline (engine/roofline.hpp): the arithmetic of the bound,
// the matrices it counts, and the probes each kernel variant runs.

#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "engine/aligned_vector.hpp"
#include "engine/kernel_table.hpp"
#include "engine/roofline.hpp"
#include "engine/thread_pool.hpp"
#include "fixtures.hpp"

using namespace exa;

TEST_CASE("the roofline bound is the smaller of the compute and the weight-read bounds", "[engine][roofline]") {
  // 100 multiply-adds and 1,000 bytes per token; 10,000 multiply-adds/s and
  // 20,000 bytes/s: compute allows 100 tok/s, reading 20 steps/s.
  CHECK(engine::roofline_tok_s(100, 1000, 1e4, 2e4, 1) == Approx(20.0));   // memory bound
  CHECK(engine::roofline_tok_s(100, 1000, 1e4, 2e4, 4) == Approx(80.0));   // still memory bound
  CHECK(engine::roofline_tok_s(100, 1000, 1e4, 2e4, 5) == Approx(100.0));  // the crossing
  CHECK(engine::roofline_tok_s(100, 1000, 1e4, 2e4, 32) == Approx(100.0)); // compute bound
  // Not measured: no bound.
  CHECK(engine::roofline_tok_s(100, 1000, 0, 2e4, 1) == 0);
  CHECK(engine::roofline_tok_s(100, 1000, 1e4, 0, 1) == 0);
  CHECK(engine::roofline_tok_s(0, 1000, 1e4, 2e4, 1) == 0);
}

TEST_CASE("the roofline counts every layer's seven matrices and the output head", "[engine][roofline]") {
  for (const auto type : {model::tensor_type::f32, model::tensor_type::q8_0}) {
    const auto m = test::make_model(test::tiny_spec(type));
    const auto& c = m->config();
    const std::uint64_t dim = c.dim, kv = c.kv_dim(), ff = c.ff_dim;
    const std::uint64_t per_layer = dim * dim * 2 + dim * kv * 2 + dim * ff * 3;
    const std::uint64_t expected = per_layer * c.n_layers + std::uint64_t{c.vocab_size} * dim;
    CAPTURE(model::to_string(type));
    CHECK(engine::matmul_macs_per_token(m->weights()) == expected);
    // Bytes: the same matrices at the type's size (q8_0: 34 bytes per 32).
    const double per_mac = type == model::tensor_type::f32 ? 4.0 : 34.0 / 32.0;
    CHECK(static_cast<double>(engine::matmul_weight_bytes(m->weights())) == Approx(per_mac * expected));
    CHECK(engine::matmul_is_int8(m->weights()) == (type == model::tensor_type::q8_0));
  }
}

TEST_CASE("every variant's probes run and read every byte", "[engine][roofline][isa]") {
  for (const auto v : test::runnable_isas()) {
    CAPTURE(engine::to_string(v));
    const auto& k = engine::kernels_for(v);
    // Multiply-adds per round: 16 chains of the variant's instruction (AMX:
    // four 16 × 16 × 32 tile products).
    const std::uint64_t int8_per_round = v == engine::isa::amx      ? 4 * 16 * 16 * 32
                                         : v == engine::isa::avx512 ? 16 * 64
                                         : v == engine::isa::scalar ? 16
                                                                    : 16 * 32;
    const std::uint64_t f32_per_round = v == engine::isa::avx512 || v == engine::isa::amx ? 16 * 16
                                        : v == engine::isa::scalar                         ? 16
                                                                                           : 16 * 8;
    CHECK(k.peak(engine::peak_op::int8_dot, 1000) == 1000 * int8_per_round);
    CHECK(k.peak(engine::peak_op::f32_fma, 1000) == 1000 * f32_per_round);
    // read_sum adds the buffer as 64-bit words: one word of 1 at each 256-byte
    // step's last 8 bytes, so a variant that skips any part of a step, or
    // the last step, misses some.
    const std::size_t n = 256 * 37;
    engine::aligned_vector<std::byte> buf(n);
    for (std::size_t i = 0; i < n; i += 256) {
      const std::uint64_t one = 1 + i / 256;
      std::memcpy(buf.data() + i + 248, &one, sizeof one);
    }
    CHECK(k.read_sum(buf.data(), n) == 37 * 38 / 2);
  }
}

TEST_CASE("measured peaks are positive on every thread count", "[engine][roofline]") {
  // Not a speed check: the machine's speed is not the test's to know. A
  // probe that never ran (a thread's chunk lost, a zero count) gives 0.
  for (const std::size_t threads : {1, 2}) {
    engine::thread_pool pool(threads);
    const auto p = engine::measure_peaks(pool, engine::active_kernels(), 1, 0.01);
    CAPTURE(threads);
    CHECK(p.int8_macs_per_s > 0);
    CHECK(p.f32_macs_per_s > 0);
    CHECK(p.read_bytes_per_s > 0);
  }
}
