// exaserve bench-engine: prefill and decode throughput of the CPU engine, and
// the machine's memory copy bandwidth measured in the same run, so the
// effective weight bandwidth can be read as a fraction of what the memory
// system delivers right now.

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "args.hpp"
#include "cli_util.hpp"
#include "commands.hpp"
#include "engine/cpu_engine.hpp"
#include "engine/isa.hpp"
#include "engine/thread_pool.hpp"
#include "gpu/cpu_memory_pool.hpp"
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
    {"no-copy-bandwidth", false, "skip the memory copy bandwidth measurement (reported as 0)"},
    {"draft-model", true, "decode with speculative decoding from this draft GGUF (the model's vocabulary)"},
    {"draft-tokens", true, "with --draft-model: tokens the draft proposes per step (default 4, at most 8)"},
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
  engine::thread_pool* threads;
  std::shared_ptr<const model::llama_model> draft;  // speculative decoding when set
  std::uint32_t draft_tokens = engine::default_draft_tokens;
};

expected<double> prefill_tok_s(const bench_env& env, std::uint32_t tokens, int repeat) {
  const auto& cfg = env.model->config();
  tokens = std::min<std::uint32_t>(tokens, cfg.context_length - 1);
  auto pool = gpu::cpu_memory_pool::create(engine::cpu_engine::kv_block_bytes(cfg, 16), tokens / 16 + 2, true);
  if (!pool) return std::unexpected(pool.error());
  double best = 0;
  for (int r = 0; r < repeat; ++r) {
    engine::cpu_engine eng(env.model, **pool, *env.threads, {});
    engine::generation_request req;
    req.id = 1;
    req.prompt = prompt_of(tokens, cfg.vocab_size, r);
    req.max_tokens = 1;
    if (auto ok = eng.submit(req); !ok) return std::unexpected(ok.error());
    const auto t0 = clock_type::now();
    while (!eng.idle()) eng.step();
    best = std::max(best, tokens / seconds_since(t0));
  }
  return best;
}

struct decode_result {
  std::uint32_t batch = 0;
  double tok_s = 0;
  double weight_gbps = 0;
};

expected<decode_result> decode(const bench_env& env, std::uint32_t batch, std::uint32_t prompt, std::uint32_t steps,
                               int repeat) {
  const auto& cfg = env.model->config();
  // A speculating step emits up to draft_tokens + 1 tokens per sequence.
  const std::uint32_t max_tokens = steps * (env.draft ? env.draft_tokens + 1 : 1) + 4;
  const std::uint32_t per_seq_blocks = (prompt + max_tokens + 15) / 16;
  auto pool = gpu::cpu_memory_pool::create(engine::cpu_engine::kv_block_bytes(cfg, 16), batch * per_seq_blocks + batch, true);
  if (!pool) return std::unexpected(pool.error());
  decode_result best{batch, 0, 0};
  for (int r = 0; r < repeat; ++r) {
    engine::cpu_engine_config ec;
    ec.scheduler.max_running = std::max<std::uint32_t>(64, batch);
    ec.draft = env.draft;
    ec.draft_tokens = env.draft_tokens;
    engine::cpu_engine eng(env.model, **pool, *env.threads, ec);
    for (std::uint32_t i = 0; i < batch; ++i) {
      engine::generation_request req;
      req.id = i + 1;
      req.prompt = prompt_of(prompt, cfg.vocab_size, i + r * 1000);
      req.max_tokens = max_tokens;
      if (auto ok = eng.submit(req); !ok) return std::unexpected(ok.error());
    }
    // Prefill every prompt (and the first token), a chunk per step.
    for (std::uint32_t done = 0; done < prompt; done += std::max<std::uint32_t>(ec.scheduler.prefill_chunk, 1))
      eng.step();
    std::uint64_t tokens = 0;
    const auto t0 = clock_type::now();
    for (std::uint32_t s = 0; s < steps; ++s) tokens += eng.step().tokens.size();
    const double secs = seconds_since(t0);
    const double tok_s = tokens / secs;
    if (env.draft && r + 1 == repeat) {
      const auto st = eng.stats();
      spdlog::info("event=bench_speculation batch={} draft_tokens={} proposed={} accepted={} acceptance={:.3f} "
                   "token_acceptance={:.3f}",
                   batch, env.draft_tokens, st.draft_proposed_tokens, st.draft_accepted_tokens,
                   st.draft_proposed_tokens ? double(st.draft_accepted_tokens) / st.draft_proposed_tokens : 0.0,
                   eng.speculation()->stats().token_acceptance());
    }
    if (tok_s > best.tok_s) {
      best.tok_s = tok_s;
      best.weight_gbps = static_cast<double>(env.model->weights().total_bytes()) * steps / secs / 1e9;
    }
  }
  return best;
}

}  // namespace

