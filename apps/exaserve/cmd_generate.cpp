// exaserve generate: one completion from a GGUF model on the CPU engine.

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "args.hpp"
#include "cli_util.hpp"
#include "commands.hpp"
#include "common/assert.hpp"
#include "engine/cpu_engine.hpp"
#include "engine/thread_pool.hpp"
#include "engine/tp_engine.hpp"
#include "gpu/cpu_communicator.hpp"
#include "gpu/cpu_memory_pool.hpp"
#include "gpu/cuda_engine.hpp"
#include "gpu/cuda_memory_pool.hpp"
#include "gpu/cuda_tp_engine.hpp"
#include "model/llama_model.hpp"
#include "model/utf8.hpp"

#include <unistd.h>

namespace exa::app {
namespace {

const std::vector<flag_spec> flags = {
    {"model", true, "GGUF file (default: the generated tiny model)"},
    {"prompt", true, "prompt text (BOS is added)"},
    {"prompt-ids", true, "prompt token ids, e.g. 1,2,3 (used exactly as given)"},
    {"max-tokens", true, "tokens to generate (default 64)"},
    {"temperature", true, "0 = greedy (default)"},
    {"top-p", true, "nucleus sampling mass in (0, 1] (default 1)"},
    {"top-k", true, "sample among the k most likely (default 0: off)"},
    {"seed", true, "sampling seed (default 0)"},
    {"threads", true, "worker threads (default: all cores); with --tp, split evenly among the devices"},
    {"tp", true, "tensor-parallel over N devices, each with its own KV pool (CPU: and threads) (default 1)"},
    {"device-kind", true, "cpu (default) or cuda: CUDA GPUs 0..N-1 (--tp N over NCCL; unproven on hardware)"},
    {"draft-model", true, "GGUF draft model for speculative decoding (the model's vocabulary)"},
    {"draft-tokens", true, "tokens the draft proposes per step (default 4, at most 8)"},
    {"ids", false, "print generated token ids (comma-separated) instead of text"},
    {"margins", false, "print one JSON line {ids, margins, top}: each step's top-1 minus top-2 "
                       "logit and the two best ids with their log-probabilities (near-tie checks)"},
    {"ignore-eos", false, "do not stop at end-of-generation tokens (eos, eot, eom, ...)"},
    {"help", false, "show this help"},
};

struct options {
  std::string model_path;
  engine::generation_request request;
  std::size_t threads = 0;
  std::uint32_t tp = 1;
  bool cuda = false;  // --device-kind cuda
  std::string draft_path;  // empty: no speculative decoding
  std::uint32_t draft_tokens = engine::default_draft_tokens;
  bool ids = false;
  bool margins = false;
  bool have_text_prompt = false;
  std::string prompt_text;
};

expected<options> read_options(const args& a) {
  options o;
  if (a.has("prompt") == a.has("prompt-ids"))
    return make_error(errc::invalid_argument, "give exactly one of --prompt TEXT or --prompt-ids 1,2,3");
  if (auto p = a.get("prompt")) {
    o.have_text_prompt = true;
    o.prompt_text = *p;
  } else {
    auto ids = parse_id_list(*a.get("prompt-ids"));
    if (!ids) return std::unexpected(ids.error());
    o.request.prompt = std::move(*ids);
  }
  auto max_tokens = a.get_int("max-tokens", 64, 1, 1 << 20);
  auto temperature = a.get_double("temperature", 0.0, 0.0, engine::max_temperature);
  auto top_p = a.get_double("top-p", 1.0, 1e-6, 1.0);
  auto top_k = a.get_int("top-k", 0, 0, 1 << 22);
  auto seed = a.get_int("seed", 0, 0, INT64_MAX);
  auto threads = a.get_int("threads", 0, 0, 1024);
  auto tp = a.get_int("tp", 1, 1, engine::max_tensor_parallel);
  for (const auto* e : {&max_tokens, &top_k, &seed, &threads, &tp})
    if (!*e) return std::unexpected(e->error());
  for (const auto* e : {&temperature, &top_p})
    if (!*e) return std::unexpected(e->error());
  o.request.max_tokens = static_cast<std::uint32_t>(*max_tokens);
  o.request.sampling = {static_cast<float>(*temperature), static_cast<float>(*top_p),
                        static_cast<std::uint32_t>(*top_k), static_cast<std::uint64_t>(*seed)};
  o.threads = static_cast<std::size_t>(*threads);
  o.tp = static_cast<std::uint32_t>(*tp);
  if (auto kind = a.get("device-kind")) {
    if (*kind != "cpu" && *kind != "cuda")
      return make_error(errc::invalid_argument, "--device-kind must be cpu or cuda, not '" + *kind + "'");
    o.cuda = *kind == "cuda";
  }
  auto draft_tokens = a.get_int("draft-tokens", engine::default_draft_tokens, 1, engine::max_draft_tokens);
  if (!draft_tokens) return std::unexpected(draft_tokens.error());
  o.draft_tokens = static_cast<std::uint32_t>(*draft_tokens);
  if (auto d = a.get("draft-model")) o.draft_path = *d;
  o.ids = a.has("ids");
  o.margins = a.has("margins");
  if (o.margins) {
    // The top two log-probabilities differ by exactly the top two logits'
    // difference (log-softmax subtracts one constant from all logits).
    o.request.logprobs = true;
    o.request.top_logprobs = 2;
  }
  if (auto m = a.get("model")) {
    o.model_path = *m;
  } else {
    auto def = default_model_path();
    if (!def) return std::unexpected(def.error());
    o.model_path = *def;
  }
  return o;
}

// Greedy decisions and how close each was, as JSON for scripts that compare
// runs against llama.cpp (scripts/crosscheck_llamacpp.sh).
class margin_trace {
 public:
  void add(const engine::token_event& t) {
    EXA_ASSERT(t.logprobs && t.logprobs->top_ids.size() >= 2 && t.logprobs->top_logprobs.size() >= 2);
    const auto& lp = *t.logprobs;
    sep(ids_) += std::to_string(t.token);
    sep(margins_) += fmt::format("{}", lp.top_logprobs[0] - lp.top_logprobs[1]);
    sep(top_) += fmt::format("[{},{},{},{}]", lp.top_ids[0], lp.top_logprobs[0], lp.top_ids[1], lp.top_logprobs[1]);
  }
  std::string json() const { return fmt::format(R"({{"ids":[{}],"margins":[{}],"top":[{}]}})", ids_, margins_, top_); }

