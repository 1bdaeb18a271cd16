// The model generator, and the Llama config and weight binding it feeds:
// determinism, every weight type, quantization error bounds, and the errors
// a malformed Llama file gets (each naming its key or tensor).

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"
#include "model/half.hpp"
#include "model/llama_config.hpp"
#include "model/llama_weights.hpp"
#include "model/model_gen.hpp"
#include "model/quantize.hpp"
#include "model/tokenizer.hpp"

using namespace exa;
using namespace exa::model;
using Catch::Matchers::Contains;

namespace {

std::string tmp_path(const std::string& name) {
  std::filesystem::create_directories(EXA_TEST_TMPDIR);
  return std::string(EXA_TEST_TMPDIR) + "/" + name;
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

gguf_file generate_and_open(const model_spec& spec, const std::string& name) {
  const std::string path = tmp_path(name);
  auto r = generate_model(spec, path);
  INFO((r ? std::string() : to_string(r.error())));
  REQUIRE(r.has_value());
  auto f = gguf_file::open(path);
  REQUIRE(f.has_value());
  return std::move(*f);
}

std::vector<float> dequantize_tensor_row(const gguf_tensor& t, std::uint64_t row) {
  REQUIRE(t.type.has_value());
  std::vector<float> out(t.shape[0]);
  const std::size_t rb = row_bytes(*t.type, t.shape[0]);
  dequantize_row(*t.type, t.data + row * rb, out);
  return out;
}

// A Llama file built by hand: metadata plus zero-filled tensors, any of which
// a test can drop, reshape or retype.
struct fake_llama {
  struct tensor_spec {
    std::string name;
    std::vector<std::uint64_t> shape;
    std::uint32_t type_id;
  };
  std::string arch = "llama";
  std::vector<std::pair<std::string, std::uint32_t>> keys;
  std::vector<tensor_spec> tensors;

  fake_llama(std::uint64_t dim, std::uint32_t heads, std::uint32_t kv_heads, std::uint64_t ff,
             std::uint32_t layers, std::uint64_t vocab) {
    keys = {{"llama.context_length", 256},
            {"llama.embedding_length", static_cast<std::uint32_t>(dim)},
            {"llama.block_count", layers},
            {"llama.feed_forward_length", static_cast<std::uint32_t>(ff)},
            {"llama.attention.head_count", heads},
            {"llama.attention.head_count_kv", kv_heads}};
    const std::uint64_t kv_dim = dim / heads * kv_heads;
    tensors.push_back({"token_embd.weight", {dim, vocab}, 0});
    for (std::uint32_t i = 0; i < layers; ++i) {
      const std::string p = "blk." + std::to_string(i) + ".";
      tensors.push_back({p + "attn_norm.weight", {dim}, 0});
      tensors.push_back({p + "attn_q.weight", {dim, dim}, 0});
      tensors.push_back({p + "attn_k.weight", {dim, kv_dim}, 0});
      tensors.push_back({p + "attn_v.weight", {dim, kv_dim}, 0});
      tensors.push_back({p + "attn_output.weight", {dim, dim}, 0});
      tensors.push_back({p + "ffn_norm.weight", {dim}, 0});
      tensors.push_back({p + "ffn_gate.weight", {dim, ff}, 0});
      tensors.push_back({p + "ffn_up.weight", {dim, ff}, 0});
      tensors.push_back({p + "ffn_down.weight", {ff, dim}, 0});
    }
    tensors.push_back({"output_norm.weight", {dim}, 0});
    tensors.push_back({"output.weight", {dim, vocab}, 0});
  }

  void set_key(const std::string& key, std::uint32_t v) {
    for (auto& kv : keys) {
      if (kv.first == key) {
        kv.second = v;
        return;
      }
    }
    keys.emplace_back(key, v);
  }
  void erase_key(const std::string& key) {
    std::erase_if(keys, [&](const auto& kv) { return kv.first == key; });
  }
  void erase_tensor(const std::string& name) {
    std::erase_if(tensors, [&](const tensor_spec& t) { return t.name == name; });
  }
  tensor_spec& tensor(const std::string& name) {
    for (auto& t : tensors) {
      if (t.name == name) return t;
    }
    FAIL("no tensor " << name);
    return tensors.front();
  }

  gguf_file parse() const {
    gguf_writer w;
    w.add_string("general.architecture", arch);
    for (const auto& [k, v] : keys) w.add_u32(k, v);
    for (const tensor_spec& t : tensors) {
      const ggml_type_traits* info = ggml_type_info(t.type_id);
      std::uint64_t bytes = t.shape[0] / info->block_elems * info->block_bytes;
      for (std::size_t i = 1; i < t.shape.size(); ++i) bytes *= t.shape[i];
      w.add_tensor_raw(t.name, t.shape, t.type_id, std::vector<std::byte>(bytes));
    }
    auto f = gguf_file::parse(w.serialize());
    REQUIRE(f.has_value());
    return std::move(*f);
  }
};

fake_llama tiny_fake() { return fake_llama(64, 4, 2, 192, 2, 260); }

error config_error(const fake_llama& m) {
  const gguf_file f = m.parse();
  auto c = read_llama_config(f);
  REQUIRE_FALSE(c.has_value());
  return c.error();
}

error bind_error(const fake_llama& m) {
  const gguf_file f = m.parse();
  auto c = read_llama_config(f);
  REQUIRE(c.has_value());
  auto w = bind_llama_weights(f, *c);
  REQUIRE_FALSE(w.has_value());
  return w.error();
}

}  // namespace

TEST_CASE("a generated tiny model reads back with its spec", "[model]") {
  const model_spec spec = *preset_spec("tiny");
  const gguf_file f = generate_and_open(spec, "gen-tiny.gguf");
  auto c = read_llama_config(f);
  REQUIRE(c.has_value());
  CHECK(c->name == "exaserve-tiny");
  CHECK(c->n_layers == 2);
  CHECK(c->dim == 64);
  CHECK(c->n_heads == 4);
  CHECK(c->n_kv_heads == 2);
  CHECK(c->ff_dim == 192);
  CHECK(c->vocab_size == 260);
  CHECK(c->context_length == 512);
  CHECK(c->rope_dim == 16);
  CHECK(c->rope_freq_base == 10000.0f);
  CHECK(c->rms_eps == 1e-5f);
  CHECK(c->kv_dim() == 32);
  CHECK(f.get_int("general.file_type").value() == 0);
  // 64: every tensor starts on a cache line, where the kernels' 64-byte loads
  // of f32 rows do not straddle two lines.
  CHECK(f.get_int("general.alignment").value() == 64);

  auto w = bind_llama_weights(f, *c);
  REQUIRE(w.has_value());
  for (const auto& layer : w->layers)
    for (const auto* t : {&layer.wq, &layer.wk, &layer.wv, &layer.wo, &layer.w_gate, &layer.w_up, &layer.w_down})
      CHECK(reinterpret_cast<std::uintptr_t>(t->data) % 64 == 0);
  CHECK_FALSE(w->tied_output);
  REQUIRE(w->layers.size() == 2);
  CHECK(w->layers[1].wk.rows == 32);
  CHECK(w->layers[1].wk.cols == 64);
  CHECK(w->layers[0].w_down.cols == 192);
  CHECK(w->layers[0].attn_norm.rows == 1);
  CHECK(w->token_embd.rows == 260);
  CHECK(w->output.data != w->token_embd.data);
  CHECK(w->layers[0].wq.row(1) == w->layers[0].wq.data + 64 * 4);
  std::uint64_t file_bytes = 0;
  for (const gguf_tensor& t : f.tensors()) file_bytes += t.size_bytes;
  CHECK(w->total_bytes() == file_bytes);
  // llama.cpp's tensor order.
  CHECK(f.tensors().front().name == "token_embd.weight");
  CHECK(f.tensors()[1].name == "blk.0.attn_norm.weight");
  CHECK(f.tensors().back().name == "output.weight");
}

TEST_CASE("generation is deterministic in the seed", "[model]") {
  model_spec spec = *preset_spec("tiny");
  REQUIRE(generate_model(spec, tmp_path("seed-a.gguf")).has_value());
  REQUIRE(generate_model(spec, tmp_path("seed-b.gguf")).has_value());
  spec.seed = 2;
  REQUIRE(generate_model(spec, tmp_path("seed-c.gguf")).has_value());
  const auto a = read_file(tmp_path("seed-a.gguf"));
  CHECK(a == read_file(tmp_path("seed-b.gguf")));
  const auto c = read_file(tmp_path("seed-c.gguf"));
  REQUIRE(a.size() == c.size());
  CHECK(a != c);
  // A few hundred KB: big enough to be a real model, small enough for tests.
  CHECK(a.size() > 200 * 1024);
  CHECK(a.size() < 4 * 1024 * 1024);
}

TEST_CASE("generated weights have the intended scale", "[model]") {
  const gguf_file f = generate_and_open(*preset_spec("tiny"), "gen-stats.gguf");
  auto stats = [](const gguf_tensor& t) {
    const auto* x = reinterpret_cast<const float*>(t.data);
    const std::uint64_t n = t.elements();
    double sum = 0, sq = 0;
    for (std::uint64_t i = 0; i < n; ++i) sum += x[i];
    const double mean = sum / static_cast<double>(n);
    for (std::uint64_t i = 0; i < n; ++i) sq += (x[i] - mean) * (x[i] - mean);
    return std::pair{mean, std::sqrt(sq / static_cast<double>(n))};
  };
  const auto [embd_mean, embd_std] = stats(*f.find_tensor("token_embd.weight"));
  CHECK(std::abs(embd_mean) < 0.05);
  CHECK(embd_std == Approx(1.0).epsilon(0.05));
  const auto [down_mean, down_std] = stats(*f.find_tensor("blk.1.ffn_down.weight"));
  CHECK(std::abs(down_mean) < 0.01);
  CHECK(down_std == Approx(1.0 / std::sqrt(192.0)).epsilon(0.05));
  const auto [norm_mean, norm_std] = stats(*f.find_tensor("blk.0.attn_norm.weight"));
  CHECK(norm_mean == Approx(1.0).epsilon(0.05));
  CHECK(norm_std == Approx(0.1).epsilon(0.3));
}

TEST_CASE("every weight type generates, loads, binds and matches the f32 weights", "[model]") {
  model_spec spec = *preset_spec("tiny");
  const gguf_file ref = generate_and_open(spec, "types-f32.gguf");
  const std::vector<float> ref_row = dequantize_tensor_row(*ref.find_tensor("token_embd.weight"), 7);
  struct case_t {
    tensor_type type;
    std::int64_t file_type;
    float tolerance;  // on unit-scale embeddings
  };
  for (const case_t k : {case_t{tensor_type::f16, 1, 2e-3f}, case_t{tensor_type::bf16, 32, 2e-2f},
                         case_t{tensor_type::q8_0, 7, 3e-2f}, case_t{tensor_type::q4_0, 2, 0.5f}}) {
    INFO(to_string(k.type));
    spec.type = k.type;
    const gguf_file f = generate_and_open(spec, "types-" + std::string(to_string(k.type)) + ".gguf");
    CHECK(f.get_int("general.file_type").value() == k.file_type);
    auto c = read_llama_config(f);
    REQUIRE(c.has_value());
    auto w = bind_llama_weights(f, *c);
    REQUIRE(w.has_value());
    CHECK(w->layers[0].wq.type == k.type);
    CHECK(w->output.type == k.type);
    CHECK(w->layers[0].attn_norm.type == tensor_type::f32);
    CHECK(w->output_norm.type == tensor_type::f32);
    CHECK(w->layers[1].w_down.row_bytes() == row_bytes(k.type, 192));
    const std::vector<float> row = dequantize_tensor_row(*f.find_tensor("token_embd.weight"), 7);
    float max_err = 0;
    for (std::size_t i = 0; i < row.size(); ++i) max_err = std::max(max_err, std::abs(row[i] - ref_row[i]));
    CHECK(max_err <= k.tolerance);
    CHECK(max_err > 0.0f);  // the conversion really happened
    auto tok = tokenizer::from_gguf(f, c->vocab_size);
    REQUIRE(tok.has_value());
    CHECK(tok->can_encode());
  }
}

TEST_CASE("tied embeddings omit output.weight and bind it to token_embd", "[model]") {
  model_spec spec = *preset_spec("tiny");
  spec.tie_embeddings = true;
  const gguf_file f = generate_and_open(spec, "tied.gguf");
  CHECK(f.find_tensor("output.weight") == nullptr);
  auto c = read_llama_config(f);
  REQUIRE(c.has_value());
  auto w = bind_llama_weights(f, *c);
  REQUIRE(w.has_value());
  CHECK(w->tied_output);
  CHECK(w->output.data == w->token_embd.data);
  CHECK(w->output.rows == 260);
  std::uint64_t file_bytes = 0;
  for (const gguf_tensor& t : f.tensors()) file_bytes += t.size_bytes;
  CHECK(w->total_bytes() == file_bytes);  // counted once
}

TEST_CASE("q8_0 quantization matches ggml and bounds the error", "[model]") {
  // Golden block: x_j = j, so amax = 31, d = 31/127 and q_j = round(j * 127/31).
  std::vector<float> ramp(32);
  for (int j = 0; j < 32; ++j) ramp[j] = static_cast<float>(j);
  block_q8_0 golden;
  quantize_row_q8_0(ramp.data(), &golden, 32);
  CHECK(golden.d == float_to_f16(31.0f / 127.0f));
  CHECK(golden.qs[0] == 0);
  CHECK(golden.qs[1] == 4);  // round(4.097)
  CHECK(golden.qs[31] == 127);

  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  const std::size_t n = 32 * 64;
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  for (std::size_t j = 0; j < 32; ++j) x[j] = 0.0f;  // an all-zero block: d = 0
  x[40] = 1000.0f;                                     // one outlier dominating its block
  std::vector<block_q8_0> q(n / 32);
  quantize_row_q8_0(x.data(), q.data(), n);
  std::vector<float> y(n);
  dequantize_row_q8_0(q.data(), y.data(), n);
  for (std::size_t b = 0; b < n / 32; ++b) {
    float amax = 0;
    for (std::size_t j = 0; j < 32; ++j) amax = std::max(amax, std::abs(x[b * 32 + j]));
    const float d = amax / 127.0f;
    const float d16 = f16_to_float(q[b].d);
    // Rounding to the grid costs d/2; storing d as fp16 moves each of up to
    // 127 steps by |d - d16|.
    const float bound = d / 2 + 127.0f * std::abs(d - d16) + 1e-6f;
    for (std::size_t j = 0; j < 32; ++j) {
      INFO("block " << b << " element " << j);
      CHECK(std::abs(x[b * 32 + j] - y[b * 32 + j]) <= bound);
    }
  }
  for (std::size_t j = 0; j < 32; ++j) CHECK(y[j] == 0.0f);
  // The byte-pointer entry points agree with the block ones.
  std::vector<std::byte> bytes(row_bytes(tensor_type::q8_0, n));
  convert_row(x, tensor_type::q8_0, bytes.data());
  CHECK(std::memcmp(bytes.data(), q.data(), bytes.size()) == 0);
}

TEST_CASE("q4_0 quantization matches ggml's layout and bounds the error", "[model]") {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 8) * 0.25f;  // max |x| is +5.75 at j=31
  block_q4_0 blk;
  quantize_row_q4_0(x.data(), &blk, 32);
  const float d = 5.75f / -8.0f;
  CHECK(blk.d == float_to_f16(d));
  // trunc(x / d + 8.5), worked out independently in float32: the largest
  // magnitude (j = 31) maps to 0, i.e. -8; x = 0 (j = 8) maps to 8. Element j
  // is the low nibble of byte j, element j + 16 its high nibble.
  const int expected_q[32] = {11, 10, 10, 10, 9, 9, 9, 8, 8, 8, 7, 7, 7, 6, 6, 6,
                              5,  5,  5,  4,  4, 3, 3, 3, 2, 2, 2, 1, 1, 1, 0, 0};
  for (int j = 0; j < 16; ++j) {
    INFO("byte " << j);
    CHECK((blk.qs[j] & 0x0f) == expected_q[j]);
    CHECK((blk.qs[j] >> 4) == expected_q[j + 16]);
  }

  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  const std::size_t n = 32 * 64;
  std::vector<float> xs(n);
  for (float& v : xs) v = dist(rng);
  std::vector<block_q4_0> q(n / 32);
  quantize_row_q4_0(xs.data(), q.data(), n);
  std::vector<float> y(n);
  dequantize_row_q4_0(q.data(), y.data(), n);
  for (std::size_t b = 0; b < n / 32; ++b) {
    float max = 0;
    for (std::size_t j = 0; j < 32; ++j) {
      if (std::abs(xs[b * 32 + j]) > std::abs(max)) max = xs[b * 32 + j];
    }
    const float db = max / -8.0f;
    const float d16 = f16_to_float(q[b].d);
    for (std::size_t j = 0; j < 32; ++j) {
      // Half a step, except values that round past 7 and are clamped (up to
      // a whole step); plus up to 8 steps' worth of the fp16 scale error.
      const float u = xs[b * 32 + j] / db;
      const float steps = u < 7.5f ? 0.5f : 1.0f;
      const float bound = steps * std::abs(db) + 8.0f * std::abs(db - d16) + 1e-6f;
      INFO("block " << b << " element " << j);
      CHECK(std::abs(xs[b * 32 + j] - y[b * 32 + j]) <= bound);
    }
  }
}

