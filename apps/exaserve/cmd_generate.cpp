// exaserve generate: one completion from a GGUF model on the CPU engine.

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "args.hpp"
#include "cli_util.hpp"
#include "commands.hpp"
#include "common/assert.hpp"
#include "engine/cpu_engine.hpp"
#include "engine/thread_pool.hpp"
#include "gpu/cpu_memory_pool.hpp"
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
    {"threads", true, "worker threads (default: all cores)"},
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
  for (const auto* e : {&max_tokens, &top_k, &seed, &threads})
    if (!*e) return std::unexpected(e->error());
  for (const auto* e : {&temperature, &top_p})
    if (!*e) return std::unexpected(e->error());
  o.request.max_tokens = static_cast<std::uint32_t>(*max_tokens);
  o.request.sampling = {static_cast<float>(*temperature), static_cast<float>(*top_p),
                        static_cast<std::uint32_t>(*top_k), static_cast<std::uint64_t>(*seed)};
  o.threads = static_cast<std::size_t>(*threads);
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

  const auto& cfg = (*model)->config();
  constexpr std::uint32_t block_tokens = 16;
  const std::size_t total = o->request.prompt.size() + o->request.max_tokens;
  const auto blocks = static_cast<std::uint32_t>((total + block_tokens - 1) / block_tokens);
  auto pool = gpu::cpu_memory_pool::create(engine::cpu_engine::kv_block_bytes(cfg, block_tokens), blocks, true);
  if (!pool) return fail("generate", pool.error());
  engine::thread_pool threads(o->threads);
  engine::cpu_engine_config engine_cfg;
  if (!o->draft_path.empty()) {  // speculative decoding
    auto draft = model::llama_model::load(o->draft_path);
    if (!draft) return fail("generate", draft.error());
    if (auto ok = engine::check_draft(**model, **draft, o->draft_tokens); !ok) return fail("generate", ok.error());
    engine_cfg.draft = *draft;
    engine_cfg.draft_tokens = o->draft_tokens;
  }
  engine::cpu_engine eng(*model, **pool, threads, engine_cfg);
  if (auto ok = eng.submit(o->request); !ok) return fail("generate", ok.error());

  spdlog::info("event=generate_start model={} load_ms={:.1f} prompt_tokens={} max_tokens={} threads={}",
               o->model_path, load_ms, o->request.prompt.size(), o->request.max_tokens, threads.size());
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
  if (o->margins) {
    std::printf("%s\n", trace.json().c_str());
  } else if (o->ids) {
    std::printf("%s\n", ids_line.c_str());
  } else {
    emit(text.flush());
    std::printf("\n");
  }
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
