// Architectures and RoPE scaling as read from GGUF files: qwen2's keys,
// pairing and biases; Llama 3.1's rope_freqs; {arch}.rope.scaling.*; clear
// refusals of other architectures, scaling types and stray tensors.

#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <numeric>
#include <variant>

#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"
#include "model/llama_config.hpp"
#include "model/llama_model.hpp"
#include "model/llama_weights.hpp"
#include "model/model_gen.hpp"

using namespace exa;
using namespace exa::model;
using Catch::Matchers::Contains;

namespace {

// A one-layer file of architecture `arch` (dim 64, 4 heads, 2 KV heads),
// every tensor f32; keys and tensors can be changed before parse().
struct fake_file {
  using value = std::variant<std::uint32_t, float, std::string>;
  std::string arch;
  std::vector<std::pair<std::string, value>> keys;
  std::vector<std::pair<std::string, std::vector<std::uint64_t>>> tensors;
  std::vector<float> rope_freqs_values;  // written into rope_freqs.weight when present

  explicit fake_file(std::string a) : arch(std::move(a)) {
    for (auto [k, v] : {std::pair{"context_length", 128u}, {"embedding_length", 64u}, {"block_count", 1u},
                        {"feed_forward_length", 128u}, {"attention.head_count", 4u},
                        {"attention.head_count_kv", 2u}}) {
      keys.emplace_back(arch + "." + k, v);
    }
    tensors = {{"token_embd.weight", {64, 260}}, {"output_norm.weight", {64}},
               {"blk.0.attn_norm.weight", {64}},  {"blk.0.attn_q.weight", {64, 64}},
               {"blk.0.attn_k.weight", {64, 32}}, {"blk.0.attn_v.weight", {64, 32}},
               {"blk.0.attn_output.weight", {64, 64}}, {"blk.0.ffn_norm.weight", {64}},
               {"blk.0.ffn_gate.weight", {64, 128}},   {"blk.0.ffn_up.weight", {64, 128}},
               {"blk.0.ffn_down.weight", {128, 64}}};
    if (arch == "qwen2") {
      tensors.push_back({"blk.0.attn_q.bias", {64}});
      tensors.push_back({"blk.0.attn_k.bias", {32}});
      tensors.push_back({"blk.0.attn_v.bias", {32}});
    }
  }
  void set(const std::string& key, value v) {
    std::erase_if(keys, [&](const auto& kv) { return kv.first == key; });
    keys.emplace_back(key, std::move(v));
  }
  void erase_tensor(const std::string& name) {
    std::erase_if(tensors, [&](const auto& t) { return t.first == name; });
  }
  gguf_file parse() const {
    gguf_writer w;
    w.add_string("general.architecture", arch);
    for (const auto& [k, v] : keys) {
      if (auto* u = std::get_if<std::uint32_t>(&v)) w.add_u32(k, *u);
      if (auto* f = std::get_if<float>(&v)) w.add_f32(k, *f);
      if (auto* s = std::get_if<std::string>(&v)) w.add_string(k, *s);
    }
    for (const auto& [name, shape] : tensors) {
      const std::uint64_t n = std::accumulate(shape.begin(), shape.end(), std::uint64_t{1}, std::multiplies<>());
      std::vector<float> data(n, 1.0f);
      if (name == "rope_freqs.weight" && !rope_freqs_values.empty()) data = rope_freqs_values;
      REQUIRE(data.size() == n);
      std::vector<std::byte> bytes(n * 4);
      std::memcpy(bytes.data(), data.data(), bytes.size());
      w.add_tensor(name, shape, tensor_type::f32, std::move(bytes));
    }
    auto f = gguf_file::parse(w.serialize());
    REQUIRE(f.has_value());
    return std::move(*f);
  }
};

error config_error(const fake_file& m) {
  const gguf_file f = m.parse();
  auto c = read_llama_config(f);
  REQUIRE_FALSE(c.has_value());
  return c.error();
}

llama_config config_of(const fake_file& m) {
  const gguf_file f = m.parse();
  auto c = read_llama_config(f);
  if (!c) FAIL(to_string(c.error()));
  return *c;
}

error bind_error(const fake_file& m) {
  const gguf_file f = m.parse();
  auto c = read_llama_config(f);
  if (!c) FAIL(to_string(c.error()));
  auto w = bind_llama_weights(f, *c);
  REQUIRE_FALSE(w.has_value());
  return w.error();
}

std::string tmp_path(const std::string& name) {
  const std::string dir = std::string(EXA_TEST_TMPDIR) + "/llama-config";
  std::filesystem::create_directories(dir);
  return dir + "/" + name;
}

std::uint64_t file_tensor_bytes(const gguf_file& f) {
  std::uint64_t total = 0;
  for (const gguf_tensor& t : f.tensors()) total += t.size_bytes;
  return total;
}

}  // namespace

