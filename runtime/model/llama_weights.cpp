#include "model/llama_weights.hpp"

#include <cmath>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "model/gguf.hpp"
#include "model/quantize.hpp"

namespace exa::model {

namespace {

// Vectors are applied elementwise in float: the engine has no quantized path
// for them. Matrices run in any type the engine has a kernel for.
enum class weight_kind { matrix, vector };

// ggml ids span 0..39 today; scanning a few more keeps this list in step with
// tensor_type_from_id as types are added.
constexpr std::uint32_t max_scanned_type_id = 64;

bool is_float_type(tensor_type t) noexcept {
  return t == tensor_type::f32 || t == tensor_type::f16 || t == tensor_type::bf16;
}

bool runnable_for(weight_kind kind, tensor_type t) noexcept {
  return kind == weight_kind::matrix || is_float_type(t);
}

std::string supported_types(weight_kind kind) {
  std::vector<std::string_view> names;
  for (std::uint32_t id = 0; id < max_scanned_type_id; ++id) {
    const auto t = tensor_type_from_id(id);
    if (t && runnable_for(kind, *t)) names.push_back(to_string(*t));
  }
  return fmt::format("{}", fmt::join(names, ", "));
}

std::string type_name(const gguf_tensor& t) {
  const ggml_type_traits* info = ggml_type_info(t.type_id);
  return info != nullptr ? std::string(info->name) : fmt::format("id {}", t.type_id);
}

enum class presence { required, optional };

class binder {
 public:
  explicit binder(const gguf_file& f) : file_(f) {}

  expected<weight_view> bind(const std::string& name, std::vector<std::uint64_t> expected_shape,
                             weight_kind kind) {
    const gguf_tensor* t = file_.find_tensor(name);
    if (t == nullptr) return make_error(errc::not_found, fmt::format("missing tensor '{}'", name));
    if (t->shape != expected_shape) {
      return make_error(errc::invalid_argument,
                        fmt::format("tensor '{}' has shape [{}], expected [{}]", name,
                                    fmt::join(t->shape, ", "), fmt::join(expected_shape, ", ")));
    }
    if (!t->type || !runnable_for(kind, *t->type)) {
      return make_error(errc::unsupported,
                        fmt::format("tensor '{}' has type {}, which the engine does not run "
                                    "(supported: {})",
                                    name, type_name(*t), supported_types(kind)));
    }
    bound_.insert(name);
    weight_view v;
    v.type = *t->type;
    v.cols = t->shape[0];
    v.rows = t->shape.size() > 1 ? t->shape[1] : 1;
    v.data = t->data;
    v.name = name;
    return v;
  }

  // An optional tensor: absent gives nullopt, present must be right.
  expected<std::optional<weight_view>> bind_optional(const std::string& name,
                                                     std::vector<std::uint64_t> expected_shape,
                                                     weight_kind kind) {
    if (file_.find_tensor(name) == nullptr) return std::optional<weight_view>{};
    auto v = bind(name, std::move(expected_shape), kind);
    if (!v) return std::unexpected(v.error());
    return std::optional<weight_view>(std::move(*v));
  }

  // llama.cpp refuses a file with tensors its graph does not use; so do we,
  // rather than compute logits that ignore part of the model.
  expected<void> check_all_used(architecture arch) const {
    for (const gguf_tensor& t : file_.tensors()) {
      if (bound_.contains(t.name)) continue;
      return make_error(errc::unsupported,
                        fmt::format("tensor '{}' is not part of the {} architecture the engine runs",
                                    t.name, to_string(arch)));
    }
    return {};
  }