TEST_CASE("validate rejects bad specs naming the field", "[model]") {
  struct bad {
    const char* field;
    void (*mutate)(model_spec&);
  };
  const bad cases[] = {
      {"n_layers", [](model_spec& s) { s.n_layers = 0; }},
      {"n_layers", [](model_spec& s) { s.n_layers = 257; }},
      {"dim", [](model_spec& s) { s.dim = 0; }},
      {"dim", [](model_spec& s) { s.dim = 66; }},  // not divisible by 4 heads
      {"n_heads", [](model_spec& s) { s.n_heads = 0; }},
      {"n_heads", [](model_spec& s) { s.n_heads = 300; }},
      {"n_kv_heads", [](model_spec& s) { s.n_kv_heads = 3; }},
      {"n_kv_heads", [](model_spec& s) { s.n_kv_heads = 0; }},
      {"n_kv_heads", [](model_spec& s) { s.n_kv_heads = 8; }},
      {"ff_dim", [](model_spec& s) { s.ff_dim = 0; }},
      {"ff_dim", [](model_spec& s) { s.ff_dim = 65537; }},
      {"vocab_size", [](model_spec& s) { s.vocab_size = 259; }},
      {"vocab_size", [](model_spec& s) { s.vocab_size = (1u << 20) + 1; }},
      {"context_length", [](model_spec& s) { s.context_length = 8; }},
      {"head dimension", [](model_spec& s) { s.dim = 60; }},  // 60 / 4 = 15, odd
      {"dim", [](model_spec& s) { s.dim = 48; s.type = tensor_type::q8_0; }},
      {"ff_dim", [](model_spec& s) { s.ff_dim = 200; s.type = tensor_type::q4_0; }},
      {"rms_eps", [](model_spec& s) { s.rms_eps = 0.0f; }},
      {"rope_freq_base", [](model_spec& s) { s.rope_freq_base = std::numeric_limits<float>::quiet_NaN(); }},
      {"name", [](model_spec& s) { s.name.clear(); }},
      {"parameters", [](model_spec& s) { s.n_layers = 256; s.dim = 16384; s.n_heads = 128; s.ff_dim = 65536; }},
  };
  CHECK(validate(*preset_spec("tiny")).has_value());
  CHECK(validate(*preset_spec("small")).has_value());
  for (const bad& c : cases) {
    model_spec s = *preset_spec("tiny");
    c.mutate(s);
    auto r = validate(s);
    INFO(c.field);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == errc::invalid_argument);
    CHECK_THAT(r.error().message, Contains(c.field));
  }
}

