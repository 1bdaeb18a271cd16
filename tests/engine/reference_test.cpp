// The engine's forward pass against the slow double-precision reference, on
// several shapes (MHA and GQA, odd sizes, tied embeddings) and weight types.
//
// Stated tolerances (normalized MSE of the logits, per position): the engine
// computes in f32 with an fp16 KV cache and, like llama.cpp, rounds
// activations to the weight type's precision (f16/bf16) or quantizes them to
// Q8_0 (for Q8_0/Q4_0 weights) or Q8_K (for K-quants). The bounds below leave
// ~6-10x margin over what those roundings cost on these shapes.

#include <catch2/catch.hpp>

#include "engine/llama_forward.hpp"
#include "fixtures.hpp"
#include "reference_llama.hpp"

using namespace exa;

namespace {

struct shape_case {
  const char* label;
  model::model_spec spec;
  double max_nmse;
};

model::model_spec shape(const char* name, std::uint32_t layers, std::uint32_t dim, std::uint32_t heads,
                        std::uint32_t kv, std::uint32_t ff, std::uint32_t vocab, model::tensor_type t,
                        bool tied = false) {
  model::model_spec s;
  s.name = name;
  s.n_layers = layers;
  s.dim = dim;
  s.n_heads = heads;
  s.n_kv_heads = kv;
  s.ff_dim = ff;
  s.vocab_size = vocab;
  s.context_length = 128;
  s.type = t;
  s.tie_embeddings = tied;
  s.seed = 7;
  return s;
}

// llama.cpp's *_K_M mix around the spec's K-quant base type.
model::model_spec k_m(model::model_spec s) {
  s.mix = model::quant_mix::k_m;
  return s;
}

std::vector<shape_case> cases() {
  using model::tensor_type;
  return {
      {"MHA f32", shape("mha", 2, 64, 4, 4, 160, 260, tensor_type::f32), 1e-6},
      {"GQA f32 odd sizes", shape("odd", 3, 40, 5, 1, 72, 301, tensor_type::f32), 1e-6},
      {"GQA f32 tied", shape("tied", 2, 48, 6, 2, 96, 270, tensor_type::f32, true), 1e-6},
      {"GQA f16", shape("f16", 2, 64, 4, 2, 192, 260, tensor_type::f16), 5e-6},
      {"GQA bf16", shape("bf16", 2, 64, 8, 2, 128, 260, tensor_type::bf16), 3e-4},
      {"MHA q8_0", shape("q8", 2, 64, 4, 4, 128, 260, tensor_type::q8_0), 2e-3},
      {"GQA q8_0", shape("q8g", 2, 96, 6, 3, 160, 288, tensor_type::q8_0), 2e-3},
      {"GQA q4_0", shape("q4", 2, 64, 4, 2, 192, 260, tensor_type::q4_0), 2e-3},
      {"GQA q4_k_m (q4_K + q6_K)", k_m(shape("q4km", 2, 256, 4, 2, 512, 260, tensor_type::q4_K)), 2e-3},
      {"GQA q5_k_m tied", k_m(shape("q5km", 2, 256, 8, 2, 256, 270, tensor_type::q5_K, true)), 2e-3},
      // Rows of 64/192: llama.cpp's fallbacks q5_0 and q8_0 (q4_k_m), q5_1 (q5_k_m).
      {"GQA q4_k_m fallback", k_m(shape("q4kmf", 2, 64, 4, 2, 192, 260, tensor_type::q4_K)), 2e-3},
      {"GQA q5_k_m fallback", k_m(shape("q5kmf", 2, 64, 4, 2, 192, 260, tensor_type::q5_K)), 2e-3},
      {"GQA q4_1", shape("q41", 2, 64, 4, 2, 192, 260, tensor_type::q4_1), 2e-3},
  };
}

}  // namespace

TEST_CASE("engine forward matches the reference on every shape and type", "[engine][reference]") {
  for (const auto& c : cases()) {
    SECTION(c.label) {
      auto m = test::make_model(c.spec);
      test::reference_llama ref(*m);
      const auto prompt = test::test_prompt(24, m->config().vocab_size, 3);
      const auto expected = ref.logits_all(prompt);

      auto pool = test::make_pool(*m, 32);
      engine::kv_cache cache(*pool, {m->config().n_layers, m->config().kv_dim(), 16});
      REQUIRE(cache.reserve(1, 32));
      engine::thread_pool threads(2);
      engine::llama_forward fwd(m->config(), m->weights(), cache, threads);
      engine::forward_batch batch;
      batch.tables.push_back(&cache.table(1));
      for (std::uint32_t p = 0; p < prompt.size(); ++p) batch.tokens.push_back({prompt[p], p, 0, true});
      std::vector<float> logits;
      fwd.run(batch, logits);
      const std::size_t vocab = m->config().vocab_size;
      REQUIRE(logits.size() == prompt.size() * vocab);
      double worst = 0;
      for (std::size_t p = 0; p < prompt.size(); ++p)
        worst = std::max(worst, test::nmse(logits.data() + p * vocab, expected[p]));
      INFO(c.label << ": worst logits NMSE " << worst);
      CHECK(worst < c.max_nmse);
      // The bound must be meaningful: random logits would be far off.
      CHECK(test::nmse(logits.data(), expected[5]) > 100 * c.max_nmse);
    }
  }
}
