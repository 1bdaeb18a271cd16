#include "chaos/workload_client.hpp"

#include <nlohmann/json.hpp>

#include "chaos/sse_client.hpp"
#include "engine/cpu_engine.hpp"
#include "engine/null_engine.hpp"
#include "engine/thread_pool.hpp"
#include "gpu/cpu_memory_pool.hpp"
#include "model/llama_model.hpp"

namespace exa::chaos {
namespace {

using json = nlohmann::json;

}  // namespace

expected<std::map<std::string, std::vector<std::int32_t>>> expected_outputs(
    const std::string& model_file, const plan& p, const std::vector<scheduled_request>& requests) {
  auto m = model::llama_model::load(model_file);
  if (!m) return std::unexpected(m.error());
  const auto& tok = (*m)->tokenizer();
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::vector<std::int32_t>> cache;
  auto pool = gpu::cpu_memory_pool::create(engine::cpu_engine::kv_block_bytes((*m)->config(), 16),
                                           ((*m)->config().context_length + 15) / 16);
  if (!pool) return std::unexpected(pool.error());
  engine::thread_pool threads(1);
  std::map<std::string, std::vector<std::int32_t>> out;
  for (const auto& r : requests) {
    if (r.temperature != 0) continue;
    auto key = std::make_pair(r.prompt, r.max_tokens);
    auto it = cache.find(key);
    if (it == cache.end()) {
      auto prompt = tok.encode(workload_prompt(p.workload, r.prompt), true);
      if (!prompt) return std::unexpected(prompt.error());
      std::vector<std::int32_t> tokens;
      if (p.cluster.engine == "null") {
        std::vector<std::int32_t> seq = *prompt;
        for (std::uint32_t i = 0; i < r.max_tokens; ++i) {
          tokens.push_back(engine::null_engine::next_token(seq, (*m)->config().vocab_size));
          seq.push_back(tokens.back());
        }
      } else {
        engine::cpu_engine eng(*m, **pool, threads);
        engine::generation_request g;
        g.prompt = *prompt;
        g.max_tokens = r.max_tokens;
        if (auto ok = eng.submit(g); !ok) return std::unexpected(ok.error());
        while (!eng.idle())
          for (const auto& t : eng.step().tokens) tokens.push_back(t.token);
      }
      it = cache.emplace(key, std::move(tokens)).first;
    }
    out[r.id] = it->second;
  }
  return out;
}

void log_accepted(event_log& log, std::int64_t t, const scheduled_request& r) {
  event e;
  e.t_ns = t;
  e.kind = event_kind::request_accepted;
  e.request_id = r.id;
  e.deployment = workload_deployment;
  e.detail = r.temperature == 0 ? "greedy" : "sampled";
  e.count = r.max_tokens;
  log.append(std::move(e));
}

void log_cleared(event_log& log, pending_clears& clears, std::int64_t now_ns) {
  for (auto it = clears.begin(); it != clears.end();) {
    if (it->first > now_ns) {
      ++it;
      continue;
    }
    event e;
    e.t_ns = now_ns;
    e.kind = event_kind::fault_cleared;
    e.fault_id = it->second;
    log.append(std::move(e));
    it = clears.erase(it);
  }
}

void http_request(std::uint16_t port, const plan& p, const scheduled_request& r, event_log& log,
                  const std::function<std::int64_t()>& now) {
  const json body = {{"model", workload_deployment},      {"prompt", workload_prompt(p.workload, r.prompt)},
                     {"max_tokens", r.max_tokens},     {"temperature", r.temperature},
                     {"seed", r.seed & 0x7fffffffffffffffull}, {"stream", true},
                     {"ignore_eos", true},             {"return_token_ids", true}};
  const std::int64_t start = now();
  log_accepted(log, start, r);
  std::int64_t first = -1;
  std::uint64_t tokens = 0;
  std::string error_code;
  bool saw_done = false;
  auto result = post_sse(
      port, "/v1/completions", body.dump(),
      [&](std::string_view data) {
        if (data == "[DONE]") {
          saw_done = true;
          return;
        }
        const auto j = json::parse(data, nullptr, false);
        if (j.is_discarded()) return;
        if (j.contains("error")) {
          error_code = j["error"].value("code", "error");
          return;
        }
        const auto& choice = j["choices"][0];
        if (!choice.contains("token_ids") || choice["token_ids"].empty()) return;
        event e;
        e.t_ns = now();
        if (first < 0) first = e.t_ns;
        e.kind = event_kind::request_tokens;
        e.request_id = r.id;
        e.index = choice.value("token_index", 0u);
        e.tokens = choice["token_ids"].get<std::vector<std::int32_t>>();
        tokens += e.tokens.size();
        log.append(std::move(e));
      },
      std::chrono::milliseconds(p.cluster.request_deadline_ms + 10000));
  event f;
  f.t_ns = now();
  f.kind = event_kind::request_finished;
  f.request_id = r.id;
  if (!result) {
    f.outcome = "error";
    f.detail = "client: " + result.error().message;
  } else if (result->status != 200) {
    f.outcome = "error";
    const auto j = json::parse(result->body, nullptr, false);
    f.detail = j.is_discarded() ? "http " + std::to_string(result->status) : j["error"].value("code", "error");
  } else if (!error_code.empty() || !saw_done) {
    f.outcome = "error";
    f.detail = error_code.empty() ? "stream ended early" : error_code;
  } else {
    f.outcome = "completed";
  }
  f.count = tokens;
  f.value_ms = first < 0 ? -1.0 : (first - start) / 1e6;
  f.value2_ms = (f.t_ns - start) / 1e6;
  log.append(std::move(f));
}

timeline make_timeline(const plan& p, std::uint64_t seed) {
  timeline t;
  t.faults = schedule(p, seed);
  t.requests = schedule_workload(p, seed);
  const auto& c = p.cluster;
  t.settle_ns = (std::int64_t{c.heartbeat_interval_ms} * c.suspect_after_missed + c.observation_window_ms + 2000) *
                1000000;
  for (const auto& f : t.faults)
    t.last_fault_end_ns = std::max(t.last_fault_end_ns, static_cast<std::int64_t>((f.at_s + f.spec.duration_s) * 1e9));
  return t;
}

}  // namespace exa::chaos
