#include "cluster/model_shape.hpp"

#include <fmt/format.h>

#include <array>
#include <filesystem>
#include <map>

#include "common/assert.hpp"
#include "model/llama_config.hpp"
#include "model/llama_model.hpp"
#include "model/llama_weights.hpp"
#include "model/model_gen.hpp"

namespace exa::cluster {
namespace {

bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

// Generous bounds: every real Llama is far inside them, and they keep the
// products below (bytes of a matrix, KV per token) far from overflowing.
constexpr std::uint32_t max_layers = 1024;
constexpr std::uint32_t max_dim = 1u << 17;
constexpr std::uint32_t max_heads = 1024;
constexpr std::uint32_t max_ff_dim = 1u << 20;
constexpr std::uint32_t max_vocab = 1u << 23;
constexpr std::uint32_t max_context = 1u << 24;

struct preset_row {
  std::string_view name;
  std::uint32_t n_layers, dim, n_heads, n_kv_heads, ff_dim, vocab_size, context_length;
};

// Published shapes (the models' config.json files on Hugging Face).
constexpr std::array<preset_row, 5> published_presets = {{
    {"llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 4096},
    {"llama-2-13b", 40, 5120, 40, 40, 13824, 32000, 4096},
    {"llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 4096},
    {"llama-3-8b", 32, 4096, 32, 8, 14336, 128256, 8192},
    {"llama-3-70b", 80, 8192, 64, 8, 28672, 128256, 8192},
}};

// Our generated models, shaped by model_gen's presets so the two never drift.
constexpr std::array<std::string_view, 2> generated_presets = {"tiny", "small"};

std::string preset_list() {
  std::string out;
  for (const std::string& n : model_shape_preset_names()) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The precision holding most matrix parameters: a file that keeps, say, its
// embedding in f16 and everything else in q4_0 is a q4_0 model.
precision dominant_precision(const model::llama_weights& w) {
  std::map<model::tensor_type, std::uint64_t> elems;
  auto add = [&](const model::weight_view& v) { elems[v.type] += v.rows * v.cols; };
  add(w.token_embd);
  if (!w.tied_output) add(w.output);
  for (const model::llama_layer_weights& l : w.layers) {
    for (const model::weight_view* v : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) add(*v);
  }
  auto best = elems.begin();
  for (auto it = elems.begin(); it != elems.end(); ++it) {
    if (it->second > best->second) best = it;
  }
  EXA_ASSERT(best != elems.end());
  return from_tensor_type(best->first);
}

}  // namespace

std::string_view to_string(precision p) noexcept {
  switch (p) {
    case precision::fp32: return "fp32";
    case precision::fp16: return "fp16";
    case precision::bf16: return "bf16";
    case precision::int8: return "int8";
    case precision::int4: return "int4";
  }
  return "unknown";
}

std::optional<precision> precision_from_string(std::string_view s) noexcept {
  for (precision p : {precision::fp32, precision::fp16, precision::bf16, precision::int8, precision::int4}) {
    if (iequals(s, to_string(p)) || iequals(s, model::to_string(to_tensor_type(p)))) return p;
  }
  return std::nullopt;
}

model::tensor_type to_tensor_type(precision p) noexcept {
  switch (p) {
    case precision::fp32: return model::tensor_type::f32;
    case precision::fp16: return model::tensor_type::f16;
    case precision::bf16: return model::tensor_type::bf16;
    case precision::int8: return model::tensor_type::q8_0;
    case precision::int4: return model::tensor_type::q4_0;
  }
  return model::tensor_type::f32;
}

precision from_tensor_type(model::tensor_type t) noexcept {
  switch (t) {
    case model::tensor_type::f32: return precision::fp32;
    case model::tensor_type::f16: return precision::fp16;
    case model::tensor_type::bf16: return precision::bf16;
    case model::tensor_type::q8_0: return precision::int8;
    case model::tensor_type::q4_0:
    case model::tensor_type::q4_1:
    case model::tensor_type::q5_0:
    case model::tensor_type::q5_1:
    case model::tensor_type::q4_K:
    case model::tensor_type::q5_K: return precision::int4;
    case model::tensor_type::q6_K: return precision::int8;
  }
  return precision::fp32;
}

std::uint64_t weight_bytes_for(precision p, std::uint64_t n) noexcept {
  const model::tensor_type t = to_tensor_type(p);
  const std::uint64_t block = model::block_elems(t);
  return (n + block - 1) / block * model::block_bytes(t);
}

std::uint64_t model_shape::norm_parameter_count() const noexcept {
  // attn_norm and ffn_norm per layer, then output_norm.
  return (std::uint64_t{2} * n_layers + 1) * dim;
}

std::uint64_t model_shape::parameter_count() const noexcept {
  const std::uint64_t d = dim;
  const std::uint64_t embedding = std::uint64_t{vocab_size} * d;
  const std::uint64_t attention = 2 * d * d + 2 * d * kv_dim();  // Q, O; K, V
  const std::uint64_t ffn = 3 * d * ff_dim;                      // gate, up, down
  const std::uint64_t head = tied_embeddings ? 0 : embedding;
  return embedding + n_layers * (attention + ffn) + head + norm_parameter_count();
}

std::uint64_t model_shape::computed_weight_bytes() const noexcept {
  // Quantization blocks run along a matrix's rows, so each row rounds up on
  // its own: rows × bytes(row of `cols` weights).
  const precision p = weight_precision;
  const std::uint64_t d = dim;
  auto matrix = [p](std::uint64_t cols, std::uint64_t rows) { return rows * weight_bytes_for(p, cols); };
  const std::uint64_t embedding = matrix(d, vocab_size);
  const std::uint64_t per_layer =
      2 * matrix(d, d) + 2 * matrix(d, kv_dim()) + 2 * matrix(d, ff_dim) + matrix(ff_dim, d);
  const std::uint64_t head = tied_embeddings ? 0 : embedding;
  return embedding + n_layers * per_layer + head + norm_parameter_count() * 4;
}

std::uint64_t model_shape::kv_bytes_per_token() const noexcept {
  return std::uint64_t{2} * n_layers * n_kv_heads * head_dim() * kv_elem_bytes;
}

expected<void> validate(const model_shape& s) {
  struct field { const char* name; std::uint32_t value; std::uint32_t max; };
  const field fields[] = {{"n_layers", s.n_layers, max_layers},     {"dim", s.dim, max_dim},
                          {"n_heads", s.n_heads, max_heads},        {"n_kv_heads", s.n_kv_heads, max_heads},
                          {"ff_dim", s.ff_dim, max_ff_dim},         {"vocab_size", s.vocab_size, max_vocab},
                          {"context_length", s.context_length, max_context}};
  for (const field& f : fields) {
    if (f.value == 0 || f.value > f.max) {
      return make_error(errc::invalid_argument,
                        fmt::format("model '{}': {} = {} must be in 1..{}", s.name, f.name, f.value, f.max));
    }
  }
  if (s.dim % s.n_heads != 0) {
    return make_error(errc::invalid_argument,
                      fmt::format("model '{}': dim {} is not divisible by n_heads {}", s.name, s.dim, s.n_heads));
  }
  if (s.n_heads % s.n_kv_heads != 0) {
    return make_error(errc::invalid_argument, fmt::format("model '{}': n_heads {} is not divisible by n_kv_heads {}",
                                                          s.name, s.n_heads, s.n_kv_heads));
  }
  if (s.kv_elem_bytes != 1 && s.kv_elem_bytes != 2 && s.kv_elem_bytes != 4) {
    return make_error(errc::invalid_argument,
                      fmt::format("model '{}': kv_elem_bytes = {} must be 1, 2 or 4", s.name, s.kv_elem_bytes));
  }
  return {};
}

model_shape with_precision(model_shape shape, precision p) {
  shape.weight_precision = p;
  shape.weight_bytes = shape.computed_weight_bytes();
  return shape;
}

const std::vector<std::string>& model_shape_preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const preset_row& r : published_presets) out.emplace_back(r.name);
    for (std::string_view n : generated_presets) out.emplace_back(n);
    return out;
  }();
  return names;
}

expected<model_shape> model_shape_preset(std::string_view name, precision p) {
  model_shape s;
  for (const preset_row& r : published_presets) {
    if (!iequals(name, r.name)) continue;
    s = model_shape{std::string(r.name), r.n_layers, r.dim, r.n_heads, r.n_kv_heads, r.ff_dim,
                    r.vocab_size, r.context_length};
    return with_precision(std::move(s), p);
  }
  for (std::string_view g : generated_presets) {
    if (!iequals(name, g)) continue;
    const auto spec = model::preset_spec(g);
    EXA_ASSERT(spec.has_value());
    s = model_shape{std::string(g), spec->n_layers, spec->dim, spec->n_heads, spec->n_kv_heads,
                    spec->ff_dim, spec->vocab_size, spec->context_length};
    s.tied_embeddings = spec->tie_embeddings;
    return with_precision(std::move(s), p);
  }
  return make_error(errc::not_found,
                    fmt::format("unknown model preset '{}' (valid: {})", name, preset_list()));
}

model_shape model_shape_from(const model::llama_config& c, const model::llama_weights& w) {
  model_shape s{c.name, c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.ff_dim, c.vocab_size, c.context_length};
  s.tied_embeddings = w.tied_output;
  s.weight_precision = dominant_precision(w);
  s.weight_bytes = w.total_bytes();
  return s;
}

model_shape model_shape_from(const model::llama_model& m) {
  model_shape s = model_shape_from(m.config(), m.weights());
  if (s.name.empty()) s.name = std::filesystem::path(m.path()).stem().string();
  return s;
}

}  // namespace exa::cluster