TEST_CASE("presets and generate_model errors", "[model]") {
  const model_spec tiny = *preset_spec("tiny");
  CHECK(tiny.n_layers == 2);
  CHECK(tiny.dim == 64);
  CHECK(tiny.type == tensor_type::f32);
  const model_spec small = *preset_spec("small");
  CHECK(small.n_layers == 16);
  CHECK(small.dim == 768);
  CHECK(small.n_heads == 12);
  CHECK(small.n_kv_heads == 4);
  CHECK(small.ff_dim == 2048);
  CHECK(small.context_length == 2048);
  CHECK_FALSE(preset_spec("huge").has_value());

  model_spec bad = tiny;
  bad.n_layers = 0;
  const std::string path = tmp_path("never-written.gguf");
  auto r = generate_model(bad, path);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == errc::invalid_argument);
  CHECK_FALSE(std::filesystem::exists(path));

  auto io = generate_model(tiny, tmp_path("no-such-dir/x.gguf"));
  REQUIRE_FALSE(io.has_value());
  CHECK(io.error().code == errc::io_error);
  CHECK_THAT(io.error().message, Contains("no-such-dir"));
}

TEST_CASE("llama config applies defaults for optional keys", "[model]") {
  fake_llama m = tiny_fake();
  m.erase_key("llama.attention.head_count_kv");
  const gguf_file f = m.parse();
  auto c = read_llama_config(f);
  REQUIRE(c.has_value());
  CHECK(c->n_kv_heads == 4);
  CHECK(c->rope_dim == 16);
  CHECK(c->rope_freq_base == 10000.0f);
  CHECK(c->rms_eps == 1e-5f);
  CHECK(c->name.empty());
}