TEST_CASE("qwen2 files: qwen2.* keys, half-split RoPE, Q/K/V biases", "[model][arch]") {
  for (const bool tied : {false, true}) {
    model_spec spec;
    spec.arch = architecture::qwen2;
    spec.tie_embeddings = tied;
    spec.rope_freq_base = 1000000.0f;
    spec.rms_eps = 1e-6f;
    const std::string path = tmp_path(tied ? "qwen2-tied.gguf" : "qwen2.gguf");
    REQUIRE(generate_model(spec, path).has_value());
    auto m = llama_model::load(path);
    if (!m) FAIL(to_string(m.error()));
    const llama_config& c = (*m)->config();
    CHECK(c.arch == architecture::qwen2);
    CHECK(c.rope_pairs == rope_pairing::halves);
    CHECK(c.rope_freq_base == 1000000.0f);
    CHECK(c.rms_eps == 1e-6f);
    CHECK(c.dim == spec.dim);
    const llama_weights& w = (*m)->weights();
    CHECK(w.tied_output == tied);
    CHECK_FALSE(w.rope_freqs.has_value());
    for (const llama_layer_weights& l : w.layers) {
      REQUIRE((l.bq && l.bk && l.bv));
      CHECK(l.bq->cols == c.dim);
      CHECK(l.bk->cols == c.kv_dim());
      CHECK(l.bv->cols == c.kv_dim());
      CHECK(l.bq->type == tensor_type::f32);
      CHECK_FALSE(l.bo.has_value());
    }
    // Every tensor of the file is bound, so the weights' bytes are the file's.
    CHECK(w.total_bytes() == file_tensor_bytes((*m)->file()));
  }
  CHECK(config_of(fake_file("llama")).rope_pairs == rope_pairing::adjacent);
}

TEST_CASE("other architectures are refused by name", "[model][arch]") {
  const error e = config_error(fake_file("gemma"));
  CHECK(e.code == errc::unsupported);
  CHECK(e.message == "unsupported architecture 'gemma' (supported: llama, qwen2)");
  CHECK(architecture_from_string("Qwen2") == std::nullopt);
  CHECK(architecture_from_string("qwen2") == architecture::qwen2);
  // Keys of another architecture's prefix do not count.
  fake_file mixed("qwen2");
  mixed.keys.clear();
  mixed.set("llama.embedding_length", 64u);
  CHECK(config_error(mixed).code == errc::not_found);
  CHECK_THAT(config_error(mixed).message, Contains("qwen2.context_length"));
}

TEST_CASE("RoPE scaling keys follow llama.cpp's reading", "[model][arch]") {
  struct row {
    std::optional<std::string> type;
    std::optional<float> factor;
    float expect_scale;
  };
  const row rows[] = {
      {std::nullopt, std::nullopt, 1.0f}, {"linear", 4.0f, 0.25f},  // factor 4: positions / 4
      {std::nullopt, 2.0f, 0.5f},         // the type defaults to linear
      {"none", 4.0f, 1.0f},               // none ignores any factor
      {"linear", 0.0f, 1.0f},             // 0 means no factor
  };
  for (const row& r : rows) {
    fake_file m("qwen2");
    if (r.type) m.set("qwen2.rope.scaling.type", *r.type);
    if (r.factor) m.set("qwen2.rope.scaling.factor", *r.factor);
    INFO(r.type.value_or("(no type)") << " " << r.factor.value_or(-1));
    CHECK(config_of(m).rope_freq_scale == r.expect_scale);
  }
  fake_file old_key("llama");
  old_key.set("llama.rope.scale_linear", 2.0f);
  CHECK(config_of(old_key).rope_freq_scale == 0.5f);

  for (const char* t : {"yarn", "longrope"}) {
    fake_file m("llama");
    m.set("llama.rope.scaling.type", std::string(t));
    const error e = config_error(m);
    CHECK(e.code == errc::unsupported);
    CHECK_THAT(e.message, Contains("llama.rope.scaling.type") && Contains(std::string("'") + t + "'"));
  }
  fake_file bogus("llama");
  bogus.set("llama.rope.scaling.type", std::string("llama3"));
  CHECK(config_error(bogus).code == errc::invalid_argument);
  fake_file negative("llama");
  negative.set("llama.rope.scaling.factor", -2.0f);
  CHECK_THAT(config_error(negative).message, Contains("llama.rope.scaling.factor"));
}

TEST_CASE("a stated head width other than dim / heads is refused", "[model][arch]") {
  fake_file m("llama");
  m.set("llama.attention.key_length", 32u);
  CHECK(config_error(m).code == errc::unsupported);
  CHECK_THAT(config_error(m).message, Contains("llama.attention.key_length = 32"));
  fake_file same("llama");
  same.set("llama.attention.value_length", 16u);  // = 64 / 4: fine
  CHECK(config_of(same).head_dim() == 16);
}

