// K-quant block formats (Q4_K, Q5_K, Q6_K, Q8_K): layouts, quantization
// error bounds, and the Q4_K_M / Q5_K_M tensor mix of generated files.

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <vector>

#include "model/gguf.hpp"
#include "model/half.hpp"
#include "model/kquants.hpp"
#include "model/legacy_quants.hpp"
#include "model/model_gen.hpp"
#include "model/quant_mix.hpp"
#include "model/quantize.hpp"

using namespace exa;
using namespace exa::model;
using Catch::Matchers::Contains;

namespace {

std::vector<float> gaussian(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

// Quantizes and dequantizes x through `type`; returns RMS(error) / RMS(x).
double relative_rms_error(tensor_type type, const std::vector<float>& x) {
  std::vector<std::byte> bytes(row_bytes(type, x.size()));
  convert_row(x, type, bytes.data());
  std::vector<float> y(x.size());
  dequantize_row(type, bytes.data(), y);
  double err = 0, ref = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    err += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
    ref += double(x[i]) * x[i];
  }
  return std::sqrt(err / ref);
}

}  // namespace

TEST_CASE("K-quant types have ggml's ids, names and block sizes", "[model][kquant]") {
  struct row { tensor_type t; std::uint32_t id; const char* name; std::size_t bytes; };
  for (const row& r : {row{tensor_type::q4_K, 12, "q4_K", 144}, row{tensor_type::q5_K, 13, "q5_K", 176},
                       row{tensor_type::q6_K, 14, "q6_K", 210}}) {
    CHECK(static_cast<std::uint32_t>(r.t) == r.id);
    CHECK(tensor_type_from_id(r.id) == r.t);
    CHECK(to_string(r.t) == r.name);
    CHECK(tensor_type_from_string(r.name) == r.t);
    CHECK(block_elems(r.t) == 256);
    CHECK(block_bytes(r.t) == r.bytes);
    CHECK(row_bytes(r.t, 512) == 2 * r.bytes);
  }
  CHECK(ggml_type_info(15)->block_bytes == sizeof(block_q8_K));
}

TEST_CASE("packed 6-bit scales and mins round-trip through scale_min_k4", "[model][kquant]") {
  // Quantize a row whose sub-blocks have very different ranges and offsets,
  // so the eight scales and mins spread over the 6-bit range, then check each
  // sub-block dequantizes to d·sc·q − dmin·m with q in [0, 15] recovered from
  // the nibbles: a layout mismatch between packing and unpacking breaks it.
  std::vector<float> x(256);
  for (int j = 0; j < 8; ++j)
    for (int l = 0; l < 32; ++l) x[32 * j + l] = 0.1f * (j + 1) * (float(l) / 31.0f) - 0.05f * j;
  block_q4_K b;
  quantize_row_q4_K(x.data(), &b, 256);
  std::vector<float> y(256);
  dequantize_row_q4_K(&b, y.data(), 256);
  int distinct_scales = 0;
  std::uint8_t prev = 255;
  for (int j = 0; j < 8; ++j) {
    std::uint8_t sc, m;
    scale_min_k4(j, b.scales, sc, m);
    CHECK(sc <= 63);
    CHECK(m <= 63);
    distinct_scales += sc != prev;
    prev = sc;
    const float d = f16_to_float(b.d) * sc, mn = f16_to_float(b.dmin) * m;
    for (int l = 0; l < 32; ++l) {
      const int e = 32 * j + l;
      const int q = (j % 2 == 0) ? (b.qs[32 * (j / 2) + l] & 15) : (b.qs[32 * (j / 2) + l] >> 4);
      CHECK(y[e] == d * float(q) - mn);
      CHECK(std::fabs(y[e] - x[e]) <= 0.5f * d + 0.02f * 0.8f);
    }
  }
  CHECK(distinct_scales >= 6);  // the scales really differ across sub-blocks
}

TEST_CASE("K-quant quantization error is within the expected bounds", "[model][kquant]") {
  // Relative RMS error on Gaussian data, measured: q4_K ≈ 0.072, q5_K ≈ 0.036,
  // q6_K ≈ 0.018 (each extra bit halves it); q4_0 ≈ 0.087. Bounds leave ~30%.
  const auto x = gaussian(256 * 64, 11);
  const double e4 = relative_rms_error(tensor_type::q4_K, x);
  const double e5 = relative_rms_error(tensor_type::q5_K, x);
  const double e6 = relative_rms_error(tensor_type::q6_K, x);
  const double e40 = relative_rms_error(tensor_type::q4_0, x);
  CHECK(e4 < 0.10);
  CHECK(e5 < 0.05);
  CHECK(e6 < 0.025);
  CHECK(e4 < e40);  // per-sub-block mins and refitted scales beat Q4_0 at similar size
  CHECK(e5 < 0.6 * e4);
  CHECK(e6 < 0.6 * e5);
}