 private:
  const gguf_file& file_;
  std::set<std::string, std::less<>> bound_;
};

// Each factor divides a RoPE angle: zero, negative or non-finite factors
// would turn positions into NaN or flip rotations.
expected<void> check_rope_freqs(const weight_view& v) {
  std::vector<float> f(static_cast<std::size_t>(v.cols));
  dequantize_row(v.type, v.data, f);
  for (std::size_t i = 0; i < f.size(); ++i) {
    if (!std::isfinite(f[i]) || !(f[i] > 0.0f)) {
      return make_error(errc::invalid_argument,
                        fmt::format("tensor '{}' element {} = {} must be positive and finite", v.name, i, f[i]));
    }
  }
  return {};
}

expected<void> bind_biases(binder& b, const llama_config& c, std::uint32_t i, llama_layer_weights& layer) {
  const std::uint64_t dim = c.dim, kv_dim = c.kv_dim();
  const bool qwen2 = c.arch == architecture::qwen2;
  struct slot {
    const char* suffix;
    std::uint64_t len;
    presence need;
    std::optional<weight_view> llama_layer_weights::*member;
  };
  // qwen2 has Q/K/V biases and no output bias; llama may have any of them.
  const slot slots[] = {
      {"attn_q", dim, qwen2 ? presence::required : presence::optional, &llama_layer_weights::bq},
      {"attn_k", kv_dim, qwen2 ? presence::required : presence::optional, &llama_layer_weights::bk},
      {"attn_v", kv_dim, qwen2 ? presence::required : presence::optional, &llama_layer_weights::bv},
  };
  for (const slot& s : slots) {
    const std::string name = fmt::format("blk.{}.{}.bias", i, s.suffix);
    if (s.need == presence::required) {
      auto v = b.bind(name, {s.len}, weight_kind::vector);
      if (!v) return std::unexpected(v.error());
      layer.*s.member = std::move(*v);
    } else {
      auto v = b.bind_optional(name, {s.len}, weight_kind::vector);
      if (!v) return std::unexpected(v.error());
      layer.*s.member = std::move(*v);
    }
  }
  if (!qwen2) {
    auto bo = b.bind_optional(fmt::format("blk.{}.attn_output.bias", i), {dim}, weight_kind::vector);
    if (!bo) return std::unexpected(bo.error());
    layer.bo = std::move(*bo);
  }
  return {};
}

expected<llama_layer_weights> bind_layer(binder& b, const llama_config& c, std::uint32_t i) {
  const std::uint64_t dim = c.dim;
  const std::uint64_t kv_dim = c.kv_dim();
  const std::uint64_t ff = c.ff_dim;
  struct slot {
    const char* suffix;
    std::vector<std::uint64_t> shape;
    weight_kind kind;
    weight_view llama_layer_weights::*member;
  };
  const slot slots[] = {
      {"attn_norm", {dim}, weight_kind::vector, &llama_layer_weights::attn_norm},
      {"attn_q", {dim, dim}, weight_kind::matrix, &llama_layer_weights::wq},
      {"attn_k", {dim, kv_dim}, weight_kind::matrix, &llama_layer_weights::wk},
      {"attn_v", {dim, kv_dim}, weight_kind::matrix, &llama_layer_weights::wv},
      {"attn_output", {dim, dim}, weight_kind::matrix, &llama_layer_weights::wo},
      {"ffn_norm", {dim}, weight_kind::vector, &llama_layer_weights::ffn_norm},
      {"ffn_gate", {dim, ff}, weight_kind::matrix, &llama_layer_weights::w_gate},
      {"ffn_up", {dim, ff}, weight_kind::matrix, &llama_layer_weights::w_up},
      {"ffn_down", {ff, dim}, weight_kind::matrix, &llama_layer_weights::w_down},
  };
  llama_layer_weights layer;
  for (const slot& s : slots) {
    auto v = b.bind(fmt::format("blk.{}.{}.weight", i, s.suffix), s.shape, s.kind);
    if (!v) return std::unexpected(v.error());
    layer.*s.member = std::move(*v);
  }
  if (auto r = bind_biases(b, c, i, layer); !r) return std::unexpected(r.error());
  return layer;
}

}  // namespace

std::uint64_t weight_view::row_bytes() const noexcept {
  return model::row_bytes(type, static_cast<std::size_t>(cols));
}

std::vector<const weight_view*> llama_weights::all() const {
  std::vector<const weight_view*> out = {&token_embd, &output_norm};
  if (!tied_output) out.push_back(&output);
  if (rope_freqs) out.push_back(&*rope_freqs);
  for (const llama_layer_weights& l : layers) {
    for (const weight_view* v : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_norm, &l.w_gate,
                                 &l.w_up, &l.w_down}) {
      out.push_back(v);
    }
    for (const std::optional<weight_view>* b : {&l.bq, &l.bk, &l.bv, &l.bo}) {
      if (*b) out.push_back(&**b);
    }
  }
  return out;
}

std::uint64_t llama_weights::total_bytes() const noexcept {
  std::uint64_t total = 0;
  for (const weight_view* v : all()) total += v->bytes();
  return total;
}

expected<llama_weights> bind_llama_weights(const gguf_file& file, const llama_config& config) {
  binder b(file);
  const std::uint64_t dim = config.dim;
  const std::uint64_t vocab = config.vocab_size;
  llama_weights w;
  auto embd = b.bind("token_embd.weight", {dim, vocab}, weight_kind::matrix);
  if (!embd) return std::unexpected(embd.error());
  w.token_embd = std::move(*embd);
  w.layers.reserve(config.n_layers);
  for (std::uint32_t i = 0; i < config.n_layers; ++i) {
    auto layer = bind_layer(b, config, i);
    if (!layer) return std::unexpected(layer.error());
    w.layers.push_back(std::move(*layer));
  }
  auto norm = b.bind("output_norm.weight", {dim}, weight_kind::vector);
  if (!norm) return std::unexpected(norm.error());
  w.output_norm = std::move(*norm);
  if (file.find_tensor("output.weight") == nullptr) {
    // Tied embeddings: the output projection reuses the embedding matrix.
    w.output = w.token_embd;
    w.tied_output = true;
  } else {
    auto out = b.bind("output.weight", {dim, vocab}, weight_kind::matrix);
    if (!out) return std::unexpected(out.error());
    w.output = std::move(*out);
  }
  // llama.cpp's qwen2 graph takes no frequency factors, so only llama binds them.
  if (config.arch == architecture::llama) {
    auto freqs = b.bind_optional("rope_freqs.weight", {config.rope_dim / 2}, weight_kind::vector);
    if (!freqs) return std::unexpected(freqs.error());
    w.rope_freqs = std::move(*freqs);
    if (w.rope_freqs) {
      if (auto r = check_rope_freqs(*w.rope_freqs); !r) return std::unexpected(r.error());
    }
  }
  if (auto r = b.check_all_used(config.arch); !r) return std::unexpected(r.error());
  return w;
}

}  // namespace exa::model
