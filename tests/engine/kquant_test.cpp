// K-quant dot products (Q4_K, Q5_K, Q6_K weights × Q8_K activations):
//  - each path against a double-precision reference on the dequantized
//    operands, within a bound derived from the float operations the kernel
//    performs (a few roundings per 256-element super-block);
//  - every compiled SIMD path bitwise equal to the scalar one, on quantized
//    data and on random bytes that drive the integer sums to their extremes;
//  - matmul over a K-quant weight equal, bit for bit, to the per-row dot
//    product whatever the batch size or row split.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/kquant_dot.hpp"
#include "engine/legacy_dot.hpp"
#include "engine/matmul.hpp"
#include "fixtures.hpp"
#include "model/half.hpp"
#include "model/kquants.hpp"
#include "model/quantize.hpp"

using namespace exa;
using model::tensor_type;
namespace kq = engine::kquant;

namespace {

constexpr tensor_type k_types[] = {tensor_type::q4_K, tensor_type::q5_K, tensor_type::q6_K};

std::vector<float> gaussian(std::size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

std::vector<std::byte> quantize(tensor_type t, const std::vector<float>& x) {
  std::vector<std::byte> out(model::row_bytes(t, x.size()));
  model::convert_row(x, t, out.data());
  return out;
}

// The magnitude each super-block's float step rounds against: for Q4_K/Q5_K
// the scale part Σ|d·sc·q·x| plus the min part Σ|dmin·m·x| (they may cancel
// in the result but are rounded separately); for Q6_K Σ|w·x|.
std::vector<double> block_magnitudes(tensor_type t, const std::byte* row, const std::vector<float>& w,
                                     const std::vector<float>& x) {
  const std::size_t nb = w.size() / model::qk_k;
  std::vector<double> mag(nb, 0.0);
  for (std::size_t b = 0; b < nb; ++b) {
    for (std::size_t i = 0; i < model::qk_k; ++i) {
      const std::size_t k = b * model::qk_k + i;
      double min_part = 0;
      if (t != tensor_type::q6_K) {
        model::block_q4_K head;  // d, dmin and scales sit at the same offsets in Q5_K
        std::memcpy(&head, row + b * model::block_bytes(t), 16);
        std::uint8_t sc, m;
        model::scale_min_k4(static_cast<int>(i / 32), head.scales, sc, m);
        min_part = double(model::f16_to_float(head.dmin)) * m;
      }
      mag[b] += (std::fabs(double(w[k]) + min_part) + min_part) * std::fabs(double(x[k]));
    }
  }
  return mag;
}

struct reference_result {
  double value = 0;
  double bound = 0;
};

// Σ w·x in double on the dequantized operands, and the rounding bound: per
// super-block three roundings of its terms (d_w·d_x, float(sum), the fma) and
// the accumulator's rounding, with unit roundoff u = 2^-24, doubled for slack.
reference_result reference_dot(tensor_type t, const std::vector<std::byte>& row,
                               const std::vector<model::block_q8_K>& xq, std::size_t n) {
  std::vector<float> w(n), x(n);
  model::dequantize_row(t, row.data(), w);
  model::dequantize_row_q8_K(xq.data(), x.data(), n);
  const std::vector<double> mag = block_magnitudes(t, row.data(), w, x);
  constexpr double u = 0x1.0p-24;
  reference_result r;
  for (std::size_t b = 0; b < mag.size(); ++b) {
    for (std::size_t i = 0; i < model::qk_k; ++i) r.value += double(w[b * 256 + i]) * x[b * 256 + i];
    r.bound += 2 * u * (3 * mag[b] + 2 * std::fabs(r.value));
  }
  r.bound += 1e-30;
  return r;
}

// Random bytes as a block, with finite fp16 scales: every bit pattern of the
// quants and sub-block scales is legal, so this reaches the integer extremes.
std::vector<std::byte> random_blocks(tensor_type t, std::size_t nb, std::mt19937& rng) {
  std::vector<std::byte> bytes(nb * model::block_bytes(t));
  for (auto& b : bytes) b = static_cast<std::byte>(rng() & 0xff);
  std::uniform_real_distribution<float> scale(-0.01f, 0.01f);
  for (std::size_t b = 0; b < nb; ++b) {
    std::byte* blk = bytes.data() + b * model::block_bytes(t);
    const std::uint16_t d = model::float_to_f16(scale(rng)), dmin = model::float_to_f16(scale(rng));
    if (t == tensor_type::q6_K) {
      std::memcpy(blk + 208, &d, 2);
    } else {
      std::memcpy(blk, &d, 2);
      std::memcpy(blk + 2, &dmin, 2);
    }
  }
  return bytes;
}

std::vector<model::block_q8_K> random_q8_K(std::size_t nb, std::mt19937& rng, bool extreme) {
  std::vector<model::block_q8_K> x(nb);
  std::uniform_int_distribution<int> q(-127, 127);
  for (auto& b : x) {
    b.d = 0.01f + static_cast<float>(rng() % 100) * 1e-4f;
    for (auto& v : b.qs) v = static_cast<std::int8_t>(extreme ? ((rng() & 1) ? 127 : -127) : q(rng));
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int i = 0; i < 16; ++i) s += b.qs[16 * g + i];
      b.bsums[g] = static_cast<std::int16_t>(s);
    }
  }
  return x;
}