TEST_CASE("K-quants handle zero, constant, tiny and one-sided blocks", "[model][kquant]") {
  for (tensor_type t : {tensor_type::q4_K, tensor_type::q5_K, tensor_type::q6_K}) {
    CAPTURE(to_string(t));
    std::vector<std::vector<float>> rows = {
        std::vector<float>(256, 0.0f), std::vector<float>(256, 0.75f), std::vector<float>(256, -2.0f),
        gaussian(256, 3, 1e-3f), gaussian(256, 4, 100.0f)};
    std::vector<float> positive = gaussian(256, 5);
    for (float& v : positive) v = std::fabs(v) + 1.0f;
    rows.push_back(positive);
    for (const auto& x : rows) {
      std::vector<std::byte> bytes(row_bytes(t, 256));
      convert_row(x, t, bytes.data());
      std::vector<float> y(256);
      dequantize_row(t, bytes.data(), y);
      double amax = 0;
      for (float v : x) amax = std::max(amax, double(std::fabs(v)));
      for (std::size_t i = 0; i < 256; ++i) {
        REQUIRE(std::isfinite(y[i]));
        // Never worse than a quarter of the block's range (q4_K's one-sided
        // rows are the coarsest case); zero stays exactly zero.
        CHECK(std::fabs(y[i] - x[i]) <= 0.25 * amax + 1e-30);
      }
    }
  }
}

TEST_CASE("K-quants stay finite and absolutely small below fp16's range", "[model][kquant]") {
  // The super-block scales are fp16: for |x| ~ 1e-6 the sub-block scale
  // (~1e-7 / 63) underflows to zero and dmin to a few subnormal steps, as in
  // ggml, so such a block reconstructs to a few 1e-6 at most. Check it stays
  // finite and absolutely tiny rather than relatively accurate.
  for (tensor_type t : {tensor_type::q4_K, tensor_type::q5_K, tensor_type::q6_K}) {
    CAPTURE(to_string(t));
    const auto x = gaussian(256, 3, 1e-6f);
    std::vector<std::byte> bytes(row_bytes(t, 256));
    convert_row(x, t, bytes.data());
    std::vector<float> y(256);
    dequantize_row(t, bytes.data(), y);
    for (std::size_t i = 0; i < 256; ++i) {
      REQUIRE(std::isfinite(y[i]));
      CHECK(std::fabs(y[i] - x[i]) <= 64 * 0x1.0p-18);  // 63 · dmin with dmin ≤ 4 fp16 subnormal steps
    }
  }
}

TEST_CASE("Q8_K activations: scale, rounding and bsums", "[model][kquant]") {
  auto x = gaussian(512, 9, 3.0f);
  x[300] = -30.0f;  // the value of largest magnitude always maps to -127 (d takes its sign)
  std::vector<block_q8_K> q(2);
  quantize_row_q8_K(x.data(), q.data(), 512);
  for (int b = 0; b < 2; ++b) {
    float amax = 0;
    for (int i = 0; i < 256; ++i) amax = std::max(amax, std::fabs(x[256 * b + i]));
    CHECK(std::fabs(q[b].d) == Approx(amax / 127.0f).epsilon(1e-6));
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += q[b].qs[16 * g + i];
      CHECK(q[b].bsums[g] == sum);
    }
    for (int i = 0; i < 256; ++i) CHECK(std::fabs(q[b].d * q[b].qs[i] - x[256 * b + i]) <= 0.5001f * std::fabs(q[b].d));
  }
  CHECK(q[1].qs[300 - 256] == -127);
  CHECK(q[1].d > 0.0f);
  std::vector<float> zero(256, 0.0f);
  quantize_row_q8_K(zero.data(), q.data(), 256);
  CHECK(q[0].d == 0.0f);
  CHECK(q[0].bsums[3] == 0);
}

TEST_CASE("weight formats parse and map to llama.cpp file types", "[model][kquant]") {
  auto f = weight_format_from_string("Q4_K_M");
  REQUIRE(f);
  CHECK(f->base == tensor_type::q4_K);
  CHECK(f->mix == quant_mix::k_m);
  CHECK(to_string(*f) == "q4_k_m");
  CHECK(llama_file_type(*f) == 15);
  CHECK(llama_file_type(*weight_format_from_string("q5_k_m")) == 17);
  CHECK(llama_file_type(*weight_format_from_string("q6_k")) == 18);
  CHECK(llama_file_type(*weight_format_from_string("q8_0")) == 7);
  CHECK(weight_format_from_string("q6_k")->mix == quant_mix::uniform);
  CHECK_FALSE(weight_format_from_string("q3_k_m"));
  CHECK_FALSE(weight_format_from_string("q4_k_"));
}

