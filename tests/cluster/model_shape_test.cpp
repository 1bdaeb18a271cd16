// model_shape: published parameter counts, GQA-aware KV bytes per token,
// weight bytes per precision, and agreement with real GGUF files.

#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "cluster/model_shape.hpp"
#include "model/llama_model.hpp"
#include "model/model_gen.hpp"

using namespace exa;
using namespace exa::cluster;
using Catch::Matchers::Contains;

namespace {

model_shape preset(const char* name, precision p = precision::fp16) {
  auto s = model_shape_preset(name, p);
  REQUIRE(s.has_value());
  return *s;
}

std::string tmp_path(const std::string& name) {
  std::filesystem::create_directories(EXA_TEST_TMPDIR);
  return std::string(EXA_TEST_TMPDIR) + "/" + name;
}

}  // namespace

TEST_CASE("presets carry the published shapes", "[model_shape]") {
  const model_shape m = preset("llama-2-70b");
  CHECK(m.n_layers == 80);
  CHECK(m.dim == 8192);
  CHECK(m.n_heads == 64);
  CHECK(m.n_kv_heads == 8);
  CHECK(m.head_dim() == 128);
  CHECK(m.ff_dim == 28672);
  CHECK(m.vocab_size == 32000);
  CHECK(m.context_length == 4096);
  const model_shape l3 = preset("llama-3-8b");
  CHECK(l3.vocab_size == 128256);
  CHECK(l3.context_length == 8192);
  CHECK(l3.n_kv_heads == 8);
  CHECK(l3.ff_dim == 14336);
}