int cmd_bench_engine(int argc, char** argv) {
  auto a = args::parse(argc, argv, 2, flags);
  if (!a) return fail("bench-engine", a.error());
  if (a->has("help")) {
    std::printf("usage: exaserve bench-engine --model FILE [--threads N] [--json]\n%s", describe_flags(flags).c_str());
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
  bench_env env{*model, &threads};
  if (auto d = a->get("draft-model")) {  // speculative decoding
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
  spdlog::info("event=bench_start model={} threads={} weight_bytes={} isa={} cpu=\"{}\"", *path, threads.size(),
               (*model)->weights().total_bytes(), isa, engine::describe(engine::detect_cpu()));
  const double copy = a->has("no-copy-bandwidth") ? 0.0 : copy_gbps(rep);
  auto prefill = prefill_tok_s(env, static_cast<std::uint32_t>(*prefill_n), rep);
  if (!prefill) return fail("bench-engine", prefill.error());
  std::vector<decode_result> dec;
  for (const auto b : *batches) {
    if (b == 0) return fail("bench-engine", {errc::invalid_argument, "batch sizes must be >= 1"});
    auto d = decode(env, static_cast<std::uint32_t>(b), static_cast<std::uint32_t>(*decode_prompt),
                    static_cast<std::uint32_t>(*steps), rep);
    if (!d) return fail("bench-engine", d.error());
    dec.push_back(*d);
  }

  if (a->has("json")) {
    std::printf("{\"model\":%s,\"isa\":%s,\"threads\":%zu,\"weight_bytes\":%llu,\"copy_gbps\":%.3f,"
                "\"prefill_tok_s\":%.2f,\"decode\":[",
                json_string(*path).c_str(), json_string(std::string(isa)).c_str(), threads.size(),
                static_cast<unsigned long long>((*model)->weights().total_bytes()), copy, *prefill);
    for (std::size_t i = 0; i < dec.size(); ++i)
      std::printf("%s{\"batch\":%u,\"tok_s\":%.2f,\"weight_gbps\":%.3f}", i ? "," : "", dec[i].batch,
                  dec[i].tok_s, dec[i].weight_gbps);
    std::printf("]}\n");
    return 0;
  }
  std::printf("model %s, %zu threads, %.1f MB of weights, %.*s kernels\n", path->c_str(), threads.size(),
              (*model)->weights().total_bytes() / 1e6, static_cast<int>(isa.size()), isa.data());
  std::printf("memory copy bandwidth: %.2f GB/s\nprefill: %.1f tok/s\n", copy, *prefill);
  std::printf("%8s %12s %14s %12s\n", "batch", "decode tok/s", "weights GB/s", "of copy bw");
  for (const auto& d : dec)
    std::printf("%8u %12.1f %14.2f %11.0f%%\n", d.batch, d.tok_s, d.weight_gbps, copy > 0 ? 100 * d.weight_gbps / copy : 0.0);
  return 0;
}

}  // namespace exa::app