TEST_CASE("llama config errors name the key", "[model]") {
  for (const char* key : {"llama.context_length", "llama.embedding_length", "llama.block_count",
                          "llama.feed_forward_length", "llama.attention.head_count"}) {
    fake_llama m = tiny_fake();
    m.erase_key(key);
    const error e = config_error(m);
    CHECK(e.code == errc::not_found);
    CHECK_THAT(e.message, Contains(key));
  }
  fake_llama arch = tiny_fake();
  arch.arch = "gpt2";
  CHECK(config_error(arch).code == errc::unsupported);
  CHECK_THAT(config_error(arch).message, Contains("'gpt2'"));

  struct bad {
    const char* key;
    std::uint32_t value;
  };
  for (const bad b : {bad{"llama.attention.head_count", 5}, bad{"llama.attention.head_count_kv", 3},
                      bad{"llama.embedding_length", 0}, bad{"llama.block_count", 5000},
                      bad{"llama.rope.dimension_count", 15}, bad{"llama.rope.dimension_count", 18},
                      bad{"llama.context_length", 1u << 25}}) {
    fake_llama m = tiny_fake();
    m.set_key(b.key, b.value);
    const error e = config_error(m);
    INFO(b.key << " = " << b.value << ": " << e.message);
    CHECK(e.code == errc::invalid_argument);
    CHECK_THAT(e.message, Contains(b.key));
  }
  fake_llama odd_head = fake_llama(60, 4, 2, 192, 2, 260);  // head_dim 15
  CHECK_THAT(config_error(odd_head).message, Contains("must be even"));
  fake_llama no_embd = tiny_fake();
  no_embd.erase_tensor("token_embd.weight");
  CHECK(config_error(no_embd).code == errc::not_found);
  CHECK_THAT(config_error(no_embd).message, Contains("token_embd.weight"));
}

