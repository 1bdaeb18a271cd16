// exaserve bench-engine: prefill and decode throughput of the CPU engine, and
// the machine's memory copy bandwidth measured in the same run, so the
// effective weight bandwidth can be read as a fraction of what the memory
// system delivers right now; also the roofline (engine/roofline.hpp): the
// compute and read peaks of the active kernels on these threads, each decode
// batch's matrix multiply-adds per second against them, and the tokens/s
// the two peaks allow. With --device cuda, the CUDA engine's, against
// the device's peak memory bandwidth (gpu/cuda_peak.hpp); --check-cpu N also
// compares N greedy tokens of the two engines.

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "args.hpp"
#include "cli_util.hpp"
#include "commands.hpp"
#include "engine/cpu_engine.hpp"
#include "engine/isa.hpp"
#include "engine/kernel_table.hpp"
#include "engine/roofline.hpp"
#include "engine/thread_pool.hpp"
#include "engine/weight_store.hpp"
#include "gpu/cpu_memory_pool.hpp"
#include "gpu/cuda_engine.hpp"
#include "gpu/cuda_peak.hpp"
#include "model/llama_model.hpp"

namespace exa::app {
namespace {

using clock_type = std::chrono::steady_clock;

const std::vector<flag_spec> flags = {
    {"model", true, "GGUF file (required)"},
    {"threads", true, "worker threads (default: all cores)"},
    {"batches", true, "decode batch sizes, comma-separated (default 1,8,32)"},
    {"prefill-tokens", true, "prompt length for the prefill measurement (default 256)"},
    {"decode-steps", true, "timed decode steps per batch size (default 16)"},
    {"decode-prompt", true, "prompt length of each sequence before the timed decode steps (default 8)"},
    {"repeat", true, "repetitions; the best is reported (default 3)"},
    {"no-copy-bandwidth", false,
     "skip the machine measurements: memory copy bandwidth and the roofline peaks (reported as 0)"},
    {"draft-model", true, "decode with speculative decoding from this draft GGUF (the model's vocabulary)"},
    {"draft-tokens", true, "with --draft-model: tokens the draft proposes per step (default 4, at most 8)"},
    {"device", true, "cpu (default) or cuda: the CUDA engine on --cuda-device"},
    {"cuda-device", true, "with --device cuda: the device index (default 0)"},
    {"check-cpu", true, "N: with --device cuda, generate N greedy tokens of one prompt on the CPU engine and the "
                        "CUDA engine and report where they first differ (0: skip, the default)"},
    {"mapped-weights", false,
     "CPU: the kernels read f16, f32 and other unpacked weights from the file's mapping instead of the engine's "
     "own copy in huge pages (the default; q8_0 is packed either way)"},
    {"json", false, "print one JSON object instead of a table"},
    {"help", false, "show this help"},
};

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Bytes copied per second by memcpy over a buffer far larger than the caches.
double copy_gbps(int repeat) {
  const std::size_t n = std::size_t{256} << 20;
  std::vector<char> src(n, 1), dst(n, 0);
  double best = 0;
  for (int i = 0; i < repeat + 1; ++i) {  // the first pass warms the pages
    const auto t0 = clock_type::now();
    std::memcpy(dst.data(), src.data(), n);
    const double s = seconds_since(t0);
    if (i > 0) best = std::max(best, static_cast<double>(n) / s / 1e9);
  }
  return best;
}

std::vector<model::token_id> prompt_of(std::size_t n, std::uint32_t vocab, std::uint64_t salt) {
  std::vector<model::token_id> p(n);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<model::token_id>(3 + (i * 31 + salt * 17) % (vocab - 3));
  return p;
}

struct bench_env {
  std::shared_ptr<const model::llama_model> model;
  engine::thread_pool* threads = nullptr;
  std::shared_ptr<const model::llama_model> draft;  // speculative decoding when set
  std::uint32_t draft_tokens = engine::default_draft_tokens;
  engine::resident_options weights;  // where the CPU engine's forward reads its weights
  bool cuda = false;  // the CUDA engine on cuda_device instead of the CPU engine
  int cuda_device = 0;
};

// An engine with the KV pool it takes blocks from (the pool outlives it).
struct bench_engine {
  std::unique_ptr<engine::block_pool> pool;
  std::unique_ptr<engine::inference_engine> engine;
};

// An engine for `kv_tokens` positions in blocks of 16.
expected<bench_engine> make_engine(const bench_env& env, std::uint32_t kv_tokens, engine::cpu_engine_config ec) {
  const auto& cfg = env.model->config();
  const std::uint32_t blocks = (kv_tokens + 15) / 16 + 1;
  bench_engine b;
  if (env.cuda) {
    gpu::cuda_engine_options o;
    o.engine = ec;
    o.own_kv_blocks = blocks;
    auto e = gpu::make_cuda_engine(env.model, env.cuda_device, o);
    if (!e) return std::unexpected(e.error());
    b.engine = std::move(*e);
    return b;
  }
  auto pool = gpu::cpu_memory_pool::create(engine::cpu_engine::kv_block_bytes(cfg, 16), blocks, true);
  if (!pool) return std::unexpected(pool.error());
  b.pool = std::move(*pool);
  ec.draft = env.draft;
  ec.draft_tokens = env.draft_tokens;
  ec.weights = env.weights;
  b.engine = std::make_unique<engine::cpu_engine>(env.model, *b.pool, *env.threads, ec);
  return b;
}

struct prefill_result {
  double tok_s = 0;
  /// CUDA: the host's mean time to launch a stage of the prefill's steps,
  /// which run stage by stage (they may stop for an arrival); 0 elsewhere.
  double stage_launch_us = 0;
  /// The engine's weight copies (CPU: weight_store.hpp).
  std::uint64_t weight_copy_bytes = 0;
  bool huge_pages = false;
};

expected<prefill_result> prefill_tok_s(const bench_env& env, std::uint32_t tokens, int repeat) {
  const auto& cfg = env.model->config();
  tokens = std::min<std::uint32_t>(tokens, cfg.context_length - 1);
  auto b = make_engine(env, tokens + 16, {});  // one engine for every repetition (the CUDA one uploads weights)
  if (!b) return std::unexpected(b.error());
  engine::inference_engine& eng = *b->engine;
  double best = 0;
  // The stage launches counted from the second repetition on when there is
  // one: the first pays for the first launches of every kernel.
  std::optional<gpu::cuda_engine_counters> warm;
  for (int r = 0; r < repeat; ++r) {
    if (r == 1) warm = gpu::cuda_counters(eng);
    engine::generation_request req;
    req.id = static_cast<engine::seq_id>(r + 1);
    req.prompt = prompt_of(tokens, cfg.vocab_size, r);
    req.max_tokens = 1;
    if (auto ok = eng.submit(req); !ok) return std::unexpected(ok.error());
    const auto t0 = clock_type::now();
    while (!eng.idle()) eng.step();
    if (auto f = eng.fault()) return make_error(errc::unavailable, *f);
    best = std::max(best, tokens / seconds_since(t0));
  }
  const engine::engine_stats stats = eng.stats();
  prefill_result out{best, 0, stats.weight_copy_bytes, stats.weight_huge_pages};
  if (const auto c = gpu::cuda_counters(eng)) {
    const std::uint64_t stages = c->stages_launched - (warm ? warm->stages_launched : 0);
    const double secs = c->stage_launch_s - (warm ? warm->stage_launch_s : 0);
    if (stages > 0) out.stage_launch_us = 1e6 * secs / static_cast<double>(stages);
  }
  return out;
}

struct decode_result {
  std::uint32_t batch = 0;
  double tok_s = 0;
  double weight_gbps = 0;
};

expected<decode_result> decode(const bench_env& env, std::uint32_t batch, std::uint32_t prompt, std::uint32_t steps,
                               int repeat) {
  const auto& cfg = env.model->config();
  engine::cpu_engine_config ec;
  ec.scheduler.max_running = std::max<std::uint32_t>(64, batch);
  // The untimed prefill below: its steps, at most, when the batch's prompts
  // share each step's token budget with the decodes of those done first.
  const std::uint64_t room = ec.scheduler.max_batch_tokens > batch ? ec.scheduler.max_batch_tokens - batch : 1;
  const std::uint64_t prefill_steps = (std::uint64_t{batch} * prompt + room - 1) / room +
                                      prompt / std::max<std::uint32_t>(ec.scheduler.prefill_chunk, 1) + 2;
  // Enough tokens that no sequence finishes before the timed steps end, even
  // one that started decoding at the first prefill step (a speculating step
  // emits up to draft_tokens + 1 a sequence). Within the model's context
  // when the timed steps alone fit (a sequence that started early may then
  // end among them); otherwise submit refuses, naming the context.
  const std::uint64_t per_step = env.draft ? env.draft_tokens + 1 : 1;
  std::uint64_t want = (std::uint64_t{steps} + prefill_steps) * per_step + 4;
  if (const std::uint64_t timed = std::uint64_t{steps} * per_step + 4;
      prompt + want > cfg.context_length && prompt + timed <= cfg.context_length)
    want = cfg.context_length - prompt;
  const auto max_tokens =
      static_cast<std::uint32_t>(std::min<std::uint64_t>(want, std::numeric_limits<std::uint32_t>::max()));
  const std::uint32_t per_seq_blocks = (prompt + max_tokens + 15) / 16;
  auto b = make_engine(env, 16 * (batch * per_seq_blocks + batch), ec);  // reused: the CUDA one uploads weights
  if (!b) return std::unexpected(b.error());
  engine::inference_engine& eng = *b->engine;
  decode_result best{batch, 0, 0};
  for (int r = 0; r < repeat; ++r) {
    for (std::uint32_t i = 0; i < batch; ++i) {
      engine::generation_request req;
      req.id = i + 1 + static_cast<engine::seq_id>(r) * batch;
      req.prompt = prompt_of(prompt, cfg.vocab_size, i + r * 1000);
      req.max_tokens = max_tokens;
      if (auto ok = eng.submit(req); !ok) return std::unexpected(ok.error());
    }
    // Prefill every prompt (and the first token), untimed: until each
    // sequence has its first token. A step's token budget may hold fewer
    // than all the batch's prompt chunks, so long prompts take more steps
    // than prompt / prefill_chunk (bounded: every step prefills something).
    std::set<engine::seq_id> started;
    for (std::uint64_t guard = 0; started.size() < batch && guard < prefill_steps && !eng.fault(); ++guard)
      for (const auto& t : eng.step().tokens) started.insert(t.id);
    if (auto f = eng.fault()) return make_error(errc::unavailable, *f);
    if (started.size() < batch)
      return make_error(errc::internal, "bench-engine: the prompts were not prefilled within the expected steps");
    std::uint64_t tokens = 0;
    const auto t0 = clock_type::now();
    for (std::uint32_t s = 0; s < steps; ++s) tokens += eng.step().tokens.size();
    const double secs = seconds_since(t0);
    const double tok_s = tokens / secs;
    while (!eng.idle()) eng.step();  // the rest of this repetition, untimed
    if (auto f = eng.fault()) return make_error(errc::unavailable, *f);
    if (env.draft && r + 1 == repeat) {
      const auto st = eng.stats();
      spdlog::info("event=bench_speculation batch={} draft_tokens={} proposed={} accepted={} acceptance={:.3f} "
                   "token_acceptance={:.3f}",
                   batch, env.draft_tokens, st.draft_proposed_tokens, st.draft_accepted_tokens,
                   st.draft_proposed_tokens ? double(st.draft_accepted_tokens) / st.draft_proposed_tokens : 0.0,
                   dynamic_cast<const engine::cpu_engine&>(eng).speculation()->stats().token_acceptance());
    }
    if (tok_s > best.tok_s) {
      best.tok_s = tok_s;
      best.weight_gbps = static_cast<double>(env.model->weights().total_bytes()) * steps / secs / 1e9;
    }
  }
  return best;
}

// --check-cpu: `tokens` greedy tokens of one prompt on the CPU engine and the
// CUDA engine. They must agree until the first near-tie (the two sides round
// differently, so a near-tie may go either way); reports where they part.
expected<void> compare_with_cpu(const bench_env& env, std::uint32_t tokens) {
  const auto& cfg = env.model->config();
  engine::generation_request req;
  req.id = 1;
  req.prompt = prompt_of(8, cfg.vocab_size, 7);
  req.max_tokens = std::min<std::uint32_t>(tokens, cfg.context_length - 8);
  req.logprobs = true;
  req.top_logprobs = 2;
  std::vector<engine::token_event> out[2];
  for (int side = 0; side < 2; ++side) {
    bench_env e = env;
    e.cuda = side == 1;
    auto b = make_engine(e, req.max_tokens + 32, {});
    if (!b) return std::unexpected(b.error());
    if (auto ok = b->engine->submit(req); !ok) return ok;
    while (!b->engine->idle())
      for (auto& t : b->engine->step().tokens) out[side].push_back(std::move(t));
    if (auto f = b->engine->fault()) return make_error(errc::unavailable, *f);
  }
  const std::size_t n = std::min(out[0].size(), out[1].size());
  for (std::size_t i = 0; i < n; ++i) {
    const auto& cpu = *out[0][i].logprobs;
    const float margin = cpu.top_logprobs.size() > 1 ? cpu.top_logprobs[0] - cpu.top_logprobs[1] : 1.0f;
    if (out[0][i].token == out[1][i].token) continue;
    if (margin < 1e-3f) {
      std::printf("check-cpu: %zu of %zu greedy tokens identical; then a near-tie (margin %.2g) went another way\n", i,
                  n, margin);
      return {};
    }
    return make_error(errc::internal, "check-cpu: the CUDA engine chose token " + std::to_string(out[1][i].token) +
                                          " where the CPU engine chose " + std::to_string(out[0][i].token) +
                                          " at step " + std::to_string(i) + " (CPU margin " + std::to_string(margin) +
                                          ", not a tie)");
  }
  std::printf("check-cpu: all %zu greedy tokens identical on the CPU and CUDA engines\n", n);
  return {};
}

}  // namespace

int cmd_bench_engine(int argc, char** argv) {
  auto a = args::parse(argc, argv, 2, flags);
  if (!a) return fail("bench-engine", a.error());
  if (a->has("help")) {
    std::printf("usage: exaserve bench-engine --model FILE [--device cpu|cuda] [--threads N] [--json]\n%s", describe_flags(flags).c_str());
    return 0;
  }
  const auto path = a->get("model");
  if (!path) return fail("bench-engine", {errc::invalid_argument, "--model FILE is required"});
  auto threads_n = a->get_int("threads", 0, 0, 1024);
  auto prefill_n = a->get_int("prefill-tokens", 256, 1, 1 << 20);
  auto steps = a->get_int("decode-steps", 16, 1, 1 << 16);
  auto decode_prompt = a->get_int("decode-prompt", 8, 1, 1 << 20);
  auto repeat = a->get_int("repeat", 3, 1, 100);
  for (const auto* e : {&threads_n, &prefill_n, &steps, &decode_prompt, &repeat})
    if (!*e) return fail("bench-engine", e->error());
  auto batches = parse_id_list(a->get_or("batches", "1,8,32"));
  if (!batches) return fail("bench-engine", batches.error());
  auto model = model::llama_model::load(*path);
  if (!model) return fail("bench-engine", model.error());

  engine::thread_pool threads(static_cast<std::size_t>(*threads_n));
  bench_env env;
  env.model = *model;
  env.threads = &threads;
  env.weights.copy_unpacked = !a->has("mapped-weights");
  const std::string device = a->get_or("device", "cpu");
  if (device != "cpu" && device != "cuda")
    return fail("bench-engine", {errc::invalid_argument, "--device must be cpu or cuda, got '" + device + "'"});
  env.cuda = device == "cuda";
  auto cuda_device = a->get_int("cuda-device", 0, 0, 1023);
  auto check_cpu = a->get_int("check-cpu", 0, 0, 4096);
  for (const auto* e : {&cuda_device, &check_cpu})
    if (!*e) return fail("bench-engine", e->error());
  env.cuda_device = static_cast<int>(*cuda_device);
  if (auto d = a->get("draft-model")) {  // speculative decoding
    if (env.cuda) return fail("bench-engine", {errc::unsupported, "the CUDA engine has no speculative decoding yet"});
    auto k = a->get_int("draft-tokens", engine::default_draft_tokens, 1, engine::max_draft_tokens);
    if (!k) return fail("bench-engine", k.error());
    auto draft = model::llama_model::load(*d);
    if (!draft) return fail("bench-engine", draft.error());
    if (auto ok = engine::check_draft(**model, **draft, static_cast<std::uint32_t>(*k)); !ok)
      return fail("bench-engine", ok.error());
    env.draft = *draft;
    env.draft_tokens = static_cast<std::uint32_t>(*k);
  }
  const int rep = static_cast<int>(*repeat);
  const auto isa = engine::to_string(engine::active_isa());
  spdlog::info("event=bench_start model={} device={} threads={} weight_bytes={} isa={} cpu=\"{}\"", *path, device,
               threads.size(), (*model)->weights().total_bytes(), isa, engine::describe(engine::detect_cpu()));
  // What the achieved weight bandwidth is read against: the host's memory
  // copy bandwidth on the CPU, the device's peak on CUDA.
  double reference_gbps = 0;
  engine::machine_peaks peaks;  // CPU only, measured with the copy bandwidth
  std::string reference = "of copy bw";
  std::string device_name = "cpu";
  if (env.cuda) {
    auto peak = gpu::cuda_peak_bandwidth(env.cuda_device);
    if (!peak) return fail("bench-engine", peak.error());
    reference_gbps = peak->bytes_per_s / 1e9;
    reference = "of HBM peak";
    device_name = peak->device_name;
    spdlog::info("event=bench_cuda_device name=\"{}\" peak_gbps={:.0f} peak_source=\"{}\"", peak->device_name,
                 reference_gbps, peak->source);
    if (*check_cpu > 0)
      if (auto ok = compare_with_cpu(env, static_cast<std::uint32_t>(*check_cpu)); !ok) return fail("bench-engine", ok.error());
  } else if (!a->has("no-copy-bandwidth")) {
    reference_gbps = copy_gbps(rep);
    peaks = engine::measure_peaks(threads, engine::active_kernels(), rep);
    spdlog::info("event=bench_peaks isa={} threads={} read_gbps={:.2f} int8_gmacs={:.1f} f32_gmacs={:.1f}", isa,
                 threads.size(), peaks.read_bytes_per_s / 1e9, peaks.int8_macs_per_s / 1e9,
                 peaks.f32_macs_per_s / 1e9);
  }
  // The roofline of this model on those peaks (0 where not measured).
  const auto& weights = (*model)->weights();
  const std::uint64_t macs_per_token = engine::matmul_macs_per_token(weights);
  const std::uint64_t matmul_bytes = engine::matmul_weight_bytes(weights);
  const bool int8 = engine::matmul_is_int8(weights);
  const double mac_peak = int8 ? peaks.int8_macs_per_s : peaks.f32_macs_per_s;
  const auto roof = [&](std::uint32_t batch) {
    return engine::roofline_tok_s(macs_per_token, matmul_bytes, mac_peak, peaks.read_bytes_per_s, batch);
  };
  auto prefill = prefill_tok_s(env, static_cast<std::uint32_t>(*prefill_n), rep);
  if (!prefill) return fail("bench-engine", prefill.error());
  if (!env.cuda)
    spdlog::info("event=bench_weights unpacked={} copy_bytes={} huge_pages={} thp={}",
                 env.weights.copy_unpacked ? "copied" : "mapped", prefill->weight_copy_bytes, prefill->huge_pages,
                 engine::thp_mode());
  std::vector<decode_result> dec;
  for (const auto b : *batches) {
    if (b == 0) return fail("bench-engine", {errc::invalid_argument, "batch sizes must be >= 1"});
    auto d = decode(env, static_cast<std::uint32_t>(b), static_cast<std::uint32_t>(*decode_prompt),
                    static_cast<std::uint32_t>(*steps), rep);
    if (!d) return fail("bench-engine", d.error());
    dec.push_back(*d);
  }

  // Each batch's aggregate tokens/s over batch 1's (issue 10's batch-32
  // target is 10x), when batch 1 was measured; 0 when not.
  double batch1_tok_s = 0;
  for (const auto& d : dec)
    if (d.batch == 1) batch1_tok_s = d.tok_s;
  const auto vs_batch1 = [&](const decode_result& d) { return batch1_tok_s > 0 ? d.tok_s / batch1_tok_s : 0.0; };

  if (a->has("json")) {
    std::printf("{\"model\":%s,\"device\":%s,\"isa\":%s,\"threads\":%zu,\"weight_bytes\":%llu,\"%s\":%.3f,"
                "\"prefill_tok_s\":%.2f,\"stage_launch_us\":%.2f,\"weight_copy_bytes\":%llu,\"huge_pages\":%s,"
                "\"decode\":[",
                json_string(*path).c_str(), json_string(device_name).c_str(), json_string(std::string(isa)).c_str(),
                threads.size(), static_cast<unsigned long long>((*model)->weights().total_bytes()),
                env.cuda ? "peak_gbps" : "copy_gbps", reference_gbps, prefill->tok_s, prefill->stage_launch_us,
                static_cast<unsigned long long>(prefill->weight_copy_bytes), prefill->huge_pages ? "true" : "false");
    for (std::size_t i = 0; i < dec.size(); ++i)
      std::printf("%s{\"batch\":%u,\"tok_s\":%.2f,\"weight_gbps\":%.3f,\"matmul_gmacs\":%.2f,"
                  "\"roofline_tok_s\":%.1f,\"vs_batch1\":%.2f}",
                  i ? "," : "", dec[i].batch, dec[i].tok_s, dec[i].weight_gbps,
                  dec[i].tok_s * static_cast<double>(macs_per_token) / 1e9, roof(dec[i].batch), vs_batch1(dec[i]));
    std::printf("],\"roofline\":{\"matmul_macs_per_token\":%llu,\"matmul_bytes\":%llu,\"peak\":\"%s\","
                "\"peak_gmacs\":%.2f,\"int8_gmacs\":%.2f,\"f32_gmacs\":%.2f,\"read_gbps\":%.3f}}\n",
                static_cast<unsigned long long>(macs_per_token), static_cast<unsigned long long>(matmul_bytes),
                int8 ? "int8" : "f32", mac_peak / 1e9, peaks.int8_macs_per_s / 1e9, peaks.f32_macs_per_s / 1e9,
                peaks.read_bytes_per_s / 1e9);
    return 0;
  }
  if (env.cuda)
    std::printf("model %s, CUDA engine on %s, %.1f MB of weights\npeak memory bandwidth: %.0f GB/s\n", path->c_str(),
                device_name.c_str(), (*model)->weights().total_bytes() / 1e6, reference_gbps);
  else
    std::printf("model %s, %zu threads, %.1f MB of weights, %.*s kernels\nmemory copy bandwidth: %.2f GB/s\n",
                path->c_str(), threads.size(), (*model)->weights().total_bytes() / 1e6, static_cast<int>(isa.size()),
                isa.data(), reference_gbps);
  if (mac_peak > 0)
    std::printf("roofline (%.*s kernels, %zu threads): read %.2f GB/s, %s multiply-adds %.1f G/s; "
                "%.1f M multiply-adds and %.1f MB of matrices per token\n",
                static_cast<int>(isa.size()), isa.data(), threads.size(), peaks.read_bytes_per_s / 1e9, int8 ? "int8" : "f32", mac_peak / 1e9,
                static_cast<double>(macs_per_token) / 1e6, static_cast<double>(matmul_bytes) / 1e6);
  if (!env.cuda)
    std::printf("weights: %.1f MB copied or packed by the engine (%s); unpacked types %s\n",
                static_cast<double>(prefill->weight_copy_bytes) / 1e6,
                prefill->huge_pages ? "huge pages" : "4 KiB pages",
                env.weights.copy_unpacked ? "copied" : "read from the file's mapping");
  std::printf("prefill: %.1f tok/s\n", prefill->tok_s);
  if (prefill->stage_launch_us > 0)
    std::printf("stage launch: %.1f us a stage (the host's time in the prefill's stage-by-stage steps; decode steps "
                "stop from their stages' launch time on)\n",
                prefill->stage_launch_us);
  std::printf("%8s %12s %14s %12s %10s %8s %12s %9s\n", "batch", "decode tok/s", "weights GB/s", reference.c_str(),
              "GMAC/s", "of peak", "roof tok/s", "vs b1");
  for (const auto& d : dec) {
    const double gmacs = d.tok_s * static_cast<double>(macs_per_token) / 1e9;
    const std::string ratio = batch1_tok_s > 0 ? fmt::format("{:.2f}x", vs_batch1(d)) : "-";
    std::printf("%8u %12.1f %14.2f %11.0f%% %10.1f %7.0f%% %12.1f %9s\n", d.batch, d.tok_s, d.weight_gbps,
                reference_gbps > 0 ? 100 * d.weight_gbps / reference_gbps : 0.0, gmacs,
                mac_peak > 0 ? 100 * gmacs * 1e9 / mac_peak : 0.0, roof(d.batch), ratio.c_str());
  }
  return 0;
}

}  // namespace exa::app
