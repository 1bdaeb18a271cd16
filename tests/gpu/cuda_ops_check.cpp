// Each CUDA op against the CPU engine's op, as llama.cpp's test-backend-ops
// checks every backend against the CPU: normalized MSE (cuda_test_util.hpp)
// under 1e-7 where both sides round the same inputs the same way and only a
// sum's order or a libm function differs, under 1e-6 for the q8_0 matmul
// (stated looser, though its int8 block sums are exact), and exact equality
// where the GPU must reproduce the CPU's rounding bit for bit (Q8_0
// activation quantization, embedding rows). The matmul's batch invariance is
// checked bitwise here too.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>

#include "cuda_test_util.hpp"
#include "engine/det_math.hpp"
#include "engine/matmul.hpp"
#include "engine/ops.hpp"
#include "engine/thread_pool.hpp"
#include "gpu/cuda_weight_plan.hpp"
#include "gpu/ops/attention.cuh"
#include "gpu/ops/convert.cuh"
#include "gpu/ops/embed.cuh"
#include "gpu/ops/matmul.cuh"
#include "gpu/ops/rms_norm.cuh"
#include "gpu/ops/rope_kv.cuh"
#include "gpu/ops/swiglu.cuh"
#include "model/half.hpp"
#include "model/quantize.hpp"

using namespace exa;
using model::tensor_type;
using test::dev;
using test::nmse;

namespace {

std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<float> halves_to_floats(const std::vector<std::uint16_t>& h) {
  std::vector<float> out(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) out[i] = model::f16_to_float(h[i]);
  return out;
}

// A weight in GGUF layout on the host and as the CUDA engine uploads it
// (gpu/cuda_weight_plan.hpp: f16/bf16 as is, q8_0 repacked).
struct test_weight {
  std::vector<std::byte> host;
  model::weight_view view;
  std::unique_ptr<dev<std::byte>> data;
  std::unique_ptr<dev<float>> scales;

  test_weight(tensor_type type, std::size_t rows, std::size_t cols, std::uint32_t seed) {
    const auto values = random_floats(rows * cols, seed, 1.0f / std::sqrt(static_cast<float>(cols)));
    view.type = type;
    view.rows = rows;
    view.cols = cols;
    view.name = "test.weight";
    host.resize(rows * model::row_bytes(type, cols));
    for (std::size_t r = 0; r < rows; ++r) {
      std::byte* row = host.data() + r * model::row_bytes(type, cols);
      const float* v = values.data() + r * cols;
      if (type == tensor_type::q8_0) {
        model::quantize_row_q8_0(v, reinterpret_cast<model::block_q8_0*>(row), cols);
        continue;
      }
      for (std::size_t i = 0; i < cols; ++i) {
        const std::uint16_t h = type == tensor_type::f16 ? model::float_to_f16(v[i]) : model::float_to_bf16(v[i]);
        std::memcpy(row + 2 * i, &h, 2);
      }
    }
    view.data = host.data();
    if (type == tensor_type::q8_0) {
      std::vector<std::byte> quants(rows * cols);
      std::vector<float> s(rows * cols / 32);
      gpu::repack_q8_0(host.data(), rows, cols, reinterpret_cast<std::int8_t*>(quants.data()), s.data());
      data = std::make_unique<dev<std::byte>>(quants);
      scales = std::make_unique<dev<float>>(s);
    } else {
      data = std::make_unique<dev<std::byte>>(host);
    }
  }

  gpu::ops::matrix_view device_view() const {
    gpu::ops::matrix_view m;
    m.type = view.type == tensor_type::f16    ? gpu::ops::weight_type::f16
             : view.type == tensor_type::bf16 ? gpu::ops::weight_type::bf16
                                              : gpu::ops::weight_type::q8_0;
    m.data = data->get();
    m.scales = scales ? scales->get() : nullptr;
    m.rows = static_cast<int>(view.rows);
    m.cols = static_cast<int>(view.cols);
    return m;
  }
};

gpu::ops::act_type act_of(tensor_type t) {
  return t == tensor_type::f16 ? gpu::ops::act_type::f16
         : t == tensor_type::bf16 ? gpu::ops::act_type::bf16
                                  : gpu::ops::act_type::q8_0;
}

// Activations on the device for n rows of k values, any type.
struct test_acts {
  dev<std::byte> data;
  dev<float> scales;
  gpu::ops::act_view view;
  test_acts(gpu::ops::act_type type, std::size_t n, std::size_t k) : data(n * k * 2), scales(n * k / 32) {
    view = {type, data.get(), scales.get(), static_cast<int>(k)};
  }
};

std::vector<float> cpu_matmul(const model::weight_view& w, const std::vector<float>& x, std::size_t n) {
  engine::thread_pool pool(1);
  engine::activations scratch;
  std::vector<float> y(n * w.rows);
  engine::matmul(w, x.data(), w.cols, n, y.data(), w.rows, pool, scratch);
  return y;
}

}  // namespace