 private:
  static std::string& sep(std::string& s) { return s.empty() ? s : s += ","; }
  std::string ids_, margins_, top_;
};

// The engine and everything it runs on; members are destroyed in reverse, the
// engine first.
struct engine_rig {
  std::vector<std::unique_ptr<gpu::cpu_memory_pool>> pools;       // one per device
  std::vector<std::unique_ptr<engine::thread_pool>> threads;      // one per device
  std::vector<std::shared_ptr<engine::communicator>> comms;       // with --tp
  std::unique_ptr<engine::inference_engine> engine;
  std::size_t total_threads = 0;
};

// --device-kind cuda: the CUDA engine on GPU 0, or with --tp N one replica
// over GPUs 0..N-1 joined by NCCL. Without the GPUs: unavailable, naming the
// CUDA runtime's reason or the count.
expected<engine_rig> make_cuda_rig(std::shared_ptr<const model::llama_model> model, const options& o,
                                      engine::cpu_engine_config config, std::uint32_t blocks) {
  auto n = gpu::cuda_device_count();
  if (!n) return std::unexpected(n.error());
  if (static_cast<std::uint32_t>(*n) < o.tp)
    return make_error(errc::unavailable, std::to_string(o.tp) + " CUDA devices needed, " + std::to_string(*n) + " present");
  engine_rig rig;
  if (o.tp == 1) {
    gpu::cuda_engine_options co;
    co.engine = config;
    co.own_kv_blocks = blocks;
    auto e = gpu::make_cuda_engine(std::move(model), 0, co);
    if (!e) return std::unexpected(e.error());
    rig.engine = std::move(*e);
    return rig;
  }
  gpu::cuda_tp_options co;
  co.engine = config;
  co.own_kv_blocks = blocks;
  for (std::uint32_t r = 0; r < o.tp; ++r) co.devices.push_back(static_cast<int>(r));
  co.collective_timeout = std::chrono::seconds(60);
  auto e = gpu::make_cuda_tp_engine(std::move(model), co);
  if (!e) return std::unexpected(e.error());
  spdlog::info("event=tensor_parallel devices={} kind=cuda prefix_cache=off", o.tp);
  rig.engine = std::move(e->engine);
  return rig;
}

// One device: the CPU engine. --tp N: N CPU devices (a KV pool and a share of
// the threads each) joined by an in-process communicator group.
expected<engine_rig> make_engine(std::shared_ptr<const model::llama_model> model, const options& o,
                                 engine::cpu_engine_config config, std::uint32_t kv_tokens) {
  constexpr std::uint32_t block_tokens = 16;
  const auto& cfg = model->config();
  const std::uint32_t blocks = (kv_tokens + block_tokens - 1) / block_tokens;
  if (o.cuda) return make_cuda_rig(std::move(model), o, std::move(config), blocks);
  const std::size_t all = o.threads != 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  engine_rig rig;
  const std::size_t block_bytes = o.tp == 1 ? engine::cpu_engine::kv_block_bytes(cfg, block_tokens)
                                            : engine::tp_engine::kv_block_bytes(cfg, block_tokens, o.tp);
  for (std::uint32_t r = 0; r < o.tp; ++r) {
    auto pool = gpu::cpu_memory_pool::create(block_bytes, blocks, true);
    if (!pool) return std::unexpected(pool.error());
    rig.pools.push_back(std::move(*pool));
    rig.threads.push_back(std::make_unique<engine::thread_pool>(std::max<std::size_t>(1, all / o.tp)));
    rig.total_threads += rig.threads.back()->size();
  }
  if (o.tp == 1) {
    rig.engine = std::make_unique<engine::cpu_engine>(model, *rig.pools[0], *rig.threads[0], config);
    return rig;
  }
  // A collective waits for the slowest member's layer; a minute is far past any skew.
  auto group = gpu::make_cpu_group(static_cast<int>(o.tp), std::chrono::seconds(60));
  if (!group) return std::unexpected(group.error());
  std::vector<engine::tp_member> members;
  for (std::uint32_t r = 0; r < o.tp; ++r) {
    rig.comms.push_back(std::move((*group)[r]));
    members.push_back({rig.pools[r].get(), rig.threads[r].get(), rig.comms[r]});
  }
  auto eng = engine::tp_engine::create(model, std::move(members), config);
  if (!eng) return std::unexpected(eng.error());
  spdlog::info("event=tensor_parallel devices={} threads_per_device={} prefix_cache=off", o.tp,
               rig.threads.front()->size());
  rig.engine = std::move(*eng);
  return rig;
}

}  // namespace

int cmd_generate(int argc, char** argv) {
  auto a = args::parse(argc, argv, 2, flags);
  if (!a) return fail("generate", a.error());
  if (a->has("help")) {
    std::printf("usage: exaserve generate --model FILE (--prompt TEXT | --prompt-ids 1,2,3) --max-tokens N\n%s",
                describe_flags(flags).c_str());
    return 0;
  }
  auto o = read_options(*a);
  if (!o) return fail("generate", o.error());
  if (auto ok = init_engine_isa(); !ok) return fail("generate", ok.error());
  // Loading maps the file and binds views into it; pages come in on use.
  const auto load_t0 = std::chrono::steady_clock::now();
  auto model = model::llama_model::load(o->model_path);
  if (!model) return fail("generate", model.error());
  const double load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - load_t0).count();
  const auto& tok = (*model)->tokenizer();
  if (o->have_text_prompt) {
    auto ids = tok.encode(o->prompt_text, /*add_special=*/true);
    if (!ids) return fail("generate", ids.error());
    o->request.prompt = std::move(*ids);
  }
  // Every token llama.cpp treats as end of generation (eos, eot, eom, ...), so
  // a Llama 3 conversation stops at <|eot_id|> as it does behind the API.
  if (!a->has("ignore-eos")) o->request.stop_tokens = tok.eog_ids();