TEST_CASE("the *_K_M mix follows llama.cpp's use_more_bits rule", "[model][kquant]") {
  // llama.cpp: i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2. For 16 layers:
  // 0, 1, 4, 7, 10, 13, 14, 15.
  std::vector<int> picked;
  for (int i = 0; i < 16; ++i)
    if (use_more_bits(i, 16)) picked.push_back(i);
  CHECK(picked == std::vector<int>{0, 1, 4, 7, 10, 13, 14, 15});

  const weight_format m{tensor_type::q4_K, quant_mix::k_m};
  CHECK(weight_type_for(m, "output.weight", false, 16, 768) == tensor_type::q6_K);
  CHECK(weight_type_for(m, "token_embd.weight", false, 16, 768) == tensor_type::q4_K);
  CHECK(weight_type_for(m, "token_embd.weight", true, 16, 768) == tensor_type::q6_K);
  CHECK(weight_type_for(m, "blk.4.attn_v.weight", false, 16, 768) == tensor_type::q6_K);
  CHECK(weight_type_for(m, "blk.5.attn_v.weight", false, 16, 768) == tensor_type::q4_K);
  CHECK(weight_type_for(m, "blk.15.ffn_down.weight", false, 16, 768) == tensor_type::q6_K);
  CHECK(weight_type_for(m, "blk.12.ffn_down.weight", false, 16, 768) == tensor_type::q4_K);
  CHECK(weight_type_for(m, "blk.0.attn_q.weight", false, 16, 768) == tensor_type::q4_K);
  CHECK(weight_type_for(m, "blk.0.ffn_up.weight", false, 16, 768) == tensor_type::q4_K);
  const weight_format m5{tensor_type::q5_K, quant_mix::k_m};
  CHECK(weight_type_for(m5, "blk.0.attn_k.weight", false, 16, 768) == tensor_type::q5_K);
  CHECK(weight_type_for(m5, "blk.0.attn_v.weight", false, 16, 768) == tensor_type::q6_K);
  const weight_format u{tensor_type::q6_K, quant_mix::uniform};
  CHECK(weight_type_for(u, "blk.5.attn_q.weight", false, 16, 768) == tensor_type::q6_K);
}

TEST_CASE("a generated q4_k_m file has the mix and reads back within error", "[model][kquant]") {
  model_spec s;
  s.name = "kq";
  s.n_layers = 8;
  s.dim = 256;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.ff_dim = 512;
  s.type = tensor_type::q4_K;
  s.mix = quant_mix::k_m;
  std::filesystem::create_directories(EXA_TEST_TMPDIR);
  const std::string path = std::string(EXA_TEST_TMPDIR) + "/kq_q4_k_m.gguf";
  REQUIRE(generate_model(s, path));
  auto f = gguf_file::open(path);
  REQUIRE(f);
  CHECK(f->get_int("general.file_type").value_or(-1) == 15);
  const auto type_of = [&](const char* name) { return f->find_tensor(name)->type_id; };
  CHECK(type_of("output.weight") == 14u);
  CHECK(type_of("token_embd.weight") == 12u);
  CHECK(type_of("blk.0.attn_norm.weight") == 0u);
  CHECK(type_of("blk.0.attn_v.weight") == 14u);   // 0 < 8/8
  CHECK(type_of("blk.1.attn_v.weight") == 12u);
  CHECK(type_of("blk.3.ffn_down.weight") == 14u);  // (3 - 1) % 3 == 2
  CHECK(type_of("blk.7.ffn_down.weight") == 14u);  // 7 >= 7
  CHECK(type_of("blk.2.ffn_gate.weight") == 12u);

  // Same spec in f32: each K-quant tensor dequantizes close to it.
  s.type = tensor_type::f32;
  s.mix = quant_mix::uniform;
  const std::string path32 = std::string(EXA_TEST_TMPDIR) + "/kq_f32.gguf";
  REQUIRE(generate_model(s, path32));
  auto g = gguf_file::open(path32);
  REQUIRE(g);
  for (const char* name : {"blk.1.attn_q.weight", "blk.0.attn_v.weight", "output.weight"}) {
    const gguf_tensor* tq = f->find_tensor(name);
    const gguf_tensor* tf = g->find_tensor(name);
    const std::size_t cols = tq->shape[0];
    std::vector<float> ref(cols), got(cols);
    double err = 0, mass = 0;
    for (std::size_t r = 0; r < 8; ++r) {
      std::memcpy(ref.data(), tf->data + r * cols * 4, cols * 4);
      dequantize_row(*tq->type, tq->data + r * row_bytes(*tq->type, cols), got);
      for (std::size_t i = 0; i < cols; ++i) {
        err += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
        mass += double(ref[i]) * ref[i];
      }
    }
    INFO(name);
    CHECK(std::sqrt(err / mass) < (*tq->type == tensor_type::q6_K ? 0.025 : 0.10));
  }
}