TEST_CASE("CUDA rms_norm matches the CPU's, and gathering rows changes nothing", "[cuda][ops]") {
  constexpr int n = 5, dim = 768;
  const auto x = random_floats(n * dim, 1, 3.0f);
  const auto w = random_floats(dim, 2);
  std::vector<float> want(n * dim);
  for (int t = 0; t < n; ++t) engine::rms_norm(x.data() + t * dim, w.data(), dim, 1e-5f, want.data() + t * dim);

  dev<float> dx(x), dw(w), out(n * dim);
  gpu::ops::rms_norm(dx.get(), nullptr, n, dim, dw.get(), 1e-5f, out.get(), {}, nullptr);
  const auto got = out.download();
  CHECK(nmse(got, want) < 1e-7);

  const std::vector<int> rows = {3, 0};
  dev<int> drows(rows);
  dev<float> gathered(2 * dim);
  gpu::ops::rms_norm(dx.get(), drows.get(), 2, dim, dw.get(), 1e-5f, gathered.get(), {}, nullptr);
  const auto g = gathered.download();
  CHECK(std::memcmp(g.data(), got.data() + 3 * dim, dim * 4) == 0);
  CHECK(std::memcmp(g.data() + dim, got.data(), dim * 4) == 0);
}

TEST_CASE("CUDA activation conversion rounds exactly as the CPU engine's", "[cuda][ops]") {
  constexpr int n = 4, k = 256;
  auto x = random_floats(n * k, 3, 2.0f);
  for (int i = 0; i < 32; ++i) x[32 + i] = 0.0f;  // an all-zero block: scale 0
  dev<float> dx(x);

  SECTION("q8_0: the quants and scales of model::quantize_row_q8_0") {
    test_acts a(gpu::ops::act_type::q8_0, n, k);
    gpu::ops::convert(dx.get(), k, n, k, a.view, nullptr);
    const auto bytes = a.data.download();
    const auto scales = a.scales.download();
    std::size_t mismatches = 0;
    for (int t = 0; t < n; ++t) {
      std::vector<model::block_q8_0> want(k / 32);
      model::quantize_row_q8_0(x.data() + t * k, want.data(), k);
      for (int b = 0; b < k / 32; ++b) {
        mismatches += scales[t * (k / 32) + b] != model::f16_to_float(want[b].d);
        mismatches += std::memcmp(bytes.data() + t * k + b * 32, want[b].qs, 32) != 0;
      }
    }
    CHECK(mismatches == 0);
  }
  SECTION("f16 and bf16: round to nearest even") {
    for (const auto type : {gpu::ops::act_type::f16, gpu::ops::act_type::bf16}) {
      test_acts a(type, n, k);
      gpu::ops::convert(dx.get(), k, n, k, a.view, nullptr);
      const auto bytes = a.data.download();
      std::size_t mismatches = 0;
      for (int i = 0; i < n * k; ++i) {
        std::uint16_t h;
        std::memcpy(&h, bytes.data() + 2 * i, 2);
        mismatches += h != (type == gpu::ops::act_type::f16 ? model::float_to_f16(x[i]) : model::float_to_bf16(x[i]));
      }
      CHECK(mismatches == 0);
    }
  }
}