TEST_CASE("llama config rejects bad float keys", "[model]") {
  gguf_writer w;
  w.add_string("general.architecture", "llama");
  for (const char* k : {"llama.context_length", "llama.embedding_length", "llama.block_count",
                        "llama.feed_forward_length"}) {
    w.add_u32(k, 64);
  }
  w.add_u32("llama.attention.head_count", 4);
  w.add_f32("llama.attention.layer_norm_rms_epsilon", -1.0f);
  auto f = gguf_file::parse(w.serialize());
  REQUIRE(f.has_value());
  auto c = read_llama_config(*f);
  REQUIRE_FALSE(c.has_value());
  CHECK(c.error().code == errc::invalid_argument);
  CHECK_THAT(c.error().message, Contains("llama.attention.layer_norm_rms_epsilon"));
}

TEST_CASE("binding reports missing tensors, wrong shapes and unsupported types", "[model]") {
  fake_llama missing = tiny_fake();
  missing.erase_tensor("blk.1.ffn_down.weight");
  CHECK(bind_error(missing).code == errc::not_found);
  CHECK_THAT(bind_error(missing).message, Contains("'blk.1.ffn_down.weight'"));

  fake_llama shape = tiny_fake();
  shape.tensor("blk.1.attn_k.weight").shape = {64, 128};
  CHECK(bind_error(shape).code == errc::invalid_argument);
  CHECK(bind_error(shape).message ==
        "tensor 'blk.1.attn_k.weight' has shape [64, 128], expected [64, 32]");

  fake_llama rank = tiny_fake();
  rank.tensor("output_norm.weight").shape = {64, 1};
  CHECK_THAT(bind_error(rank).message, Contains("'output_norm.weight' has shape [64, 1], expected [64]"));

  // q3_K (not run by the engine) blocks hold 256 elements, so this fake
  // model is 256 wide; q4_K in the same place binds.
  fake_llama k_quant(256, 4, 2, 512, 1, 260);
  k_quant.tensor("blk.0.ffn_up.weight").type_id = 11;
  const error e = bind_error(k_quant);
  CHECK(e.code == errc::unsupported);
  CHECK_THAT(e.message, Contains("'blk.0.ffn_up.weight'") && Contains("q3_K"));
  k_quant.tensor("blk.0.ffn_up.weight").type_id = 12;
  const gguf_file kf = k_quant.parse();
  CHECK(bind_llama_weights(kf, read_llama_config(kf).value()).has_value());

  fake_llama q_norm = tiny_fake();
  q_norm.tensor("blk.0.ffn_norm.weight").type_id = 8;  // q8_0: wrong for a norm
  q_norm.tensor("blk.0.ffn_norm.weight").shape = {64};
  CHECK(bind_error(q_norm).code == errc::unsupported);
  CHECK_THAT(bind_error(q_norm).message, Contains("'blk.0.ffn_norm.weight'") && Contains("q8_0"));

  fake_llama half_norm = tiny_fake();
  half_norm.tensor("output_norm.weight").type_id = 1;  // f16 norms are fine
  const gguf_file f = half_norm.parse();
  auto w = bind_llama_weights(f, read_llama_config(f).value());
  REQUIRE(w.has_value());
  CHECK(w->output_norm.type == tensor_type::f16);
}
