#include "model/llama_weights.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "model/gguf.hpp"

namespace exa::model {

namespace {

enum class weight_kind { matrix, norm };

bool runnable_for(weight_kind kind, tensor_type t) noexcept {
  switch (t) {
    case tensor_type::f32:
    case tensor_type::f16:
    case tensor_type::bf16: return true;
    // Norm weights are applied elementwise; the engine has no quantized path for them.
    case tensor_type::q8_0:
    case tensor_type::q4_0: return kind == weight_kind::matrix;
  }
  return false;
}

std::string type_name(const gguf_tensor& t) {
  const ggml_type_traits* info = ggml_type_info(t.type_id);
  return info != nullptr ? std::string(info->name) : fmt::format("id {}", t.type_id);
}

class binder {
 public:
  explicit binder(const gguf_file& f) : file_(f) {}

  expected<weight_view> bind(const std::string& name, std::vector<std::uint64_t> expected_shape,
                             weight_kind kind) const {
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
                                    name, type_name(*t),
                                    kind == weight_kind::norm ? "f32, f16, bf16"
                                                              : "f32, f16, bf16, q8_0, q4_0"));
    }
    weight_view v;
    v.type = *t->type;
    v.cols = t->shape[0];
    v.rows = t->shape.size() > 1 ? t->shape[1] : 1;
    v.data = t->data;
    v.name = name;
    return v;
  }

 private:
  const gguf_file& file_;
};

expected<llama_layer_weights> bind_layer(const binder& b, const llama_config& c, std::uint32_t i) {
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
      {"attn_norm", {dim}, weight_kind::norm, &llama_layer_weights::attn_norm},
      {"attn_q", {dim, dim}, weight_kind::matrix, &llama_layer_weights::wq},
      {"attn_k", {dim, kv_dim}, weight_kind::matrix, &llama_layer_weights::wk},
      {"attn_v", {dim, kv_dim}, weight_kind::matrix, &llama_layer_weights::wv},
      {"attn_output", {dim, dim}, weight_kind::matrix, &llama_layer_weights::wo},
      {"ffn_norm", {dim}, weight_kind::norm, &llama_layer_weights::ffn_norm},
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
  return layer;
}

}  // namespace

std::uint64_t weight_view::row_bytes() const noexcept {
  return model::row_bytes(type, static_cast<std::size_t>(cols));
}

std::uint64_t llama_weights::total_bytes() const noexcept {
  std::uint64_t total = token_embd.bytes() + output_norm.bytes();
  if (!tied_output) total += output.bytes();
  for (const llama_layer_weights& l : layers) {
    total += l.attn_norm.bytes() + l.wq.bytes() + l.wk.bytes() + l.wv.bytes() + l.wo.bytes() +
             l.ffn_norm.bytes() + l.w_gate.bytes() + l.w_up.bytes() + l.w_down.bytes();
  }
  return total;
}

expected<llama_weights> bind_llama_weights(const gguf_file& file, const llama_config& config) {
  const binder b(file);
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
  auto norm = b.bind("output_norm.weight", {dim}, weight_kind::norm);
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
  return w;
}

}  // namespace exa::model