TEST_CASE("CUDA embedding rows are the CPU's dequantized rows", "[cuda][ops]") {
  constexpr std::size_t vocab = 40, dim = 96;
  const std::vector<int> tokens = {0, 39, 7, 7};
  for (const tensor_type type : {tensor_type::f16, tensor_type::bf16, tensor_type::q8_0}) {
    CAPTURE(model::to_string(type));
    test_weight table(type, vocab, dim, 4);
    dev<int> dt(tokens);
    dev<float> x(tokens.size() * dim);
    gpu::ops::embed(table.device_view(), dt.get(), static_cast<int>(tokens.size()), x.get(), nullptr);
    const auto got = x.download();
    std::vector<float> want(dim);
    for (std::size_t t = 0; t < tokens.size(); ++t) {
      engine::dequantize_row(table.view, static_cast<std::size_t>(tokens[t]), want.data());
      CHECK(std::memcmp(got.data() + t * dim, want.data(), dim * 4) == 0);
    }
  }
}

TEST_CASE("CUDA RoPE matches the CPU's and stores K and V in the page slot", "[cuda][ops]") {
  struct variant {
    const char* name;
    int rope_dim_div;  // rope_dim = head_dim / this
    bool halves;
    float freq_scale;
    bool factors;
  };
  const variant variants[] = {{"adjacent", 1, false, 1.0f, false},
                              {"halves, linear scaling", 1, true, 0.25f, false},
                              {"adjacent, frequency factors, partial rotary", 2, false, 1.0f, true}};
  constexpr int heads = 4, kv_heads = 2, hd = 64, bt = 4;
  const std::vector<int> pos = {0, 7, 1000};
  const int n = static_cast<int>(pos.size()), kv_dim = kv_heads * hd;
  for (const variant& v : variants) {
    CAPTURE(v.name);
    const int rope_dim = hd / v.rope_dim_div;
    auto q = random_floats(n * heads * hd, 5);
    auto k = random_floats(n * kv_dim, 6);
    const auto vv = random_floats(n * kv_dim, 7);
    std::vector<float> factors(rope_dim / 2);
    for (std::size_t i = 0; i < factors.size(); ++i) factors[i] = 1.0f + static_cast<float>(i % 8);

    engine::rope_params p;
    p.rope_dim = rope_dim;
    p.freq_base = 500000.0f;
    p.freq_scale = v.freq_scale;
    p.freq_factors = v.factors ? factors.data() : nullptr;
    p.halves = v.halves;
    // Q, K and V side by side per token, as the fused projection writes them.
    const int width = heads * hd + 2 * kv_dim;
    std::vector<float> qkv(n * width);
    for (int t = 0; t < n; ++t) {
      std::copy_n(q.data() + t * heads * hd, heads * hd, qkv.data() + t * width);
      std::copy_n(k.data() + t * kv_dim, kv_dim, qkv.data() + t * width + heads * hd);
      std::copy_n(vv.data() + t * kv_dim, kv_dim, qkv.data() + t * width + heads * hd + kv_dim);
    }
    dev<float> dqkv(qkv), dfac(factors);
    gpu::ops::rope_view r;
    r.rope_dim = rope_dim;
    r.theta_scale = static_cast<float>(engine::det::pow(500000.0, static_cast<double>(-2.0f / static_cast<float>(rope_dim))));
    r.freq_scale = v.freq_scale;
    r.factors = v.factors ? dfac.get() : nullptr;
    r.halves = v.halves;

    // One sequence whose table maps positions to pages in reverse order.
    const int pages = 1000 / bt + 1;
    std::vector<int> table(pages);
    for (int i = 0; i < pages; ++i) table[i] = pages - 1 - i;
    const long long page_bytes = 2LL * 2 * bt * kv_dim * 2;  // two layers
    dev<std::byte> pool(pages * page_bytes);
    dev<int> dpos(pos), doff(std::vector<int>(n, 0)), dtab(table);
    gpu::ops::step_meta meta{nullptr, dpos.get(), doff.get(), dtab.get(), nullptr};
    const gpu::ops::kv_view kv{pool.get(), page_bytes, bt, kv_dim, 1};
    float* dq = dqkv.get();
    gpu::ops::rope_kv(dq, dq + heads * hd, dq + heads * hd + kv_dim, width, width, n, heads, kv_heads, hd, r, meta, kv,
                      nullptr);

    for (int t = 0; t < n; ++t) {
      engine::rope(q.data() + t * heads * hd, heads, hd, static_cast<std::uint32_t>(pos[t]), p);
      engine::rope(k.data() + t * kv_dim, kv_heads, hd, static_cast<std::uint32_t>(pos[t]), p);
    }
    const auto got = dqkv.download();
    std::vector<float> got_q, got_k, got_v;
    for (int t = 0; t < n; ++t) {
      got_q.insert(got_q.end(), got.begin() + t * width, got.begin() + t * width + heads * hd);
      got_k.insert(got_k.end(), got.begin() + t * width + heads * hd, got.begin() + t * width + heads * hd + kv_dim);
      got_v.insert(got_v.end(), got.begin() + t * width + heads * hd + kv_dim, got.begin() + (t + 1) * width);
    }
    CHECK(nmse(got_q, q) < 1e-7);
    CHECK(nmse(got_k, k) < 1e-7);
    CHECK(got_v == vv);  // V is only stored, never changed
    const auto bytes = pool.download();
    std::vector<float> k_stored, k_want, v_stored, v_want;
    for (int t = 0; t < n; ++t) {
      const std::byte* page = bytes.data() + table[pos[t] / bt] * page_bytes;
      const int slot = pos[t] % bt;
      for (int i = 0; i < kv_dim; ++i) {
        std::uint16_t hk, hv;
        std::memcpy(&hk, page + (((1 * 2 + 0) * bt + slot) * kv_dim + i) * 2, 2);
        std::memcpy(&hv, page + (((1 * 2 + 1) * bt + slot) * kv_dim + i) * 2, 2);
        k_stored.push_back(model::f16_to_float(hk));
        v_stored.push_back(model::f16_to_float(hv));
        k_want.push_back(model::f16_to_float(model::float_to_f16(k[t * kv_dim + i])));
        v_want.push_back(model::f16_to_float(model::float_to_f16(vv[t * kv_dim + i])));
      }
    }
    CHECK(nmse(k_stored, k_want) < 1e-7);
    CHECK(v_stored == v_want);  // V goes through untouched: bitwise
  }
}