std::vector<model::block_q8_K> quantize_acts(const std::vector<float>& a) {
  std::vector<model::block_q8_K> q(a.size() / model::qk_k);
  model::quantize_row_q8_K(a.data(), q.data(), a.size());
  return q;
}

float dot(tensor_type t, const std::vector<std::byte>& row, const std::vector<model::block_q8_K>& x,
          kq::path p) {
  return kq::dot_row(t, row.data(), x.data(), x.size(), p);
}

}  // namespace

TEST_CASE("K-quant dot products match the double reference within the rounding bound", "[engine][kquant]") {
  std::mt19937 rng(2024);
  for (tensor_type t : k_types) {
    for (kq::path p : {kq::path::scalar, kq::path::avx2}) {
      if (!kq::available(p)) continue;
      CAPTURE(model::to_string(t), p == kq::path::avx2);
      for (int trial = 0; trial < 40; ++trial) {
        const std::size_t n = model::qk_k * (1 + trial % 12);
        auto w = gaussian(n, rng, trial % 3 == 0 ? 1e-3f : 1.0f);
        if (trial % 4 == 1) for (float& v : w) v = std::fabs(v);  // one-sided: mins matter
        auto a = gaussian(n, rng, trial % 5 == 0 ? 50.0f : 1.0f);
        const auto row = quantize(t, w);
        const auto xq = quantize_acts(a);
        const reference_result ref = reference_dot(t, row, xq, n);
        const float got = dot(t, row, xq, p);
        CAPTURE(trial, n, ref.value, got, ref.bound);
        CHECK(std::fabs(double(got) - ref.value) <= ref.bound);
      }
      // The check can fail: a row of another type is far outside the bound.
      const auto w = gaussian(512, rng, 1.0f);
      const auto a = gaussian(512, rng, 1.0f);
      const auto xq = quantize_acts(a);
      const reference_result ref = reference_dot(t, quantize(t, w), xq, 512);
      const float other = dot(t == tensor_type::q6_K ? tensor_type::q4_K : tensor_type::q6_K,
                              quantize(t == tensor_type::q6_K ? tensor_type::q4_K : tensor_type::q6_K, gaussian(512, rng, 1.0f)),
                              xq, p);
      CHECK(std::fabs(double(other) - ref.value) > ref.bound);
    }
  }
}

TEST_CASE("every compiled K-quant path is bitwise equal to the scalar one", "[engine][kquant]") {
  if (!kq::available(kq::path::avx2)) {
    WARN("AVX2 path not compiled in: only the scalar K-quant path is tested");
    return;
  }
  std::mt19937 rng(77);
  for (tensor_type t : k_types) {
    CAPTURE(model::to_string(t));
    for (int trial = 0; trial < 300; ++trial) {
      const std::size_t nb = 1 + trial % 9;
      std::vector<std::byte> row;
      std::vector<model::block_q8_K> xq;
      if (trial % 3 == 0) {
        row = quantize(t, gaussian(nb * 256, rng, 1.0f));
        xq = quantize_acts(gaussian(nb * 256, rng, 3.0f));
      } else {
        row = random_blocks(t, nb, rng);
        xq = random_q8_K(nb, rng, trial % 3 == 2);
      }
      const float s = dot(t, row, xq, kq::path::scalar);
      const float v = dot(t, row, xq, kq::path::avx2);
      CAPTURE(trial, s, v);
      REQUIRE(std::memcmp(&s, &v, sizeof s) == 0);
    }
    // Many tokens against one row: the SIMD path unpacks each super-block
    // once per group of tokens; each result still equals the scalar one.
    const std::size_t nb = 3, tokens = 19;
    const auto row = quantize(t, gaussian(nb * 256, rng, 1.0f));
    const auto xq = quantize_acts(gaussian(tokens * nb * 256, rng, 2.0f));
    std::vector<float> scalar(tokens), simd(tokens);
    kq::dot_row_tokens(t, row.data(), xq.data(), nb, tokens, nb, kq::path::scalar, scalar.data(), 1);
    kq::dot_row_tokens(t, row.data(), xq.data(), nb, tokens, nb, kq::path::avx2, simd.data(), 1);
    CHECK(std::memcmp(scalar.data(), simd.data(), tokens * sizeof(float)) == 0);
  }
}