TEST_CASE("K-quant rows that are not whole super-blocks fall back as in llama.cpp", "[model][kquant]") {
  // llama.cpp's tensor_type_fallback: q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0,
  // f16 when rows are not whole 32-element blocks either; an output tensor
  // with such rows is q8_0 directly.
  const weight_format m4{tensor_type::q4_K, quant_mix::k_m};
  const weight_format m5{tensor_type::q5_K, quant_mix::k_m};
  CHECK(weight_type_for(m4, "blk.1.attn_q.weight", false, 2, 64) == tensor_type::q5_0);
  CHECK(weight_type_for(m5, "blk.1.attn_q.weight", false, 2, 64) == tensor_type::q5_1);
  // With 2 layers use_more_bits picks layer 1 only (1 >= 7·2/8).
  CHECK(weight_type_for(m4, "blk.1.attn_v.weight", false, 2, 64) == tensor_type::q8_0);  // q6_K's fallback
  CHECK(weight_type_for(m4, "blk.0.attn_v.weight", false, 2, 64) == tensor_type::q5_0);
  CHECK(weight_type_for(m4, "output.weight", false, 2, 896) == tensor_type::q8_0);
  CHECK(weight_type_for(m4, "blk.1.ffn_down.weight", false, 2, 4864) == tensor_type::q6_K);  // 19 · 256
  CHECK(weight_type_for(m4, "blk.1.ffn_up.weight", false, 2, 48) == tensor_type::f16);
  CHECK(weight_type_for({tensor_type::q6_K, quant_mix::uniform}, "blk.1.ffn_up.weight", false, 2, 96) ==
        tensor_type::q8_0);

  model_spec s = *preset_spec("tiny");  // dim 64, ff 192
  s.type = tensor_type::q4_K;
  s.mix = quant_mix::k_m;
  CHECK(validate(s));
  std::filesystem::create_directories(EXA_TEST_TMPDIR);
  const std::string path = std::string(EXA_TEST_TMPDIR) + "/kq_tiny_q4_k_m.gguf";
  REQUIRE(generate_model(s, path));
  auto f = gguf_file::open(path);
  REQUIRE(f);
  CHECK(f->find_tensor("blk.1.attn_q.weight")->type_id == 6u);    // q5_0
  CHECK(f->find_tensor("blk.1.ffn_down.weight")->type_id == 8u);  // q6_K -> q8_0
  CHECK(f->find_tensor("blk.0.ffn_down.weight")->type_id == 6u);
  CHECK(f->find_tensor("output.weight")->type_id == 8u);

  s.type = tensor_type::q8_0;  // a mix needs a K-quant base
  auto r = validate(s);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::invalid_argument);
  CHECK_THAT(r.error().message, Contains("q4_K or q5_K base"));
}

