#include "reference_llama.hpp"

#include <cmath>
#include <cstring>

#include "model/half.hpp"
#include "model/quantize.hpp"

namespace exa::test {
namespace {

// The formats written out by hand here; others (the K-quants) come from the
// model's row dequantizer, itself checked against ggml's block layouts.
bool hand_decoded(model::tensor_type t) noexcept {
  using model::tensor_type;
  return t == tensor_type::f32 || t == tensor_type::f16 || t == tensor_type::bf16 ||
         t == tensor_type::q8_0 || t == tensor_type::q4_0;
}

double element(const model::weight_view& w, std::uint64_t r, std::uint64_t i) {
  const std::byte* row = w.row(r);
  switch (w.type) {
    case model::tensor_type::f32: {
      float v;
      std::memcpy(&v, row + i * 4, 4);
      return v;
    }
    case model::tensor_type::f16:
    case model::tensor_type::bf16: {
      std::uint16_t h;
      std::memcpy(&h, row + i * 2, 2);
      return w.type == model::tensor_type::f16 ? model::f16_to_float(h) : model::bf16_to_float(h);
    }
    case model::tensor_type::q8_0: {
      const std::byte* blk = row + (i / 32) * 34;
      std::uint16_t d;
      std::memcpy(&d, blk, 2);
      const auto q = static_cast<std::int8_t>(blk[2 + i % 32]);
      return static_cast<double>(model::f16_to_float(d)) * q;
    }
    case model::tensor_type::q4_0: {
      const std::byte* blk = row + (i / 32) * 18;
      std::uint16_t d;
      std::memcpy(&d, blk, 2);
      const std::size_t j = i % 32;
      const auto byte = static_cast<std::uint8_t>(blk[2 + j % 16]);
      const int nib = j < 16 ? (byte & 0x0f) : (byte >> 4);
      return static_cast<double>(model::f16_to_float(d)) * (nib - 8);
    }
    default: break;
  }
  return 0;
}

}  // namespace

reference_llama::matrix reference_llama::dequantize(const model::weight_view& w) {
  matrix m(w.rows, std::vector<double>(w.cols));
  std::vector<float> row(w.cols);
  for (std::uint64_t r = 0; r < w.rows; ++r) {
    if (!hand_decoded(w.type)) model::dequantize_row(w.type, w.row(r), row);
    for (std::uint64_t i = 0; i < w.cols; ++i) m[r][i] = hand_decoded(w.type) ? element(w, r, i) : row[i];
  }
  return m;
}

std::vector<double> reference_llama::dequantize(const std::optional<model::weight_view>& w) {
  return w ? dequantize(*w)[0] : std::vector<double>{};
}

void reference_llama::add(std::vector<double>& x, const std::vector<double>& b) {
  for (std::size_t i = 0; i < b.size(); ++i) x[i] += b[i];
}

reference_llama::reference_llama(const model::llama_model& m) : c_(m.config()) {
  const auto& w = m.weights();
  embd_ = dequantize(w.token_embd);
  output_ = dequantize(w.output);
  output_norm_ = dequantize(w.output_norm)[0];
  rope_factors_ = dequantize(w.rope_freqs);
  for (const auto& l : w.layers)
    layers_.push_back({dequantize(l.attn_norm)[0], dequantize(l.ffn_norm)[0], dequantize(l.wq),
                       dequantize(l.wk), dequantize(l.wv), dequantize(l.wo), dequantize(l.w_gate),
                       dequantize(l.w_up), dequantize(l.w_down), dequantize(l.bq), dequantize(l.bk),
                       dequantize(l.bv), dequantize(l.bo)});
}

std::vector<double> reference_llama::matvec(const matrix& w, const std::vector<double>& x) {
  std::vector<double> y(w.size(), 0.0);
  for (std::size_t r = 0; r < w.size(); ++r)
    for (std::size_t i = 0; i < x.size(); ++i) y[r] += w[r][i] * x[i];
  return y;
}

std::vector<double> reference_llama::rms_norm(const std::vector<double>& x,
                                              const std::vector<double>& w) const {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double scale = 1.0 / std::sqrt(ss / x.size() + c_.rms_eps);
  std::vector<double> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = x[i] * scale * w[i];
  return out;
}

// Pair i of each head rotates by freq_scale · pos · base^(-2i / rope_dim) /
// factor_i. llama pairs elements (2i, 2i+1), qwen2 pairs (i, i + rope_dim/2).
void reference_llama::rope(std::vector<double>& v, std::uint32_t n_heads, std::uint32_t pos) const {
  const std::uint32_t hd = c_.head_dim(), pairs = c_.rope_dim / 2;
  const bool halves = c_.rope_pairs == model::rope_pairing::halves;
  for (std::uint32_t h = 0; h < n_heads; ++h)
    for (std::uint32_t i = 0; i < pairs; ++i) {
      const double factor = rope_factors_.empty() ? 1.0 : rope_factors_[i];
      const double theta = c_.rope_freq_scale * pos *
                           std::pow(static_cast<double>(c_.rope_freq_base), -2.0 * i / c_.rope_dim) / factor;
      double& a = v[h * hd + (halves ? i : 2 * i)];
      double& b = v[h * hd + (halves ? i + pairs : 2 * i + 1)];
      const double x0 = a, x1 = b;
      a = x0 * std::cos(theta) - x1 * std::sin(theta);
      b = x0 * std::sin(theta) + x1 * std::cos(theta);
    }
}

std::vector<std::vector<double>> reference_llama::logits_all(const std::vector<std::int32_t>& tokens) const {
  const std::size_t n = tokens.size(), hd = c_.head_dim();
  const std::size_t group = c_.n_heads / c_.n_kv_heads;
  std::vector<std::vector<double>> x(n);
  for (std::size_t t = 0; t < n; ++t) x[t] = embd_[static_cast<std::size_t>(tokens[t])];

  for (const layer& l : layers_) {
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (std::size_t t = 0; t < n; ++t) {
      const auto xn = rms_norm(x[t], l.attn_norm);
      q[t] = matvec(l.wq, xn);
      k[t] = matvec(l.wk, xn);
      v[t] = matvec(l.wv, xn);
      add(q[t], l.bq);
      add(k[t], l.bk);
      add(v[t], l.bv);
      rope(q[t], c_.n_heads, static_cast<std::uint32_t>(t));
      rope(k[t], c_.n_kv_heads, static_cast<std::uint32_t>(t));
    }
    for (std::size_t t = 0; t < n; ++t) {
      std::vector<double> att(c_.dim, 0.0);
      for (std::size_t h = 0; h < c_.n_heads; ++h) {
        const std::size_t kvh = h / group;
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (std::size_t j = 0; j <= t; ++j) {
          double d = 0;
          for (std::size_t i = 0; i < hd; ++i) d += q[t][h * hd + i] * k[j][kvh * hd + i];
          s[j] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (std::size_t j = 0; j <= t; ++j)
          for (std::size_t i = 0; i < hd; ++i) att[h * hd + i] += s[j] / sum * v[j][kvh * hd + i];
      }
      auto o = matvec(l.wo, att);
      add(o, l.bo);
      for (std::size_t i = 0; i < c_.dim; ++i) x[t][i] += o[i];
      const auto xn = rms_norm(x[t], l.ffn_norm);
      auto g = matvec(l.w_gate, xn);
      const auto u = matvec(l.w_up, xn);
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      const auto d = matvec(l.w_down, g);
      for (std::size_t i = 0; i < c_.dim; ++i) x[t][i] += d[i];
    }
  }
  std::vector<std::vector<double>> out(n);
  for (std::size_t t = 0; t < n; ++t) out[t] = matvec(output_, rms_norm(x[t], output_norm_));
  return out;
}

double nmse(const float* a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den > 0 ? num / den : num;
}

}  // namespace exa::test