TEST_CASE("K-quant matmul is the per-row dot product whatever the batch or row split", "[engine][kquant]") {
  std::mt19937 rng(5);
  const std::size_t k = 512, rows = 50, tokens = 11;
  for (tensor_type t : k_types) {
    CAPTURE(model::to_string(t));
    std::vector<std::byte> data;
    for (std::size_t r = 0; r < rows; ++r) {
      const auto row = quantize(t, gaussian(k, rng, 0.05f));
      data.insert(data.end(), row.begin(), row.end());
    }
    model::weight_view w;
    w.type = t;
    w.rows = rows;
    w.cols = k;
    w.data = data.data();
    w.name = "w";
    const auto x = gaussian(tokens * k, rng, 1.0f);

    engine::activations acts;
    acts.convert(t, x.data(), k, tokens, k, nullptr);
    std::vector<float> all(tokens * rows);
    engine::matmul_rows(w, acts, all.data(), rows, 0, 17);
    engine::matmul_rows(w, acts, all.data(), rows, 17, rows);
    for (std::size_t tok = 0; tok < tokens; ++tok) {
      const auto xq = quantize_acts(std::vector<float>(x.begin() + tok * k, x.begin() + (tok + 1) * k));
      for (std::size_t r = 0; r < rows; ++r) {
        const float expect = kq::dot_row(t, w.row(r), xq.data(), k / 256, kq::best_path());
        REQUIRE(std::memcmp(&expect, &all[tok * rows + r], sizeof expect) == 0);
      }
    }
    // One token alone, through the pooled entry point.
    engine::thread_pool pool(3);
    std::vector<float> one(rows);
    engine::matmul(w, x.data() + 6 * k, k, 1, one.data(), rows, pool, acts);
    CHECK(std::memcmp(one.data(), all.data() + 6 * rows, rows * sizeof(float)) == 0);
  }
}

// ------------------------------------------------------------ Q4_1/Q5_0/Q5_1

namespace {

constexpr tensor_type legacy_types[] = {tensor_type::q4_1, tensor_type::q5_0, tensor_type::q5_1};

// Activations as the kernel takes them: Q8_0 blocks for Q5_0, Q8_1 for the
// others, as raw bytes; `xf` receives their dequantized values d·q and `sx`
// each block's s (Q8_1 only).
std::vector<std::byte> legacy_acts(tensor_type t, const std::vector<float>& a, std::vector<float>& xf,
                                   std::vector<float>& sx) {
  const std::size_t nb = a.size() / 32;
  xf.assign(a.size(), 0.0f);
  sx.assign(nb, 0.0f);
  if (!engine::legacy::needs_q8_1(t)) {
    std::vector<model::block_q8_0> q(nb);
    model::quantize_row_q8_0(a.data(), q.data(), a.size());
    model::dequantize_row_q8_0(q.data(), xf.data(), a.size());
    std::vector<std::byte> out(nb * sizeof(model::block_q8_0));
    std::memcpy(out.data(), q.data(), out.size());
    return out;
  }
  std::vector<model::block_q8_1> q(nb);
  model::quantize_row_q8_1(a.data(), q.data(), a.size());
  for (std::size_t b = 0; b < nb; ++b) {
    sx[b] = model::f16_to_float(q[b].s);
    for (int j = 0; j < 32; ++j) xf[32 * b + j] = model::f16_to_float(q[b].d) * q[b].qs[j];
  }
  std::vector<std::byte> out(nb * sizeof(model::block_q8_1));
  std::memcpy(out.data(), q.data(), out.size());
  return out;
}

// The block's min m (Q4_1/Q5_1; 0 for Q5_0), read from its header.
float legacy_min(tensor_type t, const std::byte* block) {
  if (t == tensor_type::q5_0) return 0.0f;
  std::uint16_t m;
  std::memcpy(&m, block + 2, 2);
  return model::f16_to_float(m);
}

}  // namespace