TEST_CASE("CUDA matmul matches the CPU's for f16, bf16 and q8_0, and is batch-invariant", "[cuda][ops]") {
  constexpr std::size_t rows = 200, k = 512;  // 200: a partial row tile
  const std::vector<std::size_t> batches = {1, 5, 8, 9, 16, 17, 33, 64, 70};
  const std::size_t n_max = batches.back();
  const auto x = random_floats(n_max * k, 8);
  dev<float> dx(x);
  for (const tensor_type type : {tensor_type::f16, tensor_type::bf16, tensor_type::q8_0}) {
    CAPTURE(model::to_string(type));
    const double bound = type == tensor_type::q8_0 ? 1e-6 : 1e-7;
    test_weight w(type, rows, k, 9);
    const auto want = cpu_matmul(w.view, x, n_max);
    test_acts a(act_of(type), n_max, k);
    gpu::ops::convert(dx.get(), k, static_cast<int>(n_max), k, a.view, nullptr);

    dev<float> y_all(n_max * rows);
    REQUIRE(gpu::ops::matmul(w.device_view(), a.view, static_cast<int>(n_max), y_all.get(), rows, {}, nullptr));
    const auto all = y_all.download();
    CHECK(nmse(all, want) < bound);
    for (const std::size_t n : batches) {
      CAPTURE(n);
      dev<float> y(n * rows);
      REQUIRE(gpu::ops::matmul(w.device_view(), a.view, static_cast<int>(n), y.get(), rows, {}, nullptr));
      // Each token's row is bitwise the same whatever the batch around it.
      CHECK(std::memcmp(y.download().data(), all.data(), n * rows * 4) == 0);
    }

    // The epilogue: y = y0 + (x·Wᵀ + bias), the CPU's order of the residual add.
    const auto bias = random_floats(rows, 10);
    const auto y0 = random_floats(3 * rows, 11);
    dev<float> dbias(bias), y(y0);
    REQUIRE(gpu::ops::matmul(w.device_view(), a.view, 3, y.get(), rows, {dbias.get(), true}, nullptr));
    std::vector<float> expect(3 * rows);
    for (std::size_t i = 0; i < expect.size(); ++i) expect[i] = y0[i] + (want[i] + bias[i % rows]);
    CHECK(nmse(y.download(), expect) < bound);
  }
}

