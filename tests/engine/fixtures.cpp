#include "fixtures.hpp"

#include <cstring>
#include <stdexcept>

#include <catch2/catch.hpp>

#include "../common/poisoned_model.hpp"

#include <filesystem>
#include <map>
#include <mutex>

namespace exa::test {

std::shared_ptr<const model::llama_model> make_model(const model::model_spec& spec) {
  static std::map<std::string, std::shared_ptr<const model::llama_model>> cache;
  const std::string key = spec.name + "-L" + std::to_string(spec.n_layers) + "-d" + std::to_string(spec.dim) +
                          "-h" + std::to_string(spec.n_heads) + "-kv" + std::to_string(spec.n_kv_heads) +
                          "-ff" + std::to_string(spec.ff_dim) + "-v" + std::to_string(spec.vocab_size) +
                          "-c" + std::to_string(spec.context_length) + "-" +
                          std::string(model::to_string(spec.type)) + (spec.mix == model::quant_mix::k_m ? "-km" : "") +
                          (spec.tie_embeddings ? "-tied" : "") + "-" +
                          std::string(model::to_string(spec.arch)) + "-rope" +
                          std::to_string(static_cast<int>(spec.rope_scaling)) + "x" +
                          std::to_string(spec.rope_scaling_factor) + "o" + std::to_string(spec.rope_original_context) +
                          "b" + std::to_string(spec.rope_freq_base) + "e" + std::to_string(spec.rms_eps) +
                          "-s" + std::to_string(spec.seed);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  const std::string dir = std::string(EXA_TEST_TMPDIR) + "/engine-models";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + key + ".gguf";
  auto ok = model::generate_model(spec, path);
  REQUIRE(ok.has_value());
  auto m = model::llama_model::load(path);
  if (!m) FAIL(to_string(m.error()));
  cache[key] = *m;
  return *m;
}

std::shared_ptr<const model::llama_model> make_poisoned_model(const model::model_spec& spec, std::int32_t token) {
  auto m = model::llama_model::load(write_poisoned_copy(make_model(spec)->path(), token));
  if (!m) FAIL(to_string(m.error()));
  return *m;
}

model::model_spec tiny_spec(model::tensor_type type) {
  auto s = *model::preset_spec("tiny");
  s.type = type;
  return s;
}

std::unique_ptr<gpu::cpu_memory_pool> make_pool(const model::llama_model& m, std::uint32_t tokens,
                                                std::uint32_t block_tokens) {
  auto p = gpu::cpu_memory_pool::create(engine::cpu_engine::kv_block_bytes(m.config(), block_tokens),
                                        (tokens + block_tokens - 1) / block_tokens);
  REQUIRE(p.has_value());
  return std::move(*p);
}

std::vector<std::int32_t> test_prompt(std::size_t n, std::uint32_t vocab, std::uint64_t salt) {
  std::vector<std::int32_t> p(n);
  std::uint64_t x = salt * 0x9e3779b97f4a7c15ull + 12345;
  for (auto& t : p) {
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    t = static_cast<std::int32_t>(3 + (x * 0x2545f4914f6cdd1dull >> 33) % (vocab - 3));
  }
  return p;
}

std::vector<std::vector<std::int32_t>> run_to_completion(engine::inference_engine& eng,
                                                         std::size_t n_requests,
                                                         std::uint64_t* preemptions) {
  std::vector<std::vector<std::int32_t>> out(n_requests);
  for (int guard = 0; !eng.idle(); ++guard) {
    REQUIRE(guard < 100000);
    const auto r = eng.step();
    for (const auto& t : r.tokens) {
      REQUIRE(t.id < n_requests);
      REQUIRE(t.index == out[t.id].size());
      out[t.id].push_back(t.token);
    }
    if (preemptions) *preemptions += r.preempted;
  }
  return out;
}

engine::generation_request request(std::uint64_t id, std::vector<std::int32_t> prompt, std::uint32_t max_tokens,
                                   engine::sampling_params sp) {
  engine::generation_request r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling = sp;
  return r;
}

engine::forward_batch prompt_batch(engine::kv_cache& cache,
                                   const std::vector<std::pair<engine::seq_id, const std::vector<std::int32_t>*>>& seqs) {
  engine::forward_batch b;
  for (const auto& [id, tokens] : seqs) {
    REQUIRE(cache.reserve(id, static_cast<std::uint32_t>(tokens->size())));
    const auto index = static_cast<std::uint32_t>(b.tables.size());
    b.tables.push_back(&cache.table(id));
    for (std::uint32_t p = 0; p < tokens->size(); ++p) b.tokens.push_back({(*tokens)[p], p, index, true});
  }
  return b;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<engine::isa> runnable_isas() {
  const auto caps = engine::detect_cpu();
  std::vector<engine::isa> out;
  for (const auto v : {engine::isa::scalar, engine::isa::avx2, engine::isa::avxvnni, engine::isa::avx512,
                       engine::isa::amx})
    if (engine::supports(caps, v) && engine::request_os_state(v)) out.push_back(v);
  return out;
}

isa_scope::isa_scope(engine::isa v) : previous_(engine::active_isa()) {
  const auto ok = engine::set_active_isa(engine::to_string(v));
  if (!ok) throw std::runtime_error("isa_scope: " + ok.error().message);
}

isa_scope::~isa_scope() { (void)engine::set_active_isa(engine::to_string(previous_)); }

}  // namespace exa::test
