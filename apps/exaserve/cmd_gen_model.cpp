// exaserve gen-model: writes a Llama GGUF model with deterministic weights.

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "args.hpp"
#include "cli_util.hpp"
#include "commands.hpp"
#include "model/model_gen.hpp"

namespace exa::app {
namespace {

const std::vector<flag_spec> flags = {
    {"preset", true, "tiny (default) or small (~100M parameters)"},
    {"out", true, "output file (required)"},
    {"seed", true, "weight seed (default 1)"},
    {"type", true, "f32 (default), f16, bf16, q8_0, q4_0"},
    {"layers", true, "override: transformer blocks"},
    {"dim", true, "override: embedding width"},
    {"heads", true, "override: attention heads"},
    {"kv-heads", true, "override: key/value heads (GQA when < heads)"},
    {"ff", true, "override: feed-forward width"},
    {"vocab", true, "override: vocabulary size (>= 260)"},
    {"context", true, "override: context length"},
    {"name", true, "override: general.name"},
    {"tie-embeddings", false, "omit output.weight (the head reuses token_embd)"},
    {"help", false, "show this help"},
};

expected<model::model_spec> spec_from(const args& a) {
  const std::string preset = a.get_or("preset", "tiny");
  auto spec = model::preset_spec(preset);
  if (!spec) return make_error(errc::invalid_argument, "unknown preset '" + preset + "' (tiny, small)");
  auto seed = a.get_int("seed", 1, 0, INT64_MAX);
  if (!seed) return std::unexpected(seed.error());
  spec->seed = static_cast<std::uint64_t>(*seed);
  if (auto t = a.get("type")) {
    auto type = model::tensor_type_from_string(*t);
    if (!type) return make_error(errc::invalid_argument, "unknown --type '" + *t + "' (f32, f16, bf16, q8_0, q4_0)");
    spec->type = *type;
  }
  struct field { const char* flag; std::uint32_t* dst; };
  const field fields[] = {{"layers", &spec->n_layers}, {"dim", &spec->dim}, {"heads", &spec->n_heads},
                          {"kv-heads", &spec->n_kv_heads}, {"ff", &spec->ff_dim},
                          {"vocab", &spec->vocab_size}, {"context", &spec->context_length}};
  for (const auto& f : fields) {
    auto v = a.get_int(f.flag, *f.dst, 1, 1 << 24);
    if (!v) return std::unexpected(v.error());
    *f.dst = static_cast<std::uint32_t>(*v);
  }
  if (auto n = a.get("name")) spec->name = *n;
  if (a.has("tie-embeddings")) spec->tie_embeddings = true;
  if (auto ok = model::validate(*spec); !ok) return std::unexpected(ok.error());
  return *spec;
}

}  // namespace

int cmd_gen_model(int argc, char** argv) {
  auto a = args::parse(argc, argv, 2, flags);
  if (!a) return fail("gen-model", a.error());
  if (a->has("help")) {
    std::printf("usage: exaserve gen-model --preset tiny|small [--seed S] [--type T] --out FILE [shape flags]\n%s",
                describe_flags(flags).c_str());
    return 0;
  }
  const auto out = a->get("out");
  if (!out) return fail("gen-model", {errc::invalid_argument, "--out FILE is required"});
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
               spec->vocab_size, spec->context_length, model::to_string(spec->type), spec->seed,
               ec ? 0 : bytes, secs);
  return 0;
}

}  // namespace exa::app
