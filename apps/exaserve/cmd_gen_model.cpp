// exaserve gen-model: writes a Llama GGUF model with deterministic weights.

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "args.hpp"
#include "cli_util.hpp"
#include "commands.hpp"
#include "model/draft_model.hpp"
#include "model/model_gen.hpp"
#include "model/vocab_json.hpp"

namespace exa::app {
namespace {

const std::vector<flag_spec> flags = {
    {"preset", true, "tiny (default) or small (~100M parameters)"},
    {"out", true, "output file (required)"},
    {"seed", true, "weight seed (default 1)"},
    {"type", true, "f32 (default), f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k_m, q5_k_m, q4_k, q5_k, q6_k "
                   "(K-quant rows not a multiple of 256 fall back to q5_0/q5_1/q8_0 as in llama.cpp)"},
    {"layers", true, "override: transformer blocks"},
    {"dim", true, "override: embedding width"},
    {"heads", true, "override: attention heads"},
    {"kv-heads", true, "override: key/value heads (GQA when < heads)"},
    {"ff", true, "override: feed-forward width"},
    {"vocab", true, "N: byte-level vocabulary of N tokens (>= 260); FILE.json: that vocabulary "
                    "and tokenizer metadata (format in runtime/model/vocab_json.hpp), vocab size = its tokens"},
    {"context", true, "override: context length"},
    {"name", true, "override: general.name"},
    {"tie-embeddings", false, "omit output.weight (the head reuses token_embd)"},
    {"arch", true, "llama (default) or qwen2 (Q/K/V biases, half-split RoPE; Qwen2.5's rope base 1e6, rms eps 1e-6)"},
    {"rope-scaling", true, "none (default), linear ({arch}.rope.scaling.*) or llama3 (rope_freqs.weight, llama only)"},
    {"rope-factor", true, "RoPE scaling factor for linear/llama3 (default 8)"},
    {"rope-original-context", true, "llama3: original context length (default 8192)"},
    {"deep-block-scale", true, "scale of the outputs of blocks from --deep-block-from on (default 1): "
                               "under 1, deep blocks only refine, as in trained models, and a draft cut to "
                               "the first blocks agrees often"},
    {"deep-block-from", true, "first block --deep-block-scale applies to (default 0)"},
    {"draft-of", true, "TARGET.gguf: write a draft for speculative decoding instead: the target's first "
                       "--layers blocks with its embeddings, head, norms and tokenizer (default 2 layers)"},
    {"help", false, "show this help"},
};

// --draft-of TARGET [--layers L]: a draft cut from its target (model/draft_model.hpp).
int write_draft(const args& a, const std::string& target, const std::string& out) {
  auto layers = a.get_int("layers", 2, 1, 1 << 16);
  if (!layers) return fail("gen-model", layers.error());
  const auto t0 = std::chrono::steady_clock::now();
  if (auto ok = model::derive_draft(target, static_cast<std::uint32_t>(*layers), out); !ok)
    return fail("gen-model", ok.error());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(out, ec);
  spdlog::info("event=draft_written path={} target={} layers={} bytes={} seconds={:.2f}", out, target, *layers,
               ec ? 0 : bytes, secs);
  return 0;
}

// --arch and the RoPE scaling flags.
expected<void> read_arch_options(const args& a, model::model_spec& spec) {
  if (auto arch = a.get("arch")) {
    auto parsed = model::architecture_from_string(*arch);
    if (!parsed) return make_error(errc::invalid_argument, "unknown --arch '" + *arch + "' (llama, qwen2)");
    spec.arch = *parsed;
    if (spec.arch == model::architecture::qwen2) {
      spec.rope_freq_base = 1000000.0f;
      spec.rms_eps = 1e-6f;
    }
  }
  if (auto r = a.get("rope-scaling")) {
    if (*r == "none") spec.rope_scaling = model::rope_scaling_kind::none;
    else if (*r == "linear") spec.rope_scaling = model::rope_scaling_kind::linear;
    else if (*r == "llama3") spec.rope_scaling = model::rope_scaling_kind::llama3;
    else return make_error(errc::invalid_argument, "unknown --rope-scaling '" + *r + "' (none, linear, llama3)");
  }
  auto factor = a.get_double("rope-factor", 8.0, 1.0, 1024.0);
  if (!factor) return std::unexpected(factor.error());
  spec.rope_scaling_factor = static_cast<float>(*factor);
  auto original = a.get_int("rope-original-context", 8192, 1, 1 << 24);
  if (!original) return std::unexpected(original.error());
  spec.rope_original_context = static_cast<std::uint32_t>(*original);
  return {};
}

expected<model::model_spec> spec_from(const args& a) {
  const std::string preset = a.get_or("preset", "tiny");
  auto spec = model::preset_spec(preset);
  if (!spec) return make_error(errc::invalid_argument, "unknown preset '" + preset + "' (tiny, small)");
  auto seed = a.get_int("seed", 1, 0, INT64_MAX);
  if (!seed) return std::unexpected(seed.error());
  spec->seed = static_cast<std::uint64_t>(*seed);
  if (auto t = a.get("type")) {
    auto format = model::weight_format_from_string(*t);
    if (!format) {
      return make_error(errc::invalid_argument,
                        "unknown --type '" + *t + "' (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k_m, q5_k_m, q4_k, q5_k, q6_k)");
    }
    spec->type = format->base;
    spec->mix = format->mix;
  }
  // --vocab is a size when it is a number and a JSON vocabulary otherwise.
  if (auto v = a.get("vocab"); v && !v->empty() && v->find_first_not_of("0123456789") != std::string::npos) {
    auto vocabulary = model::vocab_from_json_file(*v);
    if (!vocabulary) return std::unexpected(vocabulary.error());
    spec->vocab_size = static_cast<std::uint32_t>(vocabulary->tokens.size());
    spec->vocabulary = std::move(*vocabulary);
  }
  struct field { const char* flag; std::uint32_t* dst; };
  const field fields[] = {{"layers", &spec->n_layers}, {"dim", &spec->dim}, {"heads", &spec->n_heads},
                          {"kv-heads", &spec->n_kv_heads}, {"ff", &spec->ff_dim},
                          {"vocab", &spec->vocab_size}, {"context", &spec->context_length}};
  for (const auto& f : fields) {
    if (spec->vocabulary && std::string_view(f.flag) == "vocab") continue;
    auto v = a.get_int(f.flag, *f.dst, 1, 1 << 24);
    if (!v) return std::unexpected(v.error());
    *f.dst = static_cast<std::uint32_t>(*v);
  }
  if (auto n = a.get("name")) spec->name = *n;
  if (a.has("tie-embeddings")) spec->tie_embeddings = true;
  if (auto r = read_arch_options(a, *spec); !r) return std::unexpected(r.error());
  auto deep_scale = a.get_double("deep-block-scale", 1.0, 1e-6, 4.0);
  auto deep_from = a.get_int("deep-block-from", 0, 0, 1 << 16);
  if (!deep_scale) return std::unexpected(deep_scale.error());
  if (!deep_from) return std::unexpected(deep_from.error());
  spec->deep_block_scale = static_cast<float>(*deep_scale);
  spec->deep_block_from = static_cast<std::uint32_t>(*deep_from);
  if (auto ok = model::validate(*spec); !ok) return std::unexpected(ok.error());
  return *spec;
}

}  // namespace

int cmd_gen_model(int argc, char** argv) {
  auto a = args::parse(argc, argv, 2, flags);
  if (!a) return fail("gen-model", a.error());
  if (a->has("help")) {
    std::printf("usage: exaserve gen-model --preset tiny|small [--seed S] [--type T] --out FILE [shape flags]\n"
                "       exaserve gen-model --draft-of TARGET.gguf [--layers L] --out FILE\n"
                "  --vocab FILE.json writes random weights under a real vocabulary (SentencePiece 'llama'\n"
                "  or byte-level BPE 'gpt2', with merges, special ids, add_bos/eos, chat template), so\n"
                "  llama.cpp and exaserve can be compared on tokenization and templates.\n%s",
                describe_flags(flags).c_str());
    return 0;
  }
  const auto out = a->get("out");
  if (!out) return fail("gen-model", {errc::invalid_argument, "--out FILE is required"});
  if (auto target = a->get("draft-of")) return write_draft(*a, *target, *out);
  auto spec = spec_from(*a);
  if (!spec) return fail("gen-model", spec.error());
  const auto t0 = std::chrono::steady_clock::now();
  if (auto ok = model::generate_model(*spec, *out); !ok) return fail("gen-model", ok.error());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(*out, ec);
  spdlog::info("event=model_written path={} layers={} dim={} heads={} kv_heads={} ff={} vocab={} context={} "
               "type={} seed={} bytes={} seconds={:.2f}",
               *out, spec->n_layers, spec->dim, spec->n_heads, spec->n_kv_heads, spec->ff_dim,
               spec->vocab_size, spec->context_length,
               model::to_string(model::weight_format{spec->type, spec->mix}), spec->seed,
               ec ? 0 : bytes, secs);
  return 0;
}

}  // namespace exa::app