TEST_CASE("Q4_1/Q5_0/Q5_1 dot products: reference bound, paths bitwise equal, matmul", "[engine][kquant]") {
  namespace lg = engine::legacy;
  std::mt19937 rng(31);
  constexpr double u = 0x1.0p-24;
  for (tensor_type t : legacy_types) {
    CAPTURE(model::to_string(t));
    for (int trial = 0; trial < 40; ++trial) {
      const std::size_t nb = 1 + trial % 17, n = nb * 32;
      auto w = gaussian(n, rng, trial % 3 == 0 ? 1e-2f : 1.0f);
      if (trial % 4 == 1) for (float& v : w) v = std::fabs(v) + 0.5f;  // one-sided: the min matters
      const auto row = quantize(t, w);
      std::vector<float> wf(n), xf, sx;
      model::dequantize_row(t, row.data(), wf);
      const auto x = legacy_acts(t, gaussian(n, rng, 2.0f), xf, sx);
      // ggml's formula in double: Σ (w − m)·x + m·s per block (s, not d·Σq,
      // carries the min term), and the rounding bound of the kernel's float
      // steps per block.
      double ref = 0, bound = 1e-30;
      for (std::size_t b = 0; b < nb; ++b) {
        const float m = legacy_min(t, row.data() + b * model::block_bytes(t));
        double part = 0, mag = 0;
        for (int j = 0; j < 32; ++j) {
          part += (double(wf[32 * b + j]) - m) * xf[32 * b + j];
          mag += std::fabs((double(wf[32 * b + j]) - m) * xf[32 * b + j]);
        }
        ref += part + double(m) * sx[b];
        bound += 2 * u * (3 * mag + std::fabs(double(m) * sx[b]) + 2 * std::fabs(ref));
      }
      for (kq::path p : {kq::path::scalar, kq::path::avx2}) {
        if (!kq::available(p)) continue;
        float got = 0;
        lg::dot_row_tokens(t, row.data(), x.data(), nb, 1, nb, p, &got, 1);
        CAPTURE(trial, ref, got, bound);
        CHECK(std::fabs(double(got) - ref) <= bound);
      }
    }
    if (kq::available(kq::path::avx2)) {
      for (int trial = 0; trial < 200; ++trial) {
        // Random bytes reach every level and fifth bit; scales kept finite.
        const std::size_t nb = 1 + trial % 7, tokens = 1 + trial % 11;
        std::vector<std::byte> row(nb * model::block_bytes(t));
        for (auto& b : row) b = static_cast<std::byte>(rng() & 0xff);
        for (std::size_t b = 0; b < nb; ++b) {
          const std::uint16_t d = model::float_to_f16(0.01f * float(rng() % 100) - 0.5f);
          std::memcpy(row.data() + b * model::block_bytes(t), &d, 2);
          if (t != tensor_type::q5_0) std::memcpy(row.data() + b * model::block_bytes(t) + 2, &d, 2);
        }
        std::vector<float> xf, sx;
        const auto x = legacy_acts(t, gaussian(tokens * nb * 32, rng, 3.0f), xf, sx);
        std::vector<float> s(tokens), v(tokens);
        lg::dot_row_tokens(t, row.data(), x.data(), nb, tokens, nb, kq::path::scalar, s.data(), 1);
        lg::dot_row_tokens(t, row.data(), x.data(), nb, tokens, nb, kq::path::avx2, v.data(), 1);
        CAPTURE(trial);
        REQUIRE(std::memcmp(s.data(), v.data(), tokens * sizeof(float)) == 0);
      }
    }
    // Through matmul: each (row, token) equals the per-row kernel, whatever
    // the row split.
    const std::size_t k = 96, rows = 40, tokens = 10;
    std::vector<std::byte> data;
    for (std::size_t r = 0; r < rows; ++r) {
      const auto row = quantize(t, gaussian(k, rng, 0.1f));
      data.insert(data.end(), row.begin(), row.end());
    }
    model::weight_view wv;
    wv.type = t;
    wv.rows = rows;
    wv.cols = k;
    wv.data = data.data();
    const auto xs = gaussian(tokens * k, rng, 1.0f);
    engine::activations acts;
    acts.convert(t, xs.data(), k, tokens, k, nullptr);
    std::vector<float> all(tokens * rows);
    engine::matmul_rows(wv, acts, all.data(), rows, 0, 13);
    engine::matmul_rows(wv, acts, all.data(), rows, 13, rows);
    for (std::size_t tok = 0; tok < tokens; ++tok) {
      std::vector<float> xf, sx;
      const auto x = legacy_acts(t, std::vector<float>(xs.begin() + tok * k, xs.begin() + (tok + 1) * k), xf, sx);
      for (std::size_t r = 0; r < rows; ++r) {
        float expect = 0;
        lg::dot_row_tokens(t, wv.row(r), x.data(), k / 32, 1, k / 32, kq::best_path(), &expect, 1);
        REQUIRE(std::memcmp(&expect, &all[tok * rows + r], sizeof expect) == 0);
      }
    }
  }
}