TEST_CASE("CUDA SwiGLU matches the CPU's silu_mul", "[cuda][ops]") {
  constexpr int n = 3, ff = 256;
  const auto g = random_floats(n * ff, 12, 3.0f);
  const auto u = random_floats(n * ff, 13);
  std::vector<float> gu(n * 2 * ff);  // gate and up side by side, as the fused projection writes them
  for (int t = 0; t < n; ++t) {
    std::copy_n(g.data() + t * ff, ff, gu.data() + t * 2 * ff);
    std::copy_n(u.data() + t * ff, ff, gu.data() + t * 2 * ff + ff);
  }
  dev<float> dgu(gu);
  test_acts a(gpu::ops::act_type::f16, n, ff);
  gpu::ops::swiglu(dgu.get(), dgu.get() + ff, 2 * ff, n, ff, a.view, nullptr);
  const auto bytes = a.data.download();
  std::vector<std::uint16_t> h(n * ff);
  std::memcpy(h.data(), bytes.data(), h.size() * 2);
  auto want = g;
  for (int t = 0; t < n; ++t) engine::silu_mul(want.data() + t * ff, u.data() + t * ff, ff);
  for (float& v : want) v = model::f16_to_float(model::float_to_f16(v));
  CHECK(nmse(halves_to_floats(h), want) < 1e-7);
}

TEST_CASE("CUDA paged attention matches a double-precision reference", "[cuda][ops]") {
  for (const int hd : {16, 64, 128, 256}) {
    CAPTURE(hd);
    constexpr int heads = 8, kv_heads = 2, bt = 16, layers = 2, layer = 1;
    const int kv_dim = kv_heads * hd, q_dim = heads * hd;
    const std::vector<int> pos = {0, 5, 130, 300};  // up to three tiles of 128 positions
    const int n = static_cast<int>(pos.size()), positions = 301, pages = (positions + bt - 1) / bt;
    std::vector<int> table(pages);
    for (int i = 0; i < pages; ++i) table[i] = (i * 7) % pages;  // 7 is prime to 19: a permutation
    const long long page_bytes = static_cast<long long>(layers) * 2 * bt * kv_dim * 2;
    std::vector<std::uint16_t> pool(pages * page_bytes / 2);
    const auto kv_values = random_floats(pool.size(), 14);
    for (std::size_t i = 0; i < pool.size(); ++i) pool[i] = model::float_to_f16(kv_values[i]);
    const auto q = random_floats(n * q_dim, 15, 2.0f);

    dev<std::uint16_t> dpool(pool);
    dev<float> dq(q), out(n * q_dim);
    dev<int> dpos(pos), doff(std::vector<int>(n, 0)), dtab(table);
    const gpu::ops::step_meta meta{nullptr, dpos.get(), doff.get(), dtab.get(), nullptr};
    const gpu::ops::kv_view kv{dpool.get(), page_bytes, bt, kv_dim, layer};
    gpu::ops::attention(dq.get(), q_dim, out.get(), n, heads, kv_heads, hd, meta, kv, nullptr);

    // Reference: Q rounded to f16 (as the CPU engine), the rest in double.
    const auto at = [&](int kvi, int j, int e) {  // kvi: 0 = K, 1 = V
      const std::size_t page = static_cast<std::size_t>(table[j / bt]) * (page_bytes / 2);
      return static_cast<double>(model::f16_to_float(pool[page + ((layer * 2 + kvi) * bt + j % bt) * kv_dim + e]));
    };
    std::vector<float> want(n * q_dim);
    for (int t = 0; t < n; ++t) {
      for (int h = 0; h < heads; ++h) {
        const int kvh = h / (heads / kv_heads);
        std::vector<double> s(pos[t] + 1);
        double mx = -INFINITY;
        for (int j = 0; j <= pos[t]; ++j) {
          double dot = 0;
          for (int e = 0; e < hd; ++e)
            dot += model::f16_to_float(model::float_to_f16(q[t * q_dim + h * hd + e])) * at(0, j, kvh * hd + e);
          s[j] = dot / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (double& v : s) sum += (v = std::exp(v - mx));
        for (int e = 0; e < hd; ++e) {
          double o = 0;
          for (int j = 0; j <= pos[t]; ++j) o += s[j] / sum * at(1, j, kvh * hd + e);
          want[t * q_dim + h * hd + e] = static_cast<float>(o);
        }
      }
    }
    CHECK(nmse(out.download(), want) < 1e-7);
  }
}