TEST_CASE("Llama 3.1 rope_freqs: generated as llama.cpp's converter computes them", "[model][arch]") {
  model_spec spec;
  spec.dim = 256;  // 4 heads of 64: 32 pairs
  spec.rope_freq_base = 500000.0f;
  spec.rope_scaling = rope_scaling_kind::llama3;
  const std::string path = tmp_path("llama3-rope.gguf");
  REQUIRE(generate_model(spec, path).has_value());
  auto m = llama_model::load(path);
  if (!m) FAIL(to_string(m.error()));
  REQUIRE((*m)->weights().rope_freqs.has_value());
  const weight_view& v = *(*m)->weights().rope_freqs;
  REQUIRE(v.cols == 32);
  REQUIRE(v.type == tensor_type::f32);
  std::vector<float> f(32);
  std::memcpy(f.data(), v.data, 32 * 4);
  // Python, from convert_hf_to_gguf.py's formula (factor 8, low 1, high 4,
  // original context 8192), base 500000, head dim 64.
  for (int i = 0; i <= 14; ++i) CHECK(f[i] == 1.0f);
  CHECK(f[15] == Approx(1.5534146285049255).epsilon(1e-6));
  CHECK(f[16] == Approx(2.6945296878947333).epsilon(1e-6));
  CHECK(f[17] == Approx(5.257326588708467).epsilon(1e-6));
  for (int i = 18; i < 32; ++i) CHECK(f[i] == 8.0f);
  CHECK((*m)->weights().total_bytes() == file_tensor_bytes((*m)->file()));

  model_spec qwen = spec;
  qwen.arch = architecture::qwen2;
  CHECK_FALSE(validate(qwen).has_value());  // qwen2's graph takes no factors
}

TEST_CASE("binding refuses missing biases, stray tensors and bad rope_freqs", "[model][arch]") {
  fake_file no_bias("qwen2");
  no_bias.erase_tensor("blk.0.attn_k.bias");
  CHECK(bind_error(no_bias).code == errc::not_found);
  CHECK_THAT(bind_error(no_bias).message, Contains("'blk.0.attn_k.bias'"));

  fake_file bad_bias("qwen2");
  bad_bias.erase_tensor("blk.0.attn_v.bias");
  bad_bias.tensors.push_back({"blk.0.attn_v.bias", {64}});
  CHECK(bind_error(bad_bias).code == errc::invalid_argument);
  CHECK(bind_error(bad_bias).message == "tensor 'blk.0.attn_v.bias' has shape [64], expected [32]");

  // A tensor the graph would not use: computing without it is not the model.
  fake_file ffn_bias("llama");
  ffn_bias.tensors.push_back({"blk.0.ffn_up.bias", {128}});
  CHECK(bind_error(ffn_bias).code == errc::unsupported);
  CHECK_THAT(bind_error(ffn_bias).message, Contains("'blk.0.ffn_up.bias'") && Contains("llama"));

  fake_file qwen_freqs("qwen2");
  qwen_freqs.tensors.push_back({"rope_freqs.weight", {8}});
  CHECK(bind_error(qwen_freqs).code == errc::unsupported);
  CHECK_THAT(bind_error(qwen_freqs).message, Contains("'rope_freqs.weight'") && Contains("qwen2"));

  fake_file zero_freq("llama");
  zero_freq.tensors.push_back({"rope_freqs.weight", {8}});
  zero_freq.rope_freqs_values = {1, 1, 1, 0, 1, 1, 1, 1};
  CHECK(bind_error(zero_freq).code == errc::invalid_argument);
  CHECK_THAT(bind_error(zero_freq).message, Contains("'rope_freqs.weight' element 3"));

  fake_file wide_freq("llama");
  wide_freq.tensors.push_back({"rope_freqs.weight", {16}});
  CHECK_THAT(bind_error(wide_freq).message, Contains("expected [8]"));

  // llama files may carry any attention bias, all four bound.
  fake_file llama_bias("llama");
  for (auto [n, len] : {std::pair{"attn_q", 64u}, {"attn_k", 32u}, {"attn_v", 32u}, {"attn_output", 64u}})
    llama_bias.tensors.push_back({std::string("blk.0.") + n + ".bias", {len}});
  const gguf_file f = llama_bias.parse();
  auto w = bind_llama_weights(f, read_llama_config(f).value());
  REQUIRE(w.has_value());
  CHECK((w->layers[0].bq && w->layers[0].bk && w->layers[0].bv && w->layers[0].bo));
  CHECK(w->total_bytes() == file_tensor_bytes(f));
}
