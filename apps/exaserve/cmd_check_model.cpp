// exaserve check-model: loads a model file as a replica would (structure,
// shapes, tokenizer) and reads every value of every tensor, dequantized as the
// engine sees it, to find NaN or infinite ones (model/value_scan.hpp). A file
// with any makes the engine stop the requests they reach; this names the
// tensor and row before the file serves. Exit 0: loadable and every value
// finite; 1: not loadable, or non-finite values; 2: usage.

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>

#include <fmt/format.h>

#include "args.hpp"
#include "cli_util.hpp"
#include "commands.hpp"
#include "model/llama_model.hpp"
#include "model/value_scan.hpp"

namespace exa::app {
namespace {

const std::vector<flag_spec> check_model_flags = {
    {"model", true, "GGUF file to check (required)"},
    {"json", false, "print the result as one JSON object"},
    {"help", false, "show this help"},
};

// At most one progress line a second on stderr, so a large file shows life
// and a small one prints none.
struct progress_lines {
  std::chrono::steady_clock::time_point last = std::chrono::steady_clock::now();
  void operator()(std::uint64_t done, std::uint64_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last < std::chrono::seconds(1) || done >= total) return;
    last = now;
    std::fprintf(stderr, "check-model: read %.0f of %.0f MB (%.0f %%)\n", done / 1e6, total / 1e6,
                 total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0);
  }
};

}  // namespace

int cmd_check_model(int argc, char** argv) {
  auto a = args::parse(argc, argv, 2, check_model_flags);
  if (!a) return fail("check-model", a.error());
  if (a->has("help")) {
    std::printf("usage: exaserve check-model --model FILE [--json]\n"
                "Loads FILE as a replica would, then reads every value of every tensor as the engine\n"
                "sees it (dequantized) and reports NaN or infinite ones by tensor, row and column.\n"
                "Exit status 0: loadable and every value finite; 1: not loadable, or non-finite values.\n%s",
                describe_flags(check_model_flags).c_str());
    return 0;
  }
  const auto path = a->get("model");
  if (!path) return fail("check-model", {errc::invalid_argument, "--model FILE is required"});
  auto m = model::llama_model::load(*path);
  if (!m) {  // not loadable is 1, whatever the loader's code (a bad shape is invalid_argument, not usage)
    fail("check-model", m.error());
    return 1;
  }
  progress_lines progress;
  const model::value_scan scan = model::scan_values((*m)->file(), std::ref(progress));

  std::uint64_t bad_tensors = 0;
  const model::tensor_values* largest = nullptr;
  for (const auto& t : scan.read) {
    bad_tensors += t.nonfinite > 0 ? 1 : 0;
    if (largest == nullptr || t.max_abs > largest->max_abs) largest = &t;
  }
  const std::uint64_t bad = scan.nonfinite();
  if (a->has("json")) {
    std::string tensors;
    for (const auto& t : scan.read) {
      if (t.nonfinite == 0) continue;
      tensors += fmt::format(
          "{}{{\"tensor\":{},\"nonfinite\":{},\"first_row\":{},\"first_col\":{},\"nonfinite_blocks\":{},"
          "\"block_values\":{}}}",
          tensors.empty() ? "" : ",", json_string(t.name), t.nonfinite, t.first_row, t.first_col, t.nonfinite_blocks,
          t.block_values);
    }
    std::printf("{\"model\":%s,\"tensors\":%llu,\"values\":%llu,\"bytes\":%llu,\"nonfinite\":%llu,"
                "\"nonfinite_tensors\":[%s],\"max_abs\":%.9g,\"max_abs_tensor\":%s,\"skipped\":%zu}\n",
                json_string(*path).c_str(), static_cast<unsigned long long>(scan.tensors),
                static_cast<unsigned long long>(scan.values), static_cast<unsigned long long>(scan.bytes),
                static_cast<unsigned long long>(bad), tensors.c_str(), largest ? largest->max_abs : 0.0,
                json_string(largest ? largest->name : "").c_str(), scan.skipped.size());
    return bad == 0 ? 0 : 1;
  }
  std::printf("%s: %llu tensors, %llu values, %.1f MB read\n", path->c_str(),
              static_cast<unsigned long long>(scan.tensors), static_cast<unsigned long long>(scan.values),
              scan.bytes / 1e6);
  for (const auto& name : scan.skipped) std::printf("  %s: a type the engine does not read, not checked\n", name.c_str());
  for (const auto& t : scan.read) {
    if (t.nonfinite == 0) continue;
    // A quantized block's values are integers times its f16 scale (and
    // minus its f16 min, in the types that have one): only those fields can
    // be what is not finite.
    std::string blocks;
    if (t.block_values > 1) {
      blocks = fmt::format(" in {} block{} ({} values each: {})", t.nonfinite_blocks,
                           t.nonfinite_blocks == 1 ? "" : "s", t.block_values,
                           t.block_min ? "their f16 scale or min" : "their f16 scale");
    }
    std::printf("  %s: %llu of %llu values NaN or infinite%s, the first at row %llu, column %llu\n", t.name.c_str(),
                static_cast<unsigned long long>(t.nonfinite), static_cast<unsigned long long>(t.values),
                blocks.c_str(), static_cast<unsigned long long>(t.first_row),
                static_cast<unsigned long long>(t.first_col));
  }
  if (largest != nullptr)
    std::printf("largest finite magnitude: %.6g (%s)\n", largest->max_abs, largest->name.c_str());
  if (bad == 0) {
    std::printf("OK: every value is finite\n");
    return 0;
  }
  std::printf("FAIL: %llu non-finite value%s in %llu tensor%s; the engine stops the requests they reach "
              "(finish_reason nonfinite_logits)\n",
              static_cast<unsigned long long>(bad), bad == 1 ? "" : "s", static_cast<unsigned long long>(bad_tensors),
              bad_tensors == 1 ? "" : "s");
  return 1;
}

}  // namespace exa::app
