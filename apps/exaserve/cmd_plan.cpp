// exaserve plan: the memory ledger of one replica of a model on a device, how
// many replicas fit a device and a node, and whether tensor parallelism is
// needed. The numbers come from runtime/cluster (docs/PLANNING.md).

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include "args.hpp"
#include "cli_util.hpp"
#include "cluster/hardware.hpp"
#include "cluster/ledger.hpp"
#include "cluster/model_shape.hpp"
#include "commands.hpp"
#include "model/llama_model.hpp"

namespace exa::app {
namespace {

using namespace exa::cluster;

const std::vector<flag_spec> flags = {
    {"model", true, "model preset (llama-2-7b, llama-2-13b, llama-2-70b, llama-3-8b, llama-3-70b, tiny, small) "
                    "or a GGUF file (required)"},
    {"gpu", true, "device preset: a100-80gb, h100-80gb (default), h200-141gb, cpu (needs --gpu-memory-gb)"},
    {"precision", true, "weights: fp32, fp16 (presets' default), bf16, int8 (Q8_0), int4 (Q4_0); a file's own "
                        "types unless given"},
    {"seq-len", true, "tokens of KV cache per sequence (default: the model's context length)"},
    {"batch", true, "concurrent sequences per replica (default 1)"},
    {"gpus-per-node", true, "devices per node (default 8)"},
    {"tp", true, "tensor parallelism 1, 2, 4 or 8 (default: the smallest that fits)"},
    {"gpu-memory-gb", true, "device memory in GiB (2^30 bytes): overrides the preset; required for cpu"},
    {"json", false, "print one JSON object instead of text"},
    {"help", false, "show this help"},
};

// Tokens one engine step processes: a 2048-token prefill chunk (or the whole
// KV budget if smaller), never fewer than one decode token per sequence.
constexpr std::uint64_t default_batch_tokens = 2048;

struct plan_input {
  model_shape model;
  device_spec device;
  std::uint64_t seq_len = 0;
  std::uint32_t batch = 1;
  std::uint32_t gpus_per_node = 8;
  std::optional<std::uint32_t> tp;
};

struct plan_result {
  replica_config config;
  std::optional<std::uint32_t> min_tp;
  memory_breakdown per_device;
  /// One replica's need on a single device (tensor parallel 1).
  std::uint64_t single_device_bytes = 0;
  std::uint64_t shards_per_device = 0;
  std::uint64_t replicas_per_node = 0;
};

std::string with_commas(std::uint64_t n) {
  std::string digits = std::to_string(n), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

expected<model_shape> load_model_shape(const std::string& what, std::optional<precision> p) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(what, ec)) {
    auto m = model::llama_model::load(what);
    if (!m) return std::unexpected(m.error());
    model_shape shape = model_shape_from(**m);
    return p ? with_precision(std::move(shape), *p) : shape;
  }
  auto shape = model_shape_preset(what, p.value_or(precision::fp16));
  if (!shape) {
    std::string valid;
    for (const std::string& n : model_shape_preset_names()) valid += (valid.empty() ? "" : ", ") + n;
    // A usage error (exit 2), like any unknown flag value.
    return make_error(errc::invalid_argument,
                      fmt::format("--model '{}' is neither a file nor a preset (valid presets: {})", what, valid));
  }
  return shape;
}

expected<device_spec> load_device(const args& a) {
  std::optional<std::uint64_t> memory;
  if (a.has("gpu-memory-gb")) {
    auto gb = a.get_double("gpu-memory-gb", 0, 0.001, 1 << 20);
    if (!gb) return std::unexpected(gb.error());
    memory = static_cast<std::uint64_t>(*gb * static_cast<double>(gib_bytes));
  }
  const std::string name = a.get_or("gpu", "h100-80gb");
  auto d = device_preset(name, memory);
  if (!d) return make_error(errc::invalid_argument, "--gpu: " + d.error().message);
  return d;
}

expected<plan_input> read_input(const args& a) {
  std::optional<precision> p;
  if (auto s = a.get("precision")) {
    p = precision_from_string(*s);
    if (!p) return make_error(errc::invalid_argument, "unknown --precision '" + *s + "' (fp32, fp16, bf16, int8, int4)");
  }
  const auto model_arg = a.get("model");
  if (!model_arg) return make_error(errc::invalid_argument, "--model PRESET_OR_FILE is required");
  plan_input in;
  auto shape = load_model_shape(*model_arg, p);
  if (!shape) return std::unexpected(shape.error());
  in.model = std::move(*shape);
  auto device = load_device(a);
  if (!device) return std::unexpected(device.error());
  in.device = std::move(*device);
  auto seq = a.get_int("seq-len", in.model.context_length, 1, 1 << 24);
  auto batch = a.get_int("batch", 1, 1, 1 << 16);
  auto gpus = a.get_int("gpus-per-node", 8, 1, 64);
  for (const auto* v : {&seq, &batch, &gpus}) {
    if (!*v) return std::unexpected(v->error());
  }
  in.seq_len = static_cast<std::uint64_t>(*seq);
  in.batch = static_cast<std::uint32_t>(*batch);
  in.gpus_per_node = static_cast<std::uint32_t>(*gpus);
  if (a.has("tp")) {
    auto tp = a.get_int("tp", 1, 1, max_tensor_parallel);
    if (!tp) return std::unexpected(tp.error());
    if (!valid_tensor_parallel(static_cast<std::uint32_t>(*tp)) || *tp > *gpus) {
      return make_error(errc::invalid_argument,
                        fmt::format("--tp {} must be 1, 2, 4 or 8 and at most --gpus-per-node {}", *tp, *gpus));
    }
    in.tp = static_cast<std::uint32_t>(*tp);
  }
  return in;
}

// The largest TP degree one node offers that also divides the model's heads.
std::uint32_t largest_tp(const model_shape& m, std::uint32_t gpus_per_node) {
  std::uint32_t tp = 1;
  while (tp * 2 <= std::min(gpus_per_node, max_tensor_parallel) && m.n_heads % (tp * 2) == 0) tp *= 2;
  return tp;
}

expected<plan_result> compute(const plan_input& in) {
  plan_result r;
  r.config.kv_tokens = in.seq_len * in.batch;
  r.config.max_batch_sequences = in.batch;
  r.config.max_batch_tokens = static_cast<std::uint32_t>(
      std::min(r.config.kv_tokens, std::max<std::uint64_t>(in.batch, default_batch_tokens)));
  r.config.replica_overhead_bytes = in.device.replica_overhead_bytes;
  auto min_tp = min_tensor_parallel(in.model, r.config, in.device, in.gpus_per_node);
  if (!min_tp) return make_error(errc::invalid_argument, min_tp.error().message);
  r.min_tp = *min_tp;
  replica_config single = r.config;
  single.tensor_parallel = 1;
  auto one = estimate(in.model, single);
  if (!one) return make_error(errc::invalid_argument, one.error().message);
  r.single_device_bytes = one->total_bytes();
  // Nothing fits: show the ledger at the largest TP, the closest to fitting.
  r.config.tensor_parallel = in.tp.value_or(r.min_tp.value_or(largest_tp(in.model, in.gpus_per_node)));
  auto m = estimate(in.model, r.config);
  if (!m) return make_error(errc::invalid_argument, m.error().message);
  r.per_device = *m;
  r.shards_per_device = shards_per_device(r.per_device, in.device);
  r.replicas_per_node = cluster::replicas_per_node(r.shards_per_device, in.gpus_per_node, r.config.tensor_parallel);
  return r;
}

std::uint64_t usable_bytes(const device_spec& d) { return d.memory_bytes - std::min(d.memory_bytes, d.device_reserved_bytes); }


const char* plural(std::uint64_t n, const char* one, const char* many) { return n == 1 ? one : many; }

std::string tp_verdict(const plan_input& in, const plan_result& r) {
  if (r.min_tp == 1u) return fmt::format("not needed: one replica fits one {}", in.device.name);
  if (!r.min_tp) {
    return fmt::format("needed but not enough: one replica needs {}, and even tensor parallel {} over one "
                       "node's {} devices does not fit",
                       format_bytes(r.single_device_bytes), largest_tp(in.model, in.gpus_per_node), in.gpus_per_node);
  }
  return fmt::format("needed: one replica needs {} but one {} has {} usable; smallest TP that fits: {}",
                     format_bytes(r.single_device_bytes), in.device.name, format_bytes(usable_bytes(in.device)),
                     *r.min_tp);
}

void print_text(const plan_input& in, const plan_result& r) {
  const model_shape& m = in.model;
  const std::uint32_t tp = r.config.tensor_parallel;
  std::printf("model        %s: %s parameters, %u layers, dim %u, %u heads, %u KV heads (head dim %u), ff %u, "
              "vocab %u\n",
              m.name.c_str(), with_commas(m.parameter_count()).c_str(), m.n_layers, m.dim, m.n_heads, m.n_kv_heads,
              m.head_dim(), m.ff_dim, m.vocab_size);
  const std::string decimal = m.weight_bytes >= 1'000'000'000
                                  ? fmt::format("{:.2f} GB", static_cast<double>(m.weight_bytes) / 1e9)
                                  : with_commas(m.weight_bytes) + " bytes";
  std::printf("weights      %s: %s (%s)\n", std::string(to_string(m.weight_precision)).c_str(), decimal.c_str(),
              format_bytes(m.weight_bytes).c_str());
  std::printf("device       %s: %s, %s reserved per device, %u per node\n", in.device.name.c_str(),
              format_bytes(in.device.memory_bytes).c_str(), format_bytes(in.device.device_reserved_bytes).c_str(),
              in.gpus_per_node);
  std::printf("workload     batch %u x seq-len %llu = %s KV tokens; KV %s bytes per token (%s)\n", in.batch,
              static_cast<unsigned long long>(in.seq_len), with_commas(r.config.kv_tokens).c_str(),
              with_commas(m.kv_bytes_per_token()).c_str(), format_bytes(m.kv_bytes_per_token()).c_str());
  std::printf("\nledger per device, tensor parallel %u:\n", tp);
  const std::pair<const char*, std::uint64_t> rows[] = {
      {"weights", r.per_device.weights_bytes}, {"kv cache", r.per_device.kv_bytes},
      {"activations", r.per_device.activations_bytes}, {"overhead", r.per_device.overhead_bytes},
      {"total", r.per_device.total_bytes()}};
  for (const auto& [label, bytes] : rows) std::printf("  %-12s %14s\n", label, format_bytes(bytes).c_str());
  std::printf("  %-12s %14s\n", "usable", format_bytes(usable_bytes(in.device)).c_str());
  std::printf("\ntensor parallelism: %s\n", tp_verdict(in, r).c_str());
  if (r.shards_per_device == 0) {
    std::printf("fit: does not fit at tensor parallel %u\n", tp);
  } else if (tp == 1) {
    std::printf("fit: %llu %s per device, %llu per node of %u\n", static_cast<unsigned long long>(r.shards_per_device),
                plural(r.shards_per_device, "replica", "replicas"),
                static_cast<unsigned long long>(r.replicas_per_node), in.gpus_per_node);
  } else {
    std::printf("fit: %llu %s per device, %llu %s of %u devices per node of %u\n",
                static_cast<unsigned long long>(r.shards_per_device), plural(r.shards_per_device, "shard", "shards"),
                static_cast<unsigned long long>(r.replicas_per_node),
                plural(r.replicas_per_node, "replica", "replicas"), tp, in.gpus_per_node);
  }
}

void print_json(const plan_input& in, const plan_result& r) {
  const model_shape& m = in.model;
  const memory_breakdown& b = r.per_device;
  std::string out = fmt::format(
      "{{\"model\":{{\"name\":{},\"parameters\":{},\"precision\":\"{}\",\"weight_bytes\":{},\"layers\":{},"
      "\"dim\":{},\"heads\":{},\"kv_heads\":{},\"head_dim\":{},\"ff_dim\":{},\"vocab_size\":{},"
      "\"context_length\":{},\"kv_bytes_per_token\":{}}},",
      json_string(m.name), m.parameter_count(), to_string(m.weight_precision), m.weight_bytes, m.n_layers, m.dim,
      m.n_heads, m.n_kv_heads, m.head_dim(), m.ff_dim, m.vocab_size, m.context_length, m.kv_bytes_per_token());
  out += fmt::format("\"device\":{{\"name\":{},\"kind\":\"{}\",\"memory_bytes\":{},\"reserved_bytes\":{},"
                     "\"usable_bytes\":{},\"per_node\":{}}},",
                     json_string(in.device.name), to_string(in.device.kind), in.device.memory_bytes,
                     in.device.device_reserved_bytes, usable_bytes(in.device), in.gpus_per_node);
  out += fmt::format("\"workload\":{{\"batch\":{},\"seq_len\":{},\"kv_tokens\":{},\"max_batch_tokens\":{}}},",
                     in.batch, in.seq_len, r.config.kv_tokens, r.config.max_batch_tokens);
  out += fmt::format("\"tensor_parallel\":{},\"min_tensor_parallel\":{},\"needs_tensor_parallel\":{},",
                     r.config.tensor_parallel, r.min_tp ? std::to_string(*r.min_tp) : "null",
                     r.min_tp == 1u ? "false" : "true");
  out += fmt::format("\"per_device\":{{\"weights_bytes\":{},\"kv_bytes\":{},\"activations_bytes\":{},"
                     "\"overhead_bytes\":{},\"total_bytes\":{}}},",
                     b.weights_bytes, b.kv_bytes, b.activations_bytes, b.overhead_bytes, b.total_bytes());
  out += fmt::format("\"fits\":{},\"shards_per_device\":{},\"replicas_per_node\":{}}}\n",
                     r.shards_per_device > 0 ? "true" : "false", r.shards_per_device, r.replicas_per_node);
  std::fputs(out.c_str(), stdout);
}

}  // namespace

int cmd_plan(int argc, char** argv) {
  auto a = args::parse(argc, argv, 2, flags);
  if (!a) return fail("plan", a.error());
  if (a->has("help")) {
    std::printf("usage: exaserve plan --model PRESET_OR_FILE [--gpu PRESET] [--precision P] [--seq-len N] "
                "[--batch B] [--gpus-per-node G] [--tp N] [--gpu-memory-gb X] [--json]\n%s",
                describe_flags(flags).c_str());
    return 0;
  }
  if (!a->positional().empty()) {
    return fail("plan", {errc::invalid_argument, "unexpected argument '" + a->positional().front() + "'"});
  }
  auto in = read_input(*a);
  if (!in) return fail("plan", in.error());
  auto r = compute(*in);
  if (!r) return fail("plan", r.error());
  if (a->has("json")) {
    print_json(*in, *r);
  } else {
    print_text(*in, *r);
  }
  return 0;
}

}  // namespace exa::app