TEST_CASE("Q4_1, Q5_0 and Q5_1 follow ggml's layouts and bound the error", "[model][kquant]") {
  // Ramp blocks make every level appear, so each nibble and fifth bit is
  // checked against ggml's formulas written out independently here.
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[i] = (i < 32 ? 0.1f : -0.3f) * float(i % 32) + (i < 32 ? -1.0f : 2.0f);
  block_q5_0 b5[2];
  quantize_row_q5_0(x.data(), b5, 64);
  for (int b = 0; b < 2; ++b) {
    std::uint32_t qh;
    std::memcpy(&qh, b5[b].qh, 4);
    for (int j = 0; j < 16; ++j) {
      const int lo = (b5[b].qs[j] & 15) | (((qh >> j) & 1) << 4);
      const int hi = (b5[b].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      const float d = f16_to_float(b5[b].d);
      CHECK(std::fabs(d * float(lo - 16) - x[32 * b + j]) <= 0.5f * std::fabs(d) + 1e-6f);
      CHECK(std::fabs(d * float(hi - 16) - x[32 * b + 16 + j]) <= 0.5f * std::fabs(d) + 1e-6f);
    }
  }
  block_q4_1 b4[2];
  quantize_row_q4_1(x.data(), b4, 64);
  CHECK(f16_to_float(b4[0].m) == Approx(-1.0f).epsilon(1e-3));
  CHECK((b4[0].qs[0] & 15) == 0);   // the minimum is level 0
  CHECK((b4[0].qs[15] >> 4) == 15);  // the maximum is level 15
  block_q8_1 a[2];
  quantize_row_q8_1(x.data(), a, 64);
  int sum = 0;
  for (int j = 0; j < 32; ++j) sum += a[0].qs[j];
  CHECK(f16_to_float(a[0].s) == Approx(sum * (2.1f / 127.0f)).epsilon(2e-3));

  const auto g = gaussian(32 * 512, 21);
  const double e41 = relative_rms_error(tensor_type::q4_1, g);
  const double e50 = relative_rms_error(tensor_type::q5_0, g);
  const double e51 = relative_rms_error(tensor_type::q5_1, g);
  // Measured on Gaussian data: q4_1 ~0.11, q5_0 ~0.046, q5_1 ~0.053.
  CHECK(e41 < 0.13);
  CHECK(e50 < 0.06);
  CHECK(e51 < 0.065);
  CHECK(e50 < 0.6 * relative_rms_error(tensor_type::q4_0, g));
}

TEST_CASE("q8 activation blocks holding a NaN or an infinity quantize to a NaN scale and zeros", "[model]") {
  // ggml would round a NaN product into int8, which C++ leaves undefined;
  // ours gives such a block a NaN scale (x86's own NaN bits) and zero quants,
  // so it stays a NaN through every product, and its finite neighbours are
  // untouched.
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (const float bad : {nan, -nan, inf, -inf}) {
    for (const std::size_t at : {std::size_t{0}, std::size_t{17}, std::size_t{31}}) {
      CAPTURE(bad, at);
      std::vector<float> x(256 * 2);
      for (float& v : x) v = dist(rng);
      std::vector<float> clean = x;
      x[32 + at] = bad;  // the second 32-block of the first 256-block
      std::vector<block_q8_0> q0(x.size() / 32), c0(x.size() / 32);
      quantize_row_q8_0(x.data(), q0.data(), x.size());
      quantize_row_q8_0(clean.data(), c0.data(), clean.size());
      CHECK(q0[1].d == q8_nonfinite_scale);
      CHECK(std::all_of(std::begin(q0[1].qs), std::end(q0[1].qs), [](std::int8_t v) { return v == 0; }));
      for (std::size_t b = 0; b < q0.size(); ++b)
        if (b != 1) CHECK(std::memcmp(&q0[b], &c0[b], sizeof q0[b]) == 0);
      std::vector<float> back(x.size());
      dequantize_row_q8_0(q0.data(), back.data(), back.size());
      CHECK(std::isnan(back[32 + at]));

      std::vector<block_q8_1> q1(x.size() / 32), c1(x.size() / 32);
      quantize_row_q8_1(x.data(), q1.data(), x.size());
      quantize_row_q8_1(clean.data(), c1.data(), clean.size());
      CHECK(q1[1].d == q8_nonfinite_scale);
      CHECK(q1[1].s == q8_nonfinite_scale);
      CHECK(std::all_of(std::begin(q1[1].qs), std::end(q1[1].qs), [](std::int8_t v) { return v == 0; }));
      CHECK(std::memcmp(&q1[0], &c1[0], sizeof q1[0]) == 0);

      std::vector<block_q8_K> qk(x.size() / qk_k), ck(x.size() / qk_k);
      quantize_row_q8_K(x.data(), qk.data(), x.size());
      quantize_row_q8_K(clean.data(), ck.data(), clean.size());
      CHECK(std::bit_cast<std::uint32_t>(qk[0].d) == f32_default_nan_bits);
      CHECK(std::all_of(std::begin(qk[0].qs), std::end(qk[0].qs), [](std::int8_t v) { return v == 0; }));
      CHECK(std::all_of(std::begin(qk[0].bsums), std::end(qk[0].bsums), [](std::int16_t v) { return v == 0; }));
      CHECK(std::memcmp(&qk[1], &ck[1], sizeof qk[1]) == 0);
    }
  }
  // The largest finite magnitude is still an ordinary block.
  std::vector<float> big(32, 1.0f);
  big[5] = -std::numeric_limits<float>::max();
  block_q8_0 q;
  quantize_row_q8_0(big.data(), &q, 32);
  CHECK(q.d == float_to_f16(std::numeric_limits<float>::max() / 127.0f));
  CHECK(q.qs[5] == -127);
}
