// Greedy ids against llama.cpp without llama.cpp: tests/fixtures/crosscheck/
// greedy.json holds llama.cpp's ids and top-two logit margins for generated
// files (llama and qwen2; f16, q8_0, q4_k_m; Llama 3.1 rope_freqs and linear
// RoPE scaling), written by scripts/crosscheck_llamacpp.mjs. The files are
// regenerated here from the same gen-model settings (generation is
// deterministic), the engine decodes greedily, and the ids must be equal up
// to the first step that is a near-tie by the fixture's per-type rule. f16
// runs must match every step: llama.cpp and the engine agree to ~1e-3 there.

#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/llama_forward.hpp"
#include "fixtures.hpp"
#include "model/quant_mix.hpp"

using namespace exa;
using json = nlohmann::json;

namespace {

std::string arg_after(const std::vector<std::string>& args, const std::string& flag, std::string fallback) {
  for (std::size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == flag) return args[i + 1];
  return fallback;
}

// The spec `exaserve gen-model` builds from the fixture's shape and flags.
model::model_spec spec_for(const json& doc, const json& run) {
  auto spec = *model::preset_spec("tiny");
  const std::vector<std::string> shape = doc.at("gen_model_shape");
  const std::vector<std::string> args = run.at("gen_model_args");
  spec.name = "xcheck-" + run.at("model").get<std::string>();
  spec.seed = doc.at("seed");
  spec.n_layers = std::stoul(arg_after(shape, "--layers", ""));
  spec.dim = std::stoul(arg_after(shape, "--dim", ""));
  spec.n_heads = std::stoul(arg_after(shape, "--heads", ""));
  spec.n_kv_heads = std::stoul(arg_after(shape, "--kv-heads", ""));
  spec.ff_dim = std::stoul(arg_after(shape, "--ff", ""));
  spec.vocab_size = std::stoul(arg_after(shape, "--vocab", ""));
  spec.context_length = std::stoul(arg_after(shape, "--context", ""));
  const auto format = model::weight_format_from_string(arg_after(args, "--type", "f32"));
  REQUIRE(format.has_value());
  spec.type = format->base;
  spec.mix = format->mix;
  if (arg_after(args, "--arch", "llama") == "qwen2") {
    spec.arch = model::architecture::qwen2;
    spec.rope_freq_base = 1000000.0f;  // as gen-model --arch qwen2 sets them
    spec.rms_eps = 1e-6f;
  }
  const std::string scaling = arg_after(args, "--rope-scaling", "none");
  if (scaling == "linear") spec.rope_scaling = model::rope_scaling_kind::linear;
  if (scaling == "llama3") spec.rope_scaling = model::rope_scaling_kind::llama3;
  spec.rope_scaling_factor = std::stof(arg_after(args, "--rope-factor", "8"));
  spec.rope_original_context = std::stoul(arg_after(args, "--rope-original-context", "8192"));
  spec.tie_embeddings = std::find(args.begin(), args.end(), "--tie-embeddings") != args.end();
  return spec;
}

struct greedy_run {
  std::vector<std::int32_t> ids;
  std::vector<float> margins;
};

// Prefills the prompt in one batch, then decodes one token per step.
greedy_run decode(const model::llama_model& m, const std::vector<std::int32_t>& prompt, std::size_t steps) {
  const auto& c = m.config();
  const auto total = static_cast<std::uint32_t>(prompt.size() + steps);
  auto pool = test::make_pool(m, total);
  engine::kv_cache cache(*pool, {c.n_layers, c.kv_dim(), 16});
  REQUIRE(cache.reserve(1, total));
  engine::thread_pool threads(2);
  engine::llama_forward fwd(c, m.weights(), cache, threads);
  greedy_run out;
  std::vector<std::int32_t> input = prompt;
  std::uint32_t pos = 0;
  std::vector<float> logits;
  while (out.ids.size() < steps) {
    engine::forward_batch batch;
    batch.tables.push_back(&cache.table(1));
    for (std::size_t i = 0; i < input.size(); ++i, ++pos)
      batch.tokens.push_back({input[i], pos, 0, i + 1 == input.size()});
    fwd.run(batch, logits);
    REQUIRE(logits.size() == c.vocab_size);
    std::size_t best = 0, second = 1;
    if (logits[1] > logits[0]) std::swap(best, second);
    for (std::size_t v = 2; v < logits.size(); ++v) {
      if (logits[v] > logits[best]) second = best, best = v;
      else if (logits[v] > logits[second]) second = v;
    }
    out.ids.push_back(static_cast<std::int32_t>(best));
    out.margins.push_back(logits[best] - logits[second]);
    input = {static_cast<std::int32_t>(best)};
  }
  return out;
}

}  // namespace

TEST_CASE("greedy ids equal llama.cpp's up to the first near-tie", "[engine][crosscheck]") {
  std::ifstream in(std::string(EXA_FIXTURES_DIR) + "/crosscheck/greedy.json");
  REQUIRE(in.good());
  const json doc = json::parse(in);
  const std::size_t steps = doc.at("steps");
  const std::map<std::string, double> tie = doc.at("tie");
  std::size_t compared = 0, full = 0;
  for (const json& run : doc.at("runs")) {
    const model::model_spec spec = spec_for(doc, run);
    const std::string type = arg_after(run.at("gen_model_args"), "--type", "f32");
    auto m = test::make_model(spec);
    const std::vector<std::int32_t> prompt = run.at("prompt");
    const std::vector<std::int32_t> want = run.at("ids");
    const std::vector<float> want_margins = run.at("margins");
    const greedy_run got = decode(*m, prompt, steps);
    INFO(run.at("model").get<std::string>() << ", prompt of " << prompt.size() << " tokens");
    std::size_t i = 0;
    while (i < steps && got.ids[i] == want[i]) ++i;
    compared += i;
    if (i == steps) {
      ++full;
      continue;
    }
    INFO("diverged at step " << i << ": ours " << got.ids[i] << " (margin " << got.margins[i] << "), llama.cpp "
                              << want[i] << " (margin " << want_margins[i] << ")");
    CHECK(type != "f16");
    CHECK(std::min<double>(got.margins[i], want_margins[i]) < tie.at(type));
  }
  INFO(full << " runs equal for all steps, " << compared << " steps equal");
  CHECK(compared > 0);
}