  engine::cpu_engine_config engine_cfg;
  if (!o->draft_path.empty()) {  // speculative decoding
    auto draft = model::llama_model::load(o->draft_path);
    if (!draft) return fail("generate", draft.error());
    if (auto ok = engine::check_draft(**model, **draft, o->draft_tokens); !ok) return fail("generate", ok.error());
    engine_cfg.draft = *draft;
    engine_cfg.draft_tokens = o->draft_tokens;
  }
  const std::size_t total = o->request.prompt.size() + o->request.max_tokens;
  auto rig = make_engine(*model, *o, engine_cfg, static_cast<std::uint32_t>(total));
  if (!rig) return fail("generate", rig.error());
  engine::inference_engine& eng = *rig->engine;
  if (auto ok = eng.submit(o->request); !ok) return fail("generate", ok.error());

  spdlog::info("event=generate_start model={} load_ms={:.1f} prompt_tokens={} max_tokens={} threads={} tp={}",
               o->model_path, load_ms, o->request.prompt.size(), o->request.max_tokens, rig->total_threads, o->tp);
  const auto t0 = std::chrono::steady_clock::now();
  std::string ids_line;
  margin_trace trace;
  std::size_t n = 0;
  // Random or truncated output can be invalid UTF-8, and on a terminal a
  // control byte can garble the screen: repair the one, neutralize the other.
  model::utf8_stream text;
  const bool tty = ::isatty(STDOUT_FILENO) == 1;
  const auto emit = [&](std::string piece) {
    if (tty)
      for (char& ch : piece)
        if ((static_cast<unsigned char>(ch) < 0x20 && ch != '\n' && ch != '\t') || ch == 0x7f) ch = '?';
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  };
  engine::finish_reason reason = engine::finish_reason::length;
  while (!eng.idle()) {
    const auto r = eng.step();
    for (const auto& t : r.tokens) {
      ++n;
      if (o->margins) {
        trace.add(t);
      } else if (o->ids) {
        ids_line += (ids_line.empty() ? "" : ",") + std::to_string(t.token);
      } else {
        emit(text.push(tok.decode_token(t.token)));
      }
    }
    for (const auto& f : r.finished) reason = f.reason;
  }
  // A tensor-parallel group whose collective failed stops the run.
  if (auto fault = eng.fault()) return fail("generate", error{errc::unavailable, *fault});
  if (o->margins) {
    std::printf("%s\n", trace.json().c_str());
  } else if (o->ids) {
    std::printf("%s\n", ids_line.c_str());
  } else {
    emit(text.flush());
    std::printf("\n");
  }
  if (reason == engine::finish_reason::nonfinite_logits)
    return fail("generate", error{errc::internal, engine::nonfinite_logits_message(static_cast<std::uint32_t>(n))});
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("event=generate_done tokens={} finish={} seconds={:.3f} tok_s={:.1f}", n,
               engine::to_string(reason), secs, secs > 0 ? n / secs : 0.0);
  if (!o->draft_path.empty()) {
    const auto st = eng.stats();
    spdlog::info("event=speculation draft={} draft_tokens={} proposed={} accepted={} acceptance={:.3f}",
                 o->draft_path, o->draft_tokens, st.draft_proposed_tokens, st.draft_accepted_tokens,
                 st.draft_proposed_tokens ? double(st.draft_accepted_tokens) / st.draft_proposed_tokens : 0.0);
  }
  return 0;
}

}  // namespace exa::app
