#include "model/model_gen.hpp"

#include <cmath>
#include <numbers>
#include <vector>

#include <fmt/format.h>

#include "common/assert.hpp"
#include "common/splitmix64.hpp"
#include "model/gguf_writer.hpp"
#include "model/quantize.hpp"
#include "model/tokenizer.hpp"

namespace exa::model {

namespace {

// Bounds on a spec: generous for benchmarks, small enough that every product
// of them fits the reader's and the engine's limits.
constexpr std::uint32_t max_name_bytes = 256;
constexpr std::uint32_t max_layers = 256;
constexpr std::uint32_t max_dim = 16384;
constexpr std::uint32_t max_heads = 256;
constexpr std::uint32_t max_ff = 65536;
constexpr std::uint32_t min_vocab = 260;  // the byte-level tokenizer's layout
constexpr std::uint32_t max_vocab = 1u << 20;
constexpr std::uint32_t min_context = 16;
constexpr std::uint32_t max_context = 1u << 20;
constexpr std::uint64_t max_params = std::uint64_t{1} << 34;
// Tensors start on a cache line: the kernels read f32 rows 64 bytes at a time,
// and from a 32-byte boundary every such load straddles two lines.
constexpr std::uint32_t alignment = 64;

std::unexpected<error> invalid(std::string message) {
  return make_error(errc::invalid_argument, std::move(message));
}

expected<void> check_range(std::string_view field, std::uint64_t v, std::uint64_t lo,
                           std::uint64_t hi) {
  if (v < lo || v > hi) return invalid(fmt::format("{} = {} is out of range ({}..{})", field, v, lo, hi));
  return {};
}

bool is_quantized(tensor_type t) noexcept { return block_elems(t) > 1; }

std::uint64_t parameter_count(const model_spec& s) {
  const std::uint64_t dim = s.dim;
  const std::uint64_t kv_dim = std::uint64_t{s.n_kv_heads} * (s.dim / s.n_heads);
  const std::uint64_t biases = s.arch == architecture::qwen2 ? dim + 2 * kv_dim : 0;
  const std::uint64_t per_layer = 2 * dim * dim + 2 * dim * kv_dim + 3 * dim * s.ff_dim + 2 * dim + biases;
  const std::uint64_t outputs = s.tie_embeddings ? 1 : 2;
  return outputs * dim * s.vocab_size + dim + s.n_layers * per_layer;
}

// --- deterministic weights -------------------------------------------------

std::uint64_t fnv1a64(std::string_view s) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// Approximately N(0, 1): the sum of four 16-bit uniforms (Irwin-Hall), centred
// and scaled. Integer sums and one float multiply make it exact and identical
// on every machine.
float normal_at(std::uint64_t key, std::uint64_t index) noexcept {
  const std::uint64_t bits = splitmix64(key + index);
  const std::int64_t sum = static_cast<std::int64_t>((bits & 0xffff) + ((bits >> 16) & 0xffff) +
                                                     ((bits >> 32) & 0xffff) + (bits >> 48));
  constexpr float scale = 1.7320508f / 65536.0f;  // sqrt(3) / 2^16: unit variance
  return static_cast<float>(sum - 131070) * scale;
}

// bias: qwen2's Q/K/V biases; rope_freqs: computed, not random.
enum class weight_kind { embedding, matrix, norm, bias, rope_freqs };

// 1-D tensors: written f32 whatever the spec's type, as converters do.
bool is_vector(weight_kind k) noexcept {
  return k == weight_kind::norm || k == weight_kind::bias || k == weight_kind::rope_freqs;
}

struct tensor_plan {
  std::string name;
  std::vector<std::uint64_t> shape;  // ggml ne: {cols, rows} or {cols}
  weight_kind kind;
  float gain = 1.0f;  // on top of the 1/sqrt(fan_in) scale (deep_block_scale)
};

std::vector<tensor_plan> plan_tensors(const model_spec& s) {
  const std::uint64_t dim = s.dim;
  const std::uint64_t kv_dim = std::uint64_t{s.n_kv_heads} * (s.dim / s.n_heads);
  const std::uint64_t ff = s.ff_dim;
  std::vector<tensor_plan> plan;
  plan.push_back({"token_embd.weight", {dim, s.vocab_size}, weight_kind::embedding});
  if (s.rope_scaling == rope_scaling_kind::llama3) {
    plan.push_back({"rope_freqs.weight", {s.dim / s.n_heads / 2}, weight_kind::rope_freqs});
  }
  for (std::uint32_t i = 0; i < s.n_layers; ++i) {
    auto name = [i](std::string_view what) { return fmt::format("blk.{}.{}.weight", i, what); };
    plan.push_back({name("attn_norm"), {dim}, weight_kind::norm});
    plan.push_back({name("attn_q"), {dim, dim}, weight_kind::matrix});
    plan.push_back({name("attn_k"), {dim, kv_dim}, weight_kind::matrix});
    plan.push_back({name("attn_v"), {dim, kv_dim}, weight_kind::matrix});
    if (s.arch == architecture::qwen2) {
      plan.push_back({fmt::format("blk.{}.attn_q.bias", i), {dim}, weight_kind::bias});
      plan.push_back({fmt::format("blk.{}.attn_k.bias", i), {kv_dim}, weight_kind::bias});
      plan.push_back({fmt::format("blk.{}.attn_v.bias", i), {kv_dim}, weight_kind::bias});
    }
    const float gain = i >= s.deep_block_from ? s.deep_block_scale : 1.0f;
    plan.push_back({name("attn_output"), {dim, dim}, weight_kind::matrix, gain});
    plan.push_back({name("ffn_norm"), {dim}, weight_kind::norm});
    plan.push_back({name("ffn_gate"), {dim, ff}, weight_kind::matrix});
    plan.push_back({name("ffn_up"), {dim, ff}, weight_kind::matrix});
    plan.push_back({name("ffn_down"), {ff, dim}, weight_kind::matrix, gain});
  }
  plan.push_back({"output_norm.weight", {dim}, weight_kind::norm});
  if (!s.tie_embeddings) plan.push_back({"output.weight", {dim, s.vocab_size}, weight_kind::matrix});
  return plan;
}

// Llama 3.1's RoPE frequency factors as llama.cpp's converter computes them
// for rope_type "llama3": 1 for wavelengths under original_context / 4, the
// full factor above original_context, and a smooth blend between.
std::vector<float> llama3_rope_factors(const model_spec& s) {
  const std::uint32_t rope_dim = s.dim / s.n_heads;
  const double factor = s.rope_scaling_factor, low_freq_factor = 1.0, high_freq_factor = 4.0;
  const double old_context = s.rope_original_context;
  const double low_freq_wavelen = old_context / low_freq_factor;
  const double high_freq_wavelen = old_context / high_freq_factor;
  std::vector<float> out;
  for (std::uint32_t i = 0; i < rope_dim; i += 2) {
    const double freq = 1.0 / std::pow(static_cast<double>(s.rope_freq_base), static_cast<double>(i) / rope_dim);
    const double wavelen = 2.0 * std::numbers::pi / freq;
    double f = 1.0;
    if (wavelen > low_freq_wavelen) {
      f = factor;
    } else if (wavelen >= high_freq_wavelen) {
      const double smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      f = 1.0 / ((1.0 - smooth) / factor + smooth);
    }
    out.push_back(static_cast<float>(f));
  }
  return out;
}

// Produces one tensor's bytes row by row, converting each row as it goes so
// that no float copy of the whole tensor exists.
void fill_tensor(const model_spec& spec, const tensor_plan& p, tensor_type type, std::span<std::byte> out) {
  const std::uint64_t seed = spec.seed;
  if (p.kind == weight_kind::rope_freqs) {
    const std::vector<float> factors = llama3_rope_factors(spec);
    EXA_ASSERT(factors.size() == p.shape[0] && out.size() == row_bytes(type, factors.size()));
    return convert_row(factors, type, out.data());
  }
  const std::uint64_t key = splitmix64(seed ^ splitmix64(fnv1a64(p.name)));
  const std::uint64_t cols = p.shape[0];
  const std::uint64_t rows = p.shape.size() > 1 ? p.shape[1] : 1;
  const std::size_t row_size = row_bytes(type, static_cast<std::size_t>(cols));
  EXA_ASSERT(out.size() == rows * row_size);
  // Scaled by 1/sqrt(fan_in) so activations keep roughly unit scale through
  // each matmul; embeddings are looked up, not multiplied, so stay unit.
  const float scale = p.kind == weight_kind::matrix ? p.gain / std::sqrt(static_cast<float>(cols)) : 1.0f;
  std::vector<float> row(static_cast<std::size_t>(cols));
  for (std::uint64_t r = 0; r < rows; ++r) {
    for (std::uint64_t c = 0; c < cols; ++c) {
      const float z = normal_at(key, r * cols + c);
      // Biases are large enough (real qwen2 Q/K biases are) that a forward
      // pass ignoring them is far off.
      row[static_cast<std::size_t>(c)] = p.kind == weight_kind::norm   ? 1.0f + 0.1f * z
                                         : p.kind == weight_kind::bias ? 0.5f * z
                                                                       : z * scale;
    }
    convert_row(row, type, out.data() + r * row_size);
  }
}

void write_metadata(gguf_writer& w, const model_spec& s) {
  const std::string_view arch = to_string(s.arch);
  const auto key = [arch](std::string_view suffix) { return fmt::format("{}.{}", arch, suffix); };
  w.add_string("general.architecture", std::string(arch));
  w.add_string("general.name", s.name);
  w.add_u32("general.alignment", alignment);
  w.add_u32(key("context_length"), s.context_length);
  w.add_u32(key("embedding_length"), s.dim);
  w.add_u32(key("block_count"), s.n_layers);
  w.add_u32(key("feed_forward_length"), s.ff_dim);
  w.add_u32(key("attention.head_count"), s.n_heads);
  w.add_u32(key("attention.head_count_kv"), s.n_kv_heads);
  w.add_u32(key("rope.dimension_count"), s.dim / s.n_heads);
  w.add_f32(key("rope.freq_base"), s.rope_freq_base);
  w.add_f32(key("attention.layer_norm_rms_epsilon"), s.rms_eps);
  if (s.rope_scaling == rope_scaling_kind::linear) {
    w.add_string(key("rope.scaling.type"), "linear");
    w.add_f32(key("rope.scaling.factor"), s.rope_scaling_factor);
  }
  w.add_u32("general.file_type", llama_file_type({s.type, s.mix}));
  w.add_u32("general.quantization_version", 2);
}

expected<void> check_sizes(const model_spec& s) {
  struct bound {
    std::string_view field;
    std::uint64_t value, lo, hi;
  };
  const bound bounds[] = {
      {"n_layers", s.n_layers, 1, max_layers},
      {"dim", s.dim, 1, max_dim},
      {"n_heads", s.n_heads, 1, max_heads},
      {"n_kv_heads", s.n_kv_heads, 1, s.n_heads},
      {"ff_dim", s.ff_dim, 1, max_ff},
      {"vocab_size", s.vocab_size, s.vocabulary ? 1 : min_vocab, max_vocab},
      {"context_length", s.context_length, min_context, max_context},
  };
  for (const bound& b : bounds) {
    if (auto r = check_range(b.field, b.value, b.lo, b.hi); !r) return r;
  }
  return {};
}

// K-quant rows that are not whole 256-element super-blocks fall back to
// q5_0/q5_1/q8_0 per tensor, as llama.cpp does (weight_type_for); only the
// mix itself needs a K-quant base.
expected<void> check_k_quant_rows(const model_spec& s) {
  if (s.mix == quant_mix::k_m && s.type != tensor_type::q4_K && s.type != tensor_type::q5_K) {
    return invalid(fmt::format("the *_K_M mix needs a q4_K or q5_K base, not {}", to_string(s.type)));
  }
  return {};
}

expected<void> check_rope_scaling(const model_spec& s) {
  if (s.rope_scaling == rope_scaling_kind::none) return {};
  if (!std::isfinite(s.rope_scaling_factor) || !(s.rope_scaling_factor >= 1.0f)) {
    return invalid(fmt::format("rope_scaling_factor = {} must be finite and at least 1", s.rope_scaling_factor));
  }
  if (s.rope_scaling == rope_scaling_kind::llama3) {
    // llama.cpp's qwen2 graph takes no frequency factors.
    if (s.arch != architecture::llama) return invalid("llama3 RoPE scaling needs the llama architecture");
    if (auto r = check_range("rope_original_context", s.rope_original_context, 1, max_context); !r) return r;
  }
  return {};
}

}  // namespace

std::optional<model_spec> preset_spec(std::string_view name) {
  if (name == "tiny") return model_spec{};  // the defaults are the tiny model
  if (name == "small") {
    model_spec s;
    s.name = "exaserve-small";
    s.n_layers = 16;
    s.dim = 768;
    s.n_heads = 12;
    s.n_kv_heads = 4;
    s.ff_dim = 2048;
    s.vocab_size = 260;
    s.context_length = 2048;
    return s;
  }
  return std::nullopt;
}

expected<void> validate(const model_spec& s) {
  if (s.name.empty() || s.name.size() > max_name_bytes) {
    return invalid(fmt::format("name must be 1..{} bytes, got {}", max_name_bytes, s.name.size()));
  }
  if (!tensor_type_from_id(static_cast<std::uint32_t>(s.type))) {
    return invalid(fmt::format("type id {} is not a runnable tensor type",
                               static_cast<std::uint32_t>(s.type)));
  }
  if (auto r = check_sizes(s); !r) return r;
  if (s.vocabulary) {
    if (auto r = s.vocabulary->validate(); !r) return r;
    if (s.vocabulary->tokens.size() != s.vocab_size) {
      return invalid(fmt::format("vocab_size {} differs from the vocabulary's {} tokens", s.vocab_size,
                                 s.vocabulary->tokens.size()));
    }
  }
  if (s.dim % s.n_heads != 0) {
    return invalid(fmt::format("dim {} is not divisible by n_heads {}", s.dim, s.n_heads));
  }
  if (s.n_heads % s.n_kv_heads != 0) {
    return invalid(fmt::format("n_heads {} is not divisible by n_kv_heads {}", s.n_heads, s.n_kv_heads));
  }
  if ((s.dim / s.n_heads) % 2 != 0) {
    return invalid(fmt::format("head dimension dim / n_heads = {} must be even", s.dim / s.n_heads));
  }
  if (is_quantized(s.type) && (s.dim % 32 != 0 || s.ff_dim % 32 != 0)) {
    return invalid(fmt::format("type {} needs dim ({}) and ff_dim ({}) divisible by 32",
                               to_string(s.type), s.dim, s.ff_dim));
  }
  if (auto r = check_k_quant_rows(s); !r) return r;
  if (auto r = check_rope_scaling(s); !r) return r;
  if (!std::isfinite(s.deep_block_scale) || s.deep_block_scale <= 0.0f || s.deep_block_scale > 4.0f) {
    return invalid(fmt::format("deep_block_scale must be in (0, 4], got {}", s.deep_block_scale));
  }
  if (!std::isfinite(s.rope_freq_base) || !(s.rope_freq_base > 0.0f)) {
    return invalid(fmt::format("rope_freq_base = {} must be positive and finite", s.rope_freq_base));
  }
  if (!std::isfinite(s.rms_eps) || !(s.rms_eps > 0.0f)) {
    return invalid(fmt::format("rms_eps = {} must be positive and finite", s.rms_eps));
  }
  if (const std::uint64_t n = parameter_count(s); n > max_params) {
    return invalid(fmt::format("spec has {} parameters, above the limit of {}", n, max_params));
  }
  return {};
}

expected<void> generate_model(const model_spec& spec, const std::string& path) {
  if (auto r = validate(spec); !r) return r;
  gguf_writer w;
  write_metadata(w, spec);
  if (spec.vocabulary) {
    spec.vocabulary->write_gguf(w);
  } else {
    tokenizer::byte_level(spec.vocab_size).write_gguf(w);
  }
  for (tensor_plan& p : plan_tensors(spec)) {
    // Norms, biases and RoPE factors stay f32 whatever the spec asks: they
    // are tiny and the engine applies them in float.
    const tensor_type type = is_vector(p.kind)
                                 ? tensor_type::f32
                                 : weight_type_for({spec.type, spec.mix}, p.name, spec.tie_embeddings,
                                                   spec.n_layers, p.shape[0]);
    std::vector<std::uint64_t> shape = p.shape;
    std::string name = p.name;
    w.add_tensor_fill(std::move(name), std::move(shape), type,
                      // w.write() below runs the fills while `spec` is alive.
                      [plan = std::move(p), type, &spec](std::span<std::byte> out) {
                        fill_tensor(spec, plan, type, out);
                      });
  }
  return w.write(path);
}

}  // namespace exa::model
