// One binary, every ISA, the same numbers: the kernel variants this CPU can
// run (at least scalar and AVX2 on any x86-64 CI machine) give bitwise equal
// results kernel by kernel and logits end to end, and the choice of variant
// follows what the CPU reports.

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <utility>

#include "engine/det_math.hpp"
#include "engine/even_tiles.hpp"
#include "engine/isa.hpp"
#include "engine/kernel_table.hpp"
#include "engine/llama_forward.hpp"
#include "engine/matmul.hpp"
#include "engine/ops.hpp"
#include "engine/q8_pack.hpp"
#include "engine/row_blocks.hpp"
#include "engine/weight_store.hpp"
#include "fixtures.hpp"
#include "model/half.hpp"
#include "model/quantize.hpp"

using namespace exa;
using engine::isa;

namespace {

std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// A weight of `rows` × `cols` of `type`, from seeded random floats.
struct weight_buffer {
  std::vector<std::byte> bytes;
  model::weight_view view;

  weight_buffer(model::tensor_type type, std::size_t rows, std::size_t cols, std::uint64_t seed) {
    const std::size_t rb = model::row_bytes(type, cols);
    bytes.resize(rows * rb);
    const auto x = random_floats(rows * cols, seed, 1.0f);
    for (std::size_t r = 0; r < rows; ++r)
      model::convert_row(std::span<const float>(x.data() + r * cols, cols), type, bytes.data() + r * rb);
    view.type = type;
    view.rows = rows;
    view.cols = cols;
    view.data = bytes.data();
    view.name = "test";
  }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> multiply(isa variant, const model::weight_view& w, const std::vector<float>& x,
                            std::size_t n_tokens) {
  test::isa_scope scope(variant);
  engine::activations acts;
  acts.convert(w.type, x.data(), w.cols, n_tokens, w.cols, nullptr);
  std::vector<float> y(n_tokens * w.rows);
  engine::matmul_rows(w, acts, y.data(), w.rows, 0, w.rows);
  return y;
}

engine::cpu_caps all_features() {
  engine::cpu_caps c;
  c.avx2 = c.fma = c.f16c = true;
  c.avx512f = c.avx512bw = c.avx512vl = c.avx512vnni = c.avx512bf16 = c.avxvnni = true;
  c.amx_tile = c.amx_int8 = true;
  c.os_avx = c.os_avx512 = c.os_amx = true;
  return c;
}

}  // namespace

TEST_CASE("the ISA variant follows what the CPU and the OS support", "[engine][isa]") {
  engine::cpu_caps c = all_features();
  CHECK(engine::best_isa(c) == isa::avx512);  // AMX only when asked for
  CHECK(engine::choose_isa(c, "") == isa::avx512);
  CHECK(engine::choose_isa(c, "auto") == isa::avx512);
  CHECK(engine::choose_isa(c, "amx") == isa::amx);
  CHECK(engine::choose_isa(c, "avx2") == isa::avx2);
  CHECK(engine::choose_isa(c, "scalar") == isa::scalar);

  SECTION("AMX needs its tile state saved by the OS") {
    c.os_amx = false;
    CHECK(engine::best_isa(c) == isa::avx512);
    const auto refused = engine::choose_isa(c, "amx");
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == errc::unavailable);
    CHECK_THAT(refused.error().message, Catch::Contains("AMX tile state"));
  }
  SECTION("AMX-TILE without AMX-INT8 (AMX-BF16 only) cannot run the amx variant") {
    c.amx_int8 = false;
    const auto refused = engine::choose_isa(c, "amx");
    REQUIRE_FALSE(refused);
    CHECK_THAT(refused.error().message, Catch::Contains("amx_int8"));
  }
  SECTION("an AVX2-only CPU (no AVX-512, no AVX-VNNI) runs the AVX2 variant") {
    c.avx512f = c.avx512bw = c.avx512vl = c.avx512vnni = c.avx512bf16 = false;
    c.avxvnni = false;
    CHECK(engine::best_isa(c) == isa::avx2);
    const auto refused = engine::choose_isa(c, "avx512");
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == errc::unavailable);
    CHECK_THAT(refused.error().message, Catch::Contains("avx512f"));
  }
  SECTION("AVX-512 without VNNI (Skylake-SP) is run as AVX2") {
    c.avx512vnni = false;
    c.amx_tile = c.amx_int8 = false;
    c.avxvnni = false;
    CHECK(engine::best_isa(c) == isa::avx2);
  }
  SECTION("AVX-VNNI without AVX-512 (Alder Lake) runs the AVX-VNNI variant") {
    c.avx512f = c.avx512bw = c.avx512vl = c.avx512vnni = c.avx512bf16 = false;
    CHECK(engine::best_isa(c) == isa::avxvnni);
    c.avxvnni = false;
    CHECK_FALSE(engine::choose_isa(c, "avxvnni"));
  }
  SECTION("an OS that does not save ZMM state rules AVX-512 (and AMX) out") {
    c.os_avx512 = false;
    CHECK(engine::best_isa(c) == isa::avxvnni);
  }
  SECTION("no FMA or F16C: scalar") {
    c.fma = false;
    CHECK(engine::best_isa(c) == isa::scalar);
    const auto refused = engine::choose_isa(c, "avx2");
    REQUIRE_FALSE(refused);
    CHECK_THAT(refused.error().message, Catch::Contains("fma"));
  }
  SECTION("an unknown name is refused with the valid ones") {
    const auto bad = engine::choose_isa(c, "neon");
    REQUIRE_FALSE(bad);
    CHECK(bad.error().code == errc::invalid_argument);
    CHECK_THAT(bad.error().message, Catch::Contains("scalar, avx2, avxvnni, avx512 or amx"));
  }
  SECTION("this machine: detection agrees with what the kernels need") {
    const auto here = engine::detect_cpu();
    CHECK(engine::supports(here, isa::scalar));
    INFO("cpu: " << engine::describe(here));
    CHECK(engine::kernels_for(engine::best_isa(here)).id == engine::best_isa(here));
  }
}