TEST_CASE("parameter counts match the published ones exactly", "[model_shape]") {
  CHECK(preset("llama-2-7b").parameter_count() == 6'738'415'616ull);
  CHECK(preset("llama-2-13b").parameter_count() == 13'015'864'320ull);
  CHECK(preset("llama-2-70b").parameter_count() == 68'976'648'192ull);
  CHECK(preset("llama-3-8b").parameter_count() == 8'030'261'248ull);
  CHECK(preset("llama-3-70b").parameter_count() == 70'553'706'496ull);
}

TEST_CASE("a tied output head is not counted twice", "[model_shape]") {
  model_shape m = preset("llama-2-7b");
  const std::uint64_t untied = m.parameter_count();
  m.tied_embeddings = true;
  CHECK(m.parameter_count() == untied - 32000ull * 4096);
}

TEST_CASE("KV bytes per token follow the KV heads, not the query heads", "[model_shape]") {
  // 2 × 80 × 8 × 128 × 2: the naive 2 × 80 × 8192 × 2 = 2,621,440 ignores GQA.
  CHECK(preset("llama-2-70b").kv_bytes_per_token() == 327'680);
  CHECK(preset("llama-2-7b").kv_bytes_per_token() == 524'288);  // MHA: 32 KV heads
  CHECK(preset("llama-3-8b").kv_bytes_per_token() == 131'072);
  model_shape m = preset("llama-2-70b");
  m.kv_elem_bytes = 1;  // fp8 KV cache
  CHECK(m.kv_bytes_per_token() == 163'840);
}

TEST_CASE("weight bytes per precision", "[model_shape]") {
  // Matrices at the precision, the 2 × layers + 1 norm vectors at f32.
  const std::uint64_t norms_70b = (2 * 80 + 1) * 8192;
  const std::uint64_t params_70b = 68'976'648'192ull;
  CHECK(preset("llama-2-70b").norm_parameter_count() == norms_70b);
  CHECK(preset("llama-2-70b").weight_bytes == 137'955'934'208ull);
  CHECK(preset("llama-2-70b").weight_bytes == 2 * (params_70b - norms_70b) + 4 * norms_70b);
  CHECK(preset("llama-2-70b", precision::bf16).weight_bytes == 137'955'934'208ull);
  CHECK(preset("llama-2-70b", precision::fp32).weight_bytes == 4 * params_70b);
  // Q4_0: 18 bytes per 32 weights, about 4.5 GB for Llama-3-8B.
  CHECK(preset("llama-3-8b", precision::int4).weight_bytes == 4'517'937'152ull);
  // Q8_0: 34 bytes per 32 weights.
  CHECK(preset("llama-3-8b", precision::int8).weight_bytes == 8'532'934'656ull);
  CHECK(weight_bytes_for(precision::int4, 33) == 36);  // a partial block costs a whole one
  CHECK(weight_bytes_for(precision::int8, 64) == 68);
  CHECK(weight_bytes_for(precision::fp16, 3) == 6);
}

TEST_CASE("with_precision recomputes the bytes", "[model_shape]") {
  const model_shape fp16 = preset("llama-2-7b");
  const model_shape int8 = with_precision(fp16, precision::int8);
  CHECK(int8.weight_precision == precision::int8);
  CHECK(int8.weight_bytes < fp16.weight_bytes);
  CHECK(int8.weight_bytes == preset("llama-2-7b", precision::int8).weight_bytes);
  CHECK(int8.parameter_count() == fp16.parameter_count());
}

TEST_CASE("precision names", "[model_shape]") {
  CHECK(precision_from_string("fp16") == precision::fp16);
  CHECK(precision_from_string("BF16") == precision::bf16);
  CHECK(precision_from_string("q4_0") == precision::int4);
  CHECK(precision_from_string("int8") == precision::int8);
  CHECK(precision_from_string("f32") == precision::fp32);
  CHECK_FALSE(precision_from_string("int3").has_value());
  CHECK_FALSE(precision_from_string("").has_value());
  for (precision p : {precision::fp32, precision::fp16, precision::bf16, precision::int8, precision::int4}) {
    CHECK(precision_from_string(to_string(p)) == p);
    CHECK(from_tensor_type(to_tensor_type(p)) == p);
  }
}

TEST_CASE("unknown presets are refused with the valid names", "[model_shape]") {
  auto s = model_shape_preset("llama-4-9000b");
  REQUIRE_FALSE(s.has_value());
  CHECK(s.error().code == errc::not_found);
  CHECK_THAT(s.error().message, Contains("llama-4-9000b") && Contains("llama-2-70b") && Contains("tiny"));
  CHECK(model_shape_preset("LLaMA-2-7B").has_value());  // case-insensitive
  CHECK(model_shape_preset_names().size() == 7);
}

TEST_CASE("generated presets follow model_gen", "[model_shape]") {
  for (const char* name : {"tiny", "small"}) {
    const model_shape s = preset(name);
    const auto spec = model::preset_spec(name);
    REQUIRE(spec.has_value());
    CHECK(s.n_layers == spec->n_layers);
    CHECK(s.dim == spec->dim);
    CHECK(s.n_kv_heads == spec->n_kv_heads);
    CHECK(s.ff_dim == spec->ff_dim);
    CHECK(s.vocab_size == spec->vocab_size);
  }
}

TEST_CASE("validate names the broken field", "[model_shape]") {
  model_shape m = preset("llama-2-7b");
  CHECK(validate(m).has_value());
  m.n_heads = 30;  // 4096 % 30 != 0
  auto r = validate(m);
  REQUIRE_FALSE(r.has_value());
  CHECK_THAT(r.error().message, Contains("n_heads 30"));
  m = preset("llama-2-70b");
  m.n_kv_heads = 6;  // 64 % 6 != 0
  CHECK_THAT(validate(m).error().message, Contains("n_kv_heads 6"));
  m = preset("llama-2-70b");
  m.n_layers = 0;
  CHECK_THAT(validate(m).error().message, Contains("n_layers"));
  m = preset("llama-2-70b");
  m.kv_elem_bytes = 3;
  CHECK_THAT(validate(m).error().message, Contains("kv_elem_bytes"));
}

TEST_CASE("a loaded GGUF file gives its real bytes, equal to the computed ones", "[model_shape]") {
  // Two paths to the same number: the generator writes real tensors, the
  // shape computes them from the formula.
  struct variant { model::tensor_type type; bool tied; precision expect; };
  const variant variants[] = {{model::tensor_type::f32, false, precision::fp32},
                              {model::tensor_type::f16, false, precision::fp16},
                              {model::tensor_type::bf16, true, precision::bf16},
                              {model::tensor_type::q8_0, false, precision::int8},
                              {model::tensor_type::q4_0, true, precision::int4}};
  for (const variant& v : variants) {
    auto spec = *model::preset_spec("tiny");
    spec.type = v.type;
    spec.tie_embeddings = v.tied;
    const std::string path = tmp_path(std::string("shape-") + std::string(model::to_string(v.type)) + ".gguf");
    REQUIRE(model::generate_model(spec, path).has_value());
    auto loaded = model::llama_model::load(path);
    REQUIRE(loaded.has_value());
    const model_shape s = model_shape_from(**loaded);
    INFO("type " << model::to_string(v.type));
    CHECK(s.weight_precision == v.expect);
    CHECK(s.tied_embeddings == v.tied);
    CHECK(s.n_kv_heads == spec.n_kv_heads);
    CHECK(s.weight_bytes == (*loaded)->weights().total_bytes());
    CHECK(s.weight_bytes == s.computed_weight_bytes());
    CHECK(s.kv_bytes_per_token() == (*loaded)->config().kv_bytes_per_token(2));
  }
}

TEST_CASE("the ledger accounts a qwen2 q4_k_m file's real tensor bytes", "[model_shape][arch]") {
  // Mixed K-quant types per tensor, f32 biases and norms: the formula cannot
  // know them, the file can. Every tensor of the file must be counted once.
  for (const bool tied : {false, true}) {
    model::model_spec spec;
    spec.arch = model::architecture::qwen2;
    spec.dim = 256;
    spec.ff_dim = 512;
    spec.type = model::tensor_type::q4_K;
    spec.mix = model::quant_mix::k_m;
    spec.tie_embeddings = tied;
    const std::string path = tmp_path(tied ? "shape-qwen2-q4km-tied.gguf" : "shape-qwen2-q4km.gguf");
    REQUIRE(model::generate_model(spec, path).has_value());
    auto loaded = model::llama_model::load(path);
    if (!loaded) FAIL(to_string(loaded.error()));
    std::uint64_t file_bytes = 0;
    for (const auto& t : (*loaded)->file().tensors()) file_bytes += t.size_bytes;
    const model_shape s = model_shape_from(**loaded);
    CHECK(s.weight_bytes == file_bytes);
    CHECK(s.tied_embeddings == tied);
    CHECK(s.weight_precision == precision::int4);
    CHECK(s.kv_bytes_per_token() == (*loaded)->config().kv_bytes_per_token(2));
  }
}