TEST_CASE("every kernel variant computes every weight type bitwise alike", "[engine][isa]") {
  const auto variants = test::runnable_isas();
  REQUIRE(variants.front() == isa::scalar);
  if (variants.size() < 2) WARN("only the scalar variant runs on this CPU: nothing to compare");
  // Widths with tails: 100 floats (16-lane tail of 4), 160 (an odd count of
  // 32-element blocks: the two-block step has a missing half), 512 (K-quants);
  // f16 at 1030, rows wide enough for two row blocks (the next block's
  // prefetch shared among the token tiles); f32 and f16 at 2050, past which
  // AVX-512 batches run 4 tokens by 6 rows.
  struct shape {
    model::tensor_type type;
    std::size_t cols;
  };
  const auto s = GENERATE(shape{model::tensor_type::f32, 100}, shape{model::tensor_type::f16, 100},
                          shape{model::tensor_type::bf16, 100}, shape{model::tensor_type::f16, 64},
                          shape{model::tensor_type::f16, 1030}, shape{model::tensor_type::f32, 2050},
                          shape{model::tensor_type::f16, 2050},
                          shape{model::tensor_type::q8_0, 160}, shape{model::tensor_type::q8_0, 128},
                          shape{model::tensor_type::q4_0, 160}, shape{model::tensor_type::q4_1, 160},
                          shape{model::tensor_type::q5_0, 96}, shape{model::tensor_type::q5_1, 96},
                          shape{model::tensor_type::q4_K, 512}, shape{model::tensor_type::q5_K, 512},
                          shape{model::tensor_type::q6_K, 256});
  CAPTURE(model::to_string(s.type), s.cols);
  const weight_buffer w(s.type, 53, s.cols, 7 + s.cols);
  // Token counts reach every tile width and remainder (AVX-512 float tiles
  // take up to 6 tokens, the others 4; AMX tiles 16, the rest as AVX-512).
  for (const std::size_t n : {1, 2, 3, 4, 5, 6, 7, 9, 11, 13, 16, 35}) {
    const auto x = random_floats(n * s.cols, 100 + n, 3.0f);
    const auto reference = multiply(isa::scalar, w.view, x, n);
    for (const isa v : variants) {
      CAPTURE(n, engine::to_string(v));
      CHECK(same_bits(multiply(v, w.view, x, n), reference));
    }
  }
  SECTION("the comparison can fail: another input gives other bits") {
    const auto x = random_floats(s.cols, 1, 3.0f);
    auto y = x;
    y[s.cols / 2] += 0.5f;
    CHECK_FALSE(same_bits(multiply(isa::scalar, w.view, x, 1), multiply(variants.back(), w.view, y, 1)));
  }
}

TEST_CASE("wide rows: each token of a batch gets its product alone, bit for bit, on every variant",
          "[engine][isa][invariance]") {
  // Rows as long as a down projection's and longer: past 1,280 columns
  // (8 tokens' activations over long_row_tile_bytes) AVX-512 runs batches of
  // 8 tokens or more 4 tokens by 6 rows; 1030 columns stay on its 3 x 8 tile.
  // 101 rows are several row blocks (the next block's prefetch shared among
  // the token tiles; 5 rows below the 6-row tile): 48 + 48 + 5 where the
  // rows are short or the batch is not on the long-row tile, else at most
  // 384 KiB (long_row_block_bytes) in steps of 12 rows, 36 + 36 + 29 at 2050
  // f32 columns, 24-row blocks at 4096 (f32), 12 and 36 at 5000 (f32; f16
  // and bf16). The token
  // counts cut into even tiles (even_tiles.hpp) of every size from 3 to 8:
  // over long rows 9 is 3 + 3 + 3, 13 is 4 + 3 + 3 + 3, 17 is 4 + 4 + 3 + 3 + 3;
  // at 1030 columns 9 is 5 + 4, 13 is 7 + 6, 17 is 6 + 6 + 5, 35 five of 7.
  // One token runs the decode tile, so it is the reference; 2050, 1030 and
  // 5000 leave a tail past the last 16-column step.
  const auto type = GENERATE(model::tensor_type::f32, model::tensor_type::f16, model::tensor_type::bf16);
  const auto cols = GENERATE(std::size_t{2050}, std::size_t{1030}, std::size_t{4096}, std::size_t{5000});
  CAPTURE(model::to_string(type), cols);
  const weight_buffer w(type, 101, cols, 11 + cols);
  for (const isa v : test::runnable_isas()) {
    for (const std::size_t n : {8, 9, 13, 14, 17, 35}) {
      CAPTURE(engine::to_string(v), n);
      const auto x = random_floats(n * cols, 200 + n, 3.0f);
      const auto all = multiply(v, w.view, x, n);
      for (std::size_t t = 0; t < n; ++t) {
        const std::vector<float> one(x.begin() + t * cols, x.begin() + (t + 1) * cols);
        const auto alone = multiply(v, w.view, one, 1);
        CAPTURE(t);
        CHECK(std::memcmp(alone.data(), all.data() + t * w.view.rows, w.view.rows * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("q8_0: every variant, packed or not, any row split, follows the block-sum contract", "[engine][isa]") {
  // The contract (kernels_impl.hpp, q8p): per 32-element block the exact
  // integer sum, then s = fma(float(isum), d_w · d_x, s) in block order.
  // Written out here from the quantized blocks, independently of the kernels.
  const auto contract = [](const model::weight_view& w, const std::vector<float>& x, std::size_t n) {
    const std::size_t nb = w.cols / 32;
    std::vector<model::block_q8_0> xq(nb);
    std::vector<float> y(n * w.rows);
    for (std::size_t t = 0; t < n; ++t) {
      model::quantize_row_q8_0(x.data() + t * w.cols, xq.data(), w.cols);
      for (std::size_t r = 0; r < w.rows; ++r) {
        const auto* row = reinterpret_cast<const model::block_q8_0*>(w.row(r));
        float s = 0.0f;
        for (std::size_t b = 0; b < nb; ++b) {
          std::int32_t isum = 0;
          for (int i = 0; i < 32; ++i) isum += row[b].qs[i] * xq[b].qs[i];
          s = std::fma(static_cast<float>(isum), model::f16_to_float(row[b].d) * model::f16_to_float(xq[b].d), s);
        }
        y[t * w.rows + r] = s;
      }
    }
    return y;
  };
  struct shape {
    std::size_t rows, cols;
  };
  const auto sh = GENERATE(shape{53, 160}, shape{40, 64}, shape{16, 96});
  CAPTURE(sh.rows, sh.cols);
  const weight_buffer w(model::tensor_type::q8_0, sh.rows, sh.cols, 5 + sh.rows);
  engine::weight_store store;
  model::weight_view placed = w.view;
  model::weight_view* const one[] = {&placed};
  store.place(one);
  const model::weight_view& packed = placed;
  REQUIRE(packed.packed != nullptr);
  CHECK(packed.data == w.view.data);  // the kernels pack off-group ranges from the rows
  CHECK(store.memory().bytes == (sh.rows + 15) / 16 * engine::q8p_group_bytes(sh.cols));
  // Splits on group boundaries (the packed copy is read) and off them (the
  // kernels pack the range themselves).
  const std::vector<std::vector<std::size_t>> cuts = {{}, {16}, {5, 37}, {20}, {1, 2, 32}};
  for (const std::size_t n : {1, 2, 6, 7, 13, 16, 32, 35}) {
    const auto x = random_floats(n * sh.cols, 300 + n, 2.0f);
    const auto expect = contract(w.view, x, n);
    for (const isa v : test::runnable_isas()) {
      test::isa_scope scope(v);
      engine::activations acts;
      acts.convert(model::tensor_type::q8_0, x.data(), sh.cols, n, sh.cols, nullptr);
      for (const model::weight_view* view : {&w.view, &packed}) {
        for (const auto& cut : cuts) {
          std::vector<std::size_t> split = {0};  // the cuts inside this matrix's rows
          for (const std::size_t c : cut)
            if (c < sh.rows) split.push_back(c);
          split.push_back(sh.rows);
          std::vector<float> y(n * sh.rows, -1.0f);
          for (std::size_t i = 0; i + 1 < split.size(); ++i)
            engine::matmul_rows(*view, acts, y.data(), sh.rows, split[i], split[i + 1]);
          CAPTURE(n, engine::to_string(v), view == &packed, split.size());
          CHECK(same_bits(y, expect));
        }
      }
    }
  }
}

TEST_CASE("q8_0 activations fill the AVX-512 q4_0 layout only for q4_0 weights, and say so", "[engine][isa]") {
  const std::size_t k = 96;
  const auto x = random_floats(2 * k, 9, 1.0f);
  for (const isa v : test::runnable_isas()) {
    test::isa_scope scope(v);
    CAPTURE(engine::to_string(v));
    const bool needs_layout = engine::kernels_for(v).q8_0_unsigned_layout;
    engine::activations acts;
    acts.convert(model::tensor_type::q8_0, x.data(), k, 2, k, nullptr);
    CHECK(acts.serves(model::tensor_type::q8_0, k));
    CHECK(acts.serves(model::tensor_type::q5_0, k));
    CHECK(acts.serves(model::tensor_type::q4_0, k) == !needs_layout);
    acts.convert(model::tensor_type::q4_0, x.data(), k, 2, k, nullptr);
    CHECK(acts.serves(model::tensor_type::q4_0, k));
    CHECK(acts.serves(model::tensor_type::q8_0, k));
  }
}

TEST_CASE("f16 rounding and the cache's f16 bits agree with float_to_f16 on every variant, edge values included",
          "[engine][isa]") {
  std::vector<float> x = random_floats(203, 17, 70000.0f);  // beyond f16's range, and a tail of 3
  const auto tiny = random_floats(40, 18, 1e-4f);           // f16 subnormals and underflow
  x.insert(x.end(), tiny.begin(), tiny.end());
  for (const std::uint32_t bits : {0x477ff000u, 0x477fefffu, 0x33000000u, 0x33000001u, 0x80000000u, 0x7f800000u,
                                   0xff800000u, 0x7fc00000u, 0xffd00001u, 0x7f800001u, 0x387fe000u, 0x3f801000u,
                                   0x3f803000u})
    x.push_back(std::bit_cast<float>(bits));  // halfway cases, zeros, infinities, NaNs with payloads
  std::vector<float> expect(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) expect[i] = model::f16_to_float(model::float_to_f16(x[i]));
  // And the cache's f16 bits themselves (to_f16), NaN payloads included.
  std::vector<std::uint16_t> expect_bits(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) expect_bits[i] = model::float_to_f16(x[i]);
  for (const isa v : test::runnable_isas()) {
    CAPTURE(engine::to_string(v));
    std::vector<float> got(x.size(), 1.0f);
    engine::kernels_for(v).round_f16(x.data(), got.data(), x.size());
    CHECK(same_bits(got, expect));
    for (const std::size_t n : {x.size(), std::size_t{5}, std::size_t{8}, std::size_t{0}}) {
      std::vector<std::uint16_t> bits(n + 1, 0xabcd);  // one past: must stay
      engine::kernels_for(v).to_f16(x.data() + x.size() - n, bits.data(), n);
      CAPTURE(n);
      CHECK(std::equal(bits.begin(), bits.begin() + static_cast<std::ptrdiff_t>(n), expect_bits.end() - static_cast<std::ptrdiff_t>(n)));
      CHECK(bits[n] == 0xabcd);
    }
  }
}

TEST_CASE("attention over a KV block for the heads sharing it equals one head at a time", "[engine][isa]") {
  // dot_f16_rows / axpy_f16_rows take every query head of a KV group at once
  // (each k and v converted once, and on AVX-512 16 dot products summed by
  // one shuffled tree); per head and row they must give dot_f16 / axpy_f16's
  // bits, on every variant. Head counts cover every grouping (1-9) and the
  // runs of several tokens' heads (12-16), rows two whole blocks of 16 (the
  // AVX-512 transposed path) and a partial last group, widths a 16-lane tail
  // (100) and no full lane (7). dot_f16_kt, on the same rows stored
  // transposed, must give the same bits.
  const auto& ref = engine::kernels_for(isa::scalar);
  for (const std::size_t n : {64, 128, 100, 7}) {
    for (const std::size_t heads : {1, 2, 3, 4, 5, 8, 9, 12, 15, 16}) {
      const std::size_t rows = 37, stride = n + 3;
      const auto q = random_floats(heads * n, heads * 10 + n, 2.0f);
      const auto kf = random_floats(rows * stride, n + 1, 2.0f);
      std::vector<std::uint16_t> k(kf.size());
      for (std::size_t i = 0; i < k.size(); ++i) k[i] = model::float_to_f16(kf[i]);
      // The same rows stored transposed (kv_pages::k_block): element
      // e of row i at kt[e · 48 + i], the 11 slots past row 36 padding.
      const std::size_t kt_stride = 48;
      std::vector<std::uint16_t> kt(n * kt_stride, model::float_to_f16(1e4f));
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t e = 0; e < n; ++e) kt[e * kt_stride + i] = k[i * stride + e];
      const auto w = random_floats(heads * rows, heads + 7, 1.0f);
      std::vector<float> dot_expect(heads * rows), axpy_expect(heads * n, 0.25f);
      for (std::size_t h = 0; h < heads; ++h)
        for (std::size_t i = 0; i < rows; ++i) {
          dot_expect[h * rows + i] = ref.dot_f16(q.data() + h * n, k.data() + i * stride, n);
          ref.axpy_f16(w[h * rows + i], k.data() + i * stride, axpy_expect.data() + h * n, n);
        }
      for (const isa v : test::runnable_isas()) {
        const auto& t = engine::kernels_for(v);
        CAPTURE(n, heads, engine::to_string(v));
        std::vector<float> dots(heads * rows, -1.0f), acc(heads * n, 0.25f);
        t.dot_f16_rows(q.data(), n, heads, k.data(), stride, rows, n, dots.data(), rows);
        t.axpy_f16_rows(w.data(), rows, heads, k.data(), stride, rows, n, acc.data(), n);
        CHECK(same_bits(dots, dot_expect));
        CHECK(same_bits(acc, axpy_expect));
        // Transposed: whole sets of 16 rows and the partial last one; the
        // padding's lanes are not written (out is rows apart: they would land
        // on the next head's scores).
        std::vector<float> dots_t(heads * rows, -1.0f);
        t.dot_f16_kt(q.data(), n, heads, kt.data(), kt_stride, rows, n, dots_t.data(), rows);
        CHECK(same_bits(dots_t, dot_expect));
      }
    }
  }
}

TEST_CASE("attention's fp16 dot and axpy and the Q8_0 quantizer agree across variants", "[engine][isa]") {
  const auto variants = test::runnable_isas();
  const auto& ref = engine::kernels_for(isa::scalar);
  for (const std::size_t n : {16, 64, 100, 128, 7}) {
    const auto q = random_floats(n, n, 2.0f);
    const auto kf = random_floats(n, n + 1, 2.0f);
    std::vector<std::uint16_t> k(n);
    for (std::size_t i = 0; i < n; ++i) k[i] = model::float_to_f16(kf[i]);
    for (const isa v : variants) {
      const auto& t = engine::kernels_for(v);
      CAPTURE(n, engine::to_string(v));
      const float a = ref.dot_f16(q.data(), k.data(), n), b = t.dot_f16(q.data(), k.data(), n);
      CHECK(std::memcmp(&a, &b, sizeof a) == 0);
      auto out_ref = q, out = q;
      ref.axpy_f16(0.37f, k.data(), out_ref.data(), n);
      t.axpy_f16(0.37f, k.data(), out.data(), n);
      CHECK(same_bits(out, out_ref));
    }
  }
  const auto x = random_floats(4096, 5, 40.0f);
  std::vector<model::block_q8_0> expect(128), got(128);
  model::quantize_row_q8_0(x.data(), expect.data(), x.size());
  for (const isa v : variants) {
    engine::kernels_for(v).quantize_q8_0(x.data(), got.data(), x.size());
    CHECK(std::memcmp(expect.data(), got.data(), expect.size() * sizeof expect[0]) == 0);
  }
}

TEST_CASE("RMS norms of several rows side by side equal one row at a time, bit for bit", "[engine][isa][math]") {
  // rms_norm_rows runs up to 8 rows' double sums together (the forward
  // pass's norms); each row must be rms_norm's, for every count of rows in a
  // run and past it, widths with no whole group, and strides wider than a row.
  for (const std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{768}, std::size_t{1001}}) {
    const std::size_t rows = 19, x_stride = n + 3, out_stride = n + 5;
    // Magnitudes 1e-6 to 1e6. (The double sum's order itself hardly shows:
    // rounded to a float mean, sums in other orders nearly always give the
    // same bits. What this pins is each row's own result, in its place.)
    auto x = random_floats(rows * x_stride, 40 + n, 1.0f);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] *= std::pow(10.0f, static_cast<float>(static_cast<int>(i % 13) - 6));
    const auto w = random_floats(n, 41 + n, 2.0f);
    for (std::size_t count = 0; count <= rows; ++count) {
      std::vector<float> got(rows * out_stride, -7.0f), want(rows * out_stride, -7.0f);
      engine::rms_norm_rows(x.data(), x_stride, w.data(), n, 1e-5f, got.data(), out_stride, count);
      for (std::size_t r = 0; r < count; ++r)
        engine::rms_norm(x.data() + r * x_stride, w.data(), n, 1e-5f, want.data() + r * out_stride);
      CAPTURE(n, count);
      CHECK(same_bits(got, want));  // the gaps between rows and the rows past count untouched too
    }
  }
}

TEST_CASE("SiLU, softmax and the Q8_0 quantizer's ties agree bitwise across variants", "[engine][isa][math]") {
  const auto variants = test::runnable_isas();
  const auto& ref = engine::kernels_for(isa::scalar);
  // Every range det::expf distinguishes: ordinary arguments, both cut-offs
  // and their neighbours, subnormal results, signed zeros, infinities, NaN.
  std::vector<float> g = random_floats(4099, 11, 30.0f);
  const auto wide = random_floats(2000, 12, 120.0f);
  g.insert(g.end(), wide.begin(), wide.end());
  for (const float f : {0.0f, -0.0f, 88.8f, -88.8f, 88.79f, 104.0f, -104.0f, 103.99f, 104.01f, 87.0f, -87.5f,
                        100.0f, -100.0f, 1e-30f, -1e-30f, __builtin_inff(), -__builtin_inff(), __builtin_nanf("")})
    g.push_back(f);
  const auto u = random_floats(g.size(), 13, 3.0f);
  // The scalar table must be det::expf itself (the reference of ops.hpp).
  {
    auto out = g;
    ref.silu_mul(out.data(), u.data(), out.size());
    for (std::size_t i = 0; i < g.size(); ++i) {
      const float want = g[i] / (1.0f + engine::det::expf(-g[i])) * u[i];
      if (std::memcmp(&want, &out[i], sizeof want) != 0) FAIL("scalar silu_mul differs at " << i << " x=" << g[i]);
    }
  }
  // And its softmax ops.hpp's, whose summation order (8 lanes, a tree, the
  // rest) the vector variants follow.
  for (const std::size_t n : {1, 7, 8, 9, 16, 23, 64, 511}) {
    auto a = random_floats(n, 200 + n, 12.0f), b = a;
    engine::softmax(a.data(), n);
    ref.softmax(b.data(), n);
    CAPTURE(n);
    CHECK(same_bits(a, b));
  }
  for (const isa v : variants) {
    const auto& t = engine::kernels_for(v);
    CAPTURE(engine::to_string(v));
    for (const std::size_t n : {g.size(), std::size_t{7}, std::size_t{1}, std::size_t{12}}) {
      std::vector<float> a(g.begin(), g.begin() + static_cast<std::ptrdiff_t>(n)), b = a;
      ref.silu_mul(a.data(), u.data(), n);
      t.silu_mul(b.data(), u.data(), n);
      CHECK(std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0);
    }
    // softmax rows as attention makes them: scaled scores of every length up
    // to two vector widths past a multiple, and one long row.
    for (const std::size_t n : {1, 3, 4, 5, 8, 9, 15, 16, 17, 33, 511}) {
      auto a = random_floats(n, 100 + n, 12.0f), b = a;
      ref.softmax(a.data(), n);
      t.softmax(b.data(), n);
      CAPTURE(n);
      CHECK(same_bits(a, b));
    }
    // Signed zeros (the vector max may pick the other zero), a NaN, infinities.
    for (const std::vector<float>& row :
         {std::vector<float>{-0.0f, 0.0f, -0.0f, 0.0f, -0.0f, -0.0f, 0.0f, -0.0f, 0.0f},
          std::vector<float>{0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, 0.0f, -0.0f, -0.0f, -3.0f},
          std::vector<float>{1.0f, 2.0f, __builtin_nanf(""), 3.0f, -1.0f, 0.5f, 0.25f, 7.0f, -2.0f},
          std::vector<float>{1.0f, -__builtin_inff(), 3.0f, -1.0f, 0.5f, 0.25f, 7.0f, -2.0f, 4.0f}}) {
      auto a = row, b = row;
      ref.softmax(a.data(), a.size());
      t.softmax(b.data(), b.size());
      CHECK(same_bits(a, b));
    }
    // Long rows, so the special lanes also land in the groups the vector
    // variants take several at a time: scores spread so wide that many
    // underflow (below det::expf's lower cut-off once the max is taken), and
    // a row with infinities and one with a NaN past the first 32.
    {
      auto wide_row = random_floats(203, 31, 300.0f);
      auto inf_row = random_floats(96, 32, 12.0f);
      for (const std::size_t at : {3, 40, 41, 77}) inf_row[at] = -__builtin_inff();
      auto nan_row = random_floats(70, 33, 12.0f);
      nan_row[45] = __builtin_nanf("");
      for (const auto& row : {wide_row, inf_row, nan_row}) {
        auto a = row, b = row;
        ref.softmax(a.data(), a.size());
        t.softmax(b.data(), b.size());
        CAPTURE(row.size());
        CHECK(same_bits(a, b));
      }
    }
  }
  // Ties: with amax = 127 the scale is 1 and x.5 values round away from zero.
  std::vector<float> x(256);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = (i % 32 == 0) ? 127.0f : static_cast<float>(static_cast<int>(i % 61) - 30) + 0.5f;
  std::vector<model::block_q8_0> expect(8), got(8);
  model::quantize_row_q8_0(x.data(), expect.data(), x.size());
  for (const isa v : variants) {
    CAPTURE(engine::to_string(v));
    engine::kernels_for(v).quantize_q8_0(x.data(), got.data(), x.size());
    CHECK(std::memcmp(expect.data(), got.data(), expect.size() * sizeof expect[0]) == 0);
  }
  // Whole runs of 8 blocks (their scales computed together) and a rest, with
  // blocks of every finite kind: all zeros, a scale in f16's subnormals, one
  // beyond f16's range (d's f16 bits an infinity), the largest floats.
  std::vector<float> y = random_floats(19 * 32, 21, 40.0f);
  for (const std::size_t blk : {std::size_t{0}, std::size_t{17}})
    std::fill_n(y.begin() + static_cast<std::ptrdiff_t>(blk * 32), 32, 0.0f);
  for (std::size_t i = 0; i < 32; ++i) y[3 * 32 + i] *= 1e-6f;
  for (std::size_t i = 0; i < 32; ++i) y[5 * 32 + i] *= 1e6f;
  y[9 * 32 + 4] = 3.4e38f;
  y[18 * 32 + 1] = -3.4e38f;
  std::vector<model::block_q8_0> want(19), have(19);
  model::quantize_row_q8_0(y.data(), want.data(), y.size());
  for (const isa v : variants) {
    CAPTURE(engine::to_string(v));
    engine::kernels_for(v).quantize_q8_0(y.data(), have.data(), y.size());
    for (std::size_t blk = 0; blk < want.size(); ++blk) {
      CAPTURE(blk);
      CHECK(want[blk].d == have[blk].d);
      CHECK(std::memcmp(want[blk].qs, have[blk].qs, sizeof want[blk].qs) == 0);
    }
  }
  // Blocks holding a NaN (either sign) or an infinity, in runs of 8 and in
  // the rest, at lanes of each 16- and 8-lane part: every variant writes the
  // scalar steps' NaN scale and zero quants, and their neighbours as before.
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<std::pair<std::size_t, float>> bad = {{2 * 32 + 0, nan},   {7 * 32 + 31, -inf},
                                                          {8 * 32 + 16, inf},  {12 * 32 + 17, -nan},
                                                          {20 * 32 + 9, nan},  {20 * 32 + 26, inf},
                                                          {25 * 32 + 5, -nan}, {26 * 32 + 30, -inf}};
  std::vector<float> z = random_floats(27 * 32, 23, 40.0f);
  const std::vector<float> z_clean = z;
  for (const auto& [at, v] : bad) z[at] = v;
  std::vector<model::block_q8_0> nf_want(27), clean_want(27), nf_have(27);
  model::quantize_row_q8_0(z.data(), nf_want.data(), z.size());
  model::quantize_row_q8_0(z_clean.data(), clean_want.data(), z_clean.size());
  for (std::size_t blk = 0; blk < nf_want.size(); ++blk) {
    const bool hit = std::any_of(bad.begin(), bad.end(), [&](const auto& p) { return p.first / 32 == blk; });
    CAPTURE(blk);
    if (hit) {
      CHECK(nf_want[blk].d == model::q8_nonfinite_scale);
      CHECK(std::all_of(std::begin(nf_want[blk].qs), std::end(nf_want[blk].qs), [](std::int8_t q) { return q == 0; }));
    } else {
      CHECK(std::memcmp(&nf_want[blk], &clean_want[blk], sizeof nf_want[blk]) == 0);
    }
  }
  for (const isa v : variants) {
    CAPTURE(engine::to_string(v));
    engine::kernels_for(v).quantize_q8_0(z.data(), nf_have.data(), z.size());
    for (std::size_t blk = 0; blk < nf_want.size(); ++blk) {
      CAPTURE(blk);
      CHECK(std::memcmp(&nf_want[blk], &nf_have[blk], sizeof nf_want[blk]) == 0);
    }
  }
}

namespace {

// A two-layer model of `type` (K-quants 256 wide, in llama.cpp's _K_M mix).
model::model_spec two_layer_spec(model::tensor_type type) {
  auto spec = test::tiny_spec(type);
  if (model::block_elems(type) == model::qk_k) {
    spec.dim = 256;
    spec.ff_dim = 512;
    spec.mix = model::quant_mix::k_m;
  }
  spec.n_layers = 2;
  return spec;
}

// `prompt` through one forward pass of `m`, logits at every `every`-th
// position and the last; `mem` gets the forward's weight copies.
std::vector<float> prompt_logits(const model::llama_model& m, const std::vector<std::int32_t>& prompt,
                                 std::uint32_t every, engine::resident_options o = {},
                                 engine::resident_memory* mem = nullptr) {
  const auto n = static_cast<std::uint32_t>(prompt.size());
  auto pool = test::make_pool(m, 64);
  engine::kv_cache cache(*pool, {m.config().n_layers, m.config().kv_dim(), 16});
  engine::thread_pool threads(2);
  engine::llama_forward fwd(m.config(), m.weights(), cache, threads, o);
  if (mem != nullptr) *mem = fwd.weights_memory();
  REQUIRE(cache.reserve(1, n));
  engine::forward_batch batch;
  batch.tables.push_back(&cache.table(1));
  for (std::uint32_t p = 0; p < n; ++p) batch.tokens.push_back({prompt[p], p, 0, p % every == 0 || p + 1 == n});
  std::vector<float> logits;
  fwd.run(batch, logits);
  return logits;
}

}  // namespace

TEST_CASE("a model's logits are bitwise the same on every ISA variant", "[engine][isa]") {
  const auto type = GENERATE(model::tensor_type::f32, model::tensor_type::f16, model::tensor_type::q8_0,
                             model::tensor_type::q4_0, model::tensor_type::q4_K);
  CAPTURE(model::to_string(type));
  auto m = test::make_model(two_layer_spec(type));
  const auto prompt = test::test_prompt(40, m->config().vocab_size, 11);

  const auto logits_on = [&](isa v) {
    test::isa_scope scope(v);
    return prompt_logits(*m, prompt, 3);
  };
  const auto reference = logits_on(isa::scalar);
  REQUIRE_FALSE(reference.empty());
  for (const isa v : test::runnable_isas()) {
    CAPTURE(engine::to_string(v));
    CHECK(same_bits(logits_on(v), reference));
  }
}

TEST_CASE("a token whose embedding overflows gives the same NaN logits on every ISA variant", "[engine][isa]") {
  // A model file may hold an infinite scale or value (an f16 overflow when
  // it was converted). The token's hidden state is then not finite, its K and
  // V reach every later position through attention, and the activations'
  // q8 blocks, norms, SiLU and softmax all see NaNs and infinities: the
  // logits must still be the same bits on every variant, finite before the
  // token and NaN from it on. (Every NaN here is x86's own, 0xffc00000, the
  // q8 blocks' NaN scale included, so the bits do not depend on which
  // operand an operation took its NaN from.)
  const auto type = GENERATE(model::tensor_type::f32, model::tensor_type::f16, model::tensor_type::q8_0,
                             model::tensor_type::q4_0, model::tensor_type::q4_K);
  CAPTURE(model::to_string(type));
  auto m = test::make_model(two_layer_spec(type));
  auto prompt = test::test_prompt(24, m->config().vocab_size, 13);
  const std::int32_t poisoned = prompt[9];
  for (std::size_t p = 0; p < 9; ++p)
    if (prompt[p] == poisoned) prompt[p] = poisoned == 3 ? 4 : 3;

  m = test::make_poisoned_model(two_layer_spec(type), poisoned);

  const auto logits_on = [&](isa v) {
    test::isa_scope scope(v);
    return prompt_logits(*m, prompt, 1);
  };
  const auto reference = logits_on(isa::scalar);
  const std::size_t vocab = m->config().vocab_size;
  REQUIRE(reference.size() == prompt.size() * vocab);
  for (std::size_t p = 0; p < prompt.size(); ++p) {
    CAPTURE(p);
    const auto first = reference.begin() + static_cast<std::ptrdiff_t>(p * vocab);
    if (p < 9)
      CHECK(std::all_of(first, first + static_cast<std::ptrdiff_t>(vocab), [](float l) { return std::isfinite(l); }));
    else
      CHECK(std::all_of(first, first + static_cast<std::ptrdiff_t>(vocab),
                        [](float l) { return std::bit_cast<std::uint32_t>(l) == model::f32_default_nan_bits; }));
  }
  for (const isa v : test::runnable_isas()) {
    CAPTURE(engine::to_string(v));
    CHECK(same_bits(logits_on(v), reference));
  }
}

TEST_CASE("a forward's weight copies hold the file's bytes and give the mapping's logits bitwise", "[engine][weights]") {
  const auto type = GENERATE(model::tensor_type::f32, model::tensor_type::f16, model::tensor_type::q8_0,
                             model::tensor_type::q4_0, model::tensor_type::q4_K);
  CAPTURE(model::to_string(type));
  auto spec = two_layer_spec(type);
  // Tied: the head is token_embd, copied for the head while the embedding
  // lookups keep reading the file.
  spec.tie_embeddings = GENERATE(false, true);
  CAPTURE(spec.tie_embeddings);
  auto m = test::make_model(spec);
  REQUIRE(m->weights().tied_output == spec.tie_embeddings);
  const auto prompt = test::test_prompt(24, m->config().vocab_size, 5);
  std::size_t matrices = 1, packed = m->weights().output.type == model::tensor_type::q8_0 ? 1 : 0;
  for (const auto& l : m->weights().layers)
    for (const model::weight_view* v : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      ++matrices;
      packed += v->type == model::tensor_type::q8_0 ? 1 : 0;
    }

  engine::resident_memory copied, mapped;
  const auto from_copies = prompt_logits(*m, prompt, 5, {}, &copied);
  engine::resident_options keep_mapping;
  keep_mapping.copy_unpacked = false;
  const auto from_mapping = prompt_logits(*m, prompt, 5, keep_mapping, &mapped);
  REQUIRE_FALSE(from_copies.empty());
  CHECK(same_bits(from_copies, from_mapping));
  CHECK(copied.copies == matrices);  // every matrix: q8_0 packed, the others copied
  CHECK(mapped.copies == packed);    // q8_0 is packed either way
  CHECK((copied.bytes > mapped.bytes) == (packed < matrices));
}

TEST_CASE("the weight store copies into huge pages where the kernel allows them and leaves what it is told to",
          "[engine][weights]") {
  // 3 MiB of f16 (over one huge page), a small f32 matrix and a q8_0 one.
  const weight_buffer big(model::tensor_type::f16, 1536, 1024, 1);
  const weight_buffer small(model::tensor_type::f32, 8, 64, 2);
  const weight_buffer q8(model::tensor_type::q8_0, 20, 64, 3);
  model::weight_view a = big.view, b = small.view, c = q8.view;
  model::weight_view* const views[] = {&a, &b, &c};
  engine::resident_memory mem;
  {
    engine::weight_store store;
    store.place(views);
    mem = store.memory();
    engine::weight_store moved = std::move(store);  // the copies move with it
    CHECK(a.data != big.view.data);
    CHECK(b.data != small.view.data);
    CHECK(std::memcmp(a.data, big.bytes.data(), big.bytes.size()) == 0);
    CHECK(std::memcmp(b.data, small.bytes.data(), small.bytes.size()) == 0);
    CHECK(c.data == q8.view.data);
    REQUIRE(c.packed != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(a.data) % 64 == 0);
    CHECK(reinterpret_cast<std::uintptr_t>(b.data) % 64 == 0);
    CHECK(moved.memory().copies == 3);
  }
  CHECK(mem.bytes == big.bytes.size() + small.bytes.size() + 2 * engine::q8p_group_bytes(64));
  const std::string thp = engine::thp_mode();
  CAPTURE(thp);
  CHECK(mem.huge_pages == (thp == "always" || thp == "madvise"));

  // Told to keep the mapping: only q8_0 is packed; told not to ask for huge
  // pages: none are asked for.
  model::weight_view a2 = big.view, c2 = q8.view;
  model::weight_view* const two[] = {&a2, &c2};
  engine::weight_store mapped_store({.copy_unpacked = false, .huge_pages = true});
  mapped_store.place(two);
  CHECK(a2.data == big.view.data);
  CHECK(c2.packed != nullptr);
  CHECK(mapped_store.memory().copies == 1);
  model::weight_view a3 = big.view;
  model::weight_view* const three[] = {&a3};
  engine::weight_store small_pages({.copy_unpacked = true, .huge_pages = false});
  small_pages.place(three);
  CHECK(std::memcmp(a3.data, big.bytes.data(), big.bytes.size()) == 0);
  CHECK_FALSE(small_pages.memory().huge_pages);
}

TEST_CASE("our exp, log, sin and cos are accurate where the engine uses them", "[engine][isa][math]") {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> wide(-700.0, 700.0), angle(0.0, 131072.0), pos(1e-300, 1e300);
  double worst_exp = 0, worst_log = 0, worst_trig = 0;
  for (int i = 0; i < 20000; ++i) {
    const double x = wide(rng);
    worst_exp = std::max(worst_exp, std::fabs(engine::det::exp(x) - std::exp(x)) / std::exp(x));
    const double y = pos(rng);
    worst_log = std::max(worst_log, std::fabs(engine::det::log(y) - std::log(y)) / std::fabs(std::log(y)));
    const double a = static_cast<float>(angle(rng));
    double s, c;
    engine::det::sincos(a, s, c);
    worst_trig = std::max({worst_trig, std::fabs(s - std::sin(a)), std::fabs(c - std::cos(a))});
  }
  CHECK(worst_exp < 1e-15);
  CHECK(worst_log < 1e-15);
  CHECK(worst_trig < 1e-15);
  CHECK(engine::det::exp(0.0) == 1.0);
  CHECK(engine::det::log(1.0) == 0.0);
  CHECK(std::isinf(engine::det::exp(800.0)));
  CHECK(engine::det::exp(-800.0) == 0.0);
  CHECK(std::isnan(engine::det::log(-1.0)));
  CHECK(std::isinf(engine::det::log(0.0)));
  CHECK(engine::det::exp(-745.0) > 0.0);  // subnormal results survive the scaling
}

TEST_CASE("even_tiles: a batch's token tiles, the fewest of at most max, sizes within one, larger first",
          "[engine][isa]") {
  CHECK(engine::even_tiles(0, 6).tiles == 0);
  const engine::even_tiles b32(32, 6);
  std::vector<std::size_t> sizes;
  for (std::size_t k = 0; k < b32.tiles; ++k) sizes.push_back(b32.size(k));
  CHECK(sizes == std::vector<std::size_t>{6, 6, 5, 5, 5, 5});
  const engine::even_tiles b9(9, 8);
  CHECK(b9.tiles == 2);
  CHECK(b9.size(0) == 5);
  CHECK(b9.size(1) == 4);
  for (std::size_t max = 1; max <= 8; ++max)
    for (std::size_t n = 1; n <= 200; ++n) {
      CAPTURE(max, n);
      const engine::even_tiles e(n, max);
      REQUIRE(e.tiles == (n + max - 1) / max);
      std::size_t sum = 0, lo = max, hi = 0;
      for (std::size_t k = 0; k < e.tiles; ++k) {
        const std::size_t size = e.size(k);
        REQUIRE(size >= 1);
        REQUIRE(size <= max);
        if (k > 0) REQUIRE(size <= e.size(k - 1));
        REQUIRE(e.start(k) == sum);
        REQUIRE(e.index(sum) == k);  // the tile that starts here
        lo = std::min(lo, size);
        hi = std::max(hi, size);
        sum += size;
      }
      REQUIRE(sum == n);
      REQUIRE(e.start(e.tiles) == n);
      REQUIRE(hi - lo <= 1);
    }
}

TEST_CASE("float_block_rows: 32 KiB blocks in 48-row steps, a batch over long rows' at most 384 KiB in 12-row steps",
          "[engine][isa]") {
  using engine::float_block_rows;
  CHECK(float_block_rows(3072, false) == 48);   // 768 f32 columns: 144 KiB, one step however wide
  CHECK(float_block_rows(256, false) == 96);    // 64 f32 columns: two steps in 32 KiB
  CHECK(float_block_rows(16384, false) == 48);  // 4,096 f32 columns, not on the long-row tile
  CHECK(float_block_rows(16384, true) == 24);   // on it: 384 KiB
  CHECK(float_block_rows(8192, true) == 48);    // 4,096 f16 columns: 48 rows are 384 KiB already
  CHECK(float_block_rows(10000, true) == 36);   // 5,000 f16 columns
  CHECK(float_block_rows(44032, true) == 12);   // 11,008 f32 columns: one step, over the limit
  CHECK(float_block_rows(0, false) > 0);        // no division by zero
  for (const bool long_rows : {false, true})
    for (std::size_t pitch = 1; pitch <= 100000; pitch += 7) {
      CAPTURE(long_rows, pitch);
      const std::size_t rows = float_block_rows(pitch, long_rows);
      const std::size_t step = long_rows ? engine::long_row_step : engine::row_multiple;
      const std::size_t limit = long_rows ? engine::long_row_block_bytes : engine::row_block_bytes;
      REQUIRE(rows % step == 0);
      if (long_rows) REQUIRE(rows <= float_block_rows(pitch, false));  // long rows only ever shrink a block
      if (rows > step) REQUIRE(rows * pitch <= std::max(limit, engine::row_multiple * pitch));
      if (long_rows && rows * pitch > engine::long_row_block_bytes) REQUIRE(rows == step);
    }
}
