// prefix_replay: replays the Azure conversation trace against a running
// server's Cap'n Proto RPC door as multi-turn conversations, open loop (each
// request at its trace arrival, time-compressed), and reports what prefix
// caching saved and where the requests went.
//
// The conversations are the simulator's (chaos/sim_workload.hpp,
// make_conversations): the first --requests rows of the trace, their token
// counts divided by --token-scale and capped (so they fit a small model's
// context), become turns of conversations of --apps applications with
// --system-tokens system prompts; prompts are sent as token ids
// (segment_prompt_ids), so equal segments are equal ids on the server.
// An answer in the next turn's prompt is the simulator's synthetic segment,
// not what the server generated: only prompt blocks can be reused, as in
// `exaserve sim`.
//
// Per request it records the client's time to first chunk, the server's
// TTFT, prompt and cached tokens (usage), and the replica that finished it.
// "reusable" is what an unbounded cache of every earlier prompt (one
// replica, blocks of --block-tokens, never a prompt's last token) could
// serve: the ceiling for any routing policy.
//
// Used by bench/prefix_replay.sh; its numbers go to docs/PERFORMANCE.md.

#include <capnp/rpc-twoparty.h>
#include <fmt/format.h>
#include <kj/async-io.h>
#include <kj/debug.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "chaos/sim_workload.hpp"
#include "model/prefix_hash.hpp"
#include "rpc_timing.hpp"
#include "schemas/exaserve.capnp.h"

namespace {

using exa::bench::clock_type;

// Bounds on a run (habit 7).
constexpr std::uint32_t requests_max = 100000;
constexpr std::uint32_t tokens_max = 1u << 16;
/// Calls still unanswered this long after the last arrival: the run hangs.
constexpr auto drain_grace = 120 * kj::SECONDS;
/// The trace's span is about an hour; rows past it would be a second copy.
constexpr double trace_span_s = 3600;

constexpr const char* usage = R"(usage: prefix_replay [flags]

Open-loop replay of the Azure conversation trace as multi-turn conversations
over Cap'n Proto RPC (token-id prompts). Reports prompt, cached and reusable
tokens, TTFT percentiles and requests per replica.

  --connect HOST:PORT      server RPC address (default 127.0.0.1:7000)
  --trace FILE             Azure-format CSV (default chaos/traces/azure_llm_2023_conv.csv)
  --requests N             first N rows (default 300, at most 100000)
  --rate-multiplier X      arrivals compressed by X (default 4)
  --token-scale S          prompt and output lengths divided by S (default 4)
  --prompt-max P           prompt tokens at most (default 440)
  --output-max O           output tokens at most (default 16)
  --apps A                 applications, one system prompt each (default 8)
  --system-tokens T        system prompt tokens (default 64)
  --continue-probability Q a row continues an open conversation (default 0.6)
  --open-max K             open conversations remembered (default 64)
  --vocab V                token ids drawn from [3, V) (default 260: tiny)
  --block-tokens B         the server's KV block, for "reusable" (default 16)
  --replicas R             replicas serving (for the mean; default: those seen)
  --model M                deployment (default tiny)
  --seed S                 conversation seed (default 1)
  --json                   one JSON object on stdout instead of the table
)";

struct options {
  std::string host = "127.0.0.1";
  std::uint16_t port = 7000;
  std::string trace = "chaos/traces/azure_llm_2023_conv.csv";
  std::uint32_t requests = 300;
  double rate_multiplier = 4;
  double token_scale = 4;
  std::uint32_t prompt_max = 440;
  std::uint32_t output_max = 16;
  exa::chaos::conversation_spec conv{.apps = 8, .system_prompt_tokens = 64, .continue_probability = 0.6,
                                     .open_max = 64, .turns_max = 16};
  std::uint32_t vocab = 260;
  std::uint32_t block_tokens = 16;
  std::uint32_t replicas = 0;
  std::string model = "tiny";
  std::uint64_t seed = 1;
  bool json = false;
};

std::optional<std::string> parse_options(int argc, char** argv, options& o) {
  auto uint_flag = [](std::string_view name, std::string_view v, std::uint64_t min, std::uint64_t max,
                      auto& dst) -> std::optional<std::string> {
    std::uint64_t n = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (v.empty() || ec != std::errc() || end != v.data() + v.size() || n < min || n > max)
      return fmt::format("--{} must be an integer in [{}, {}], got '{}'", name, min, max, v);
    dst = static_cast<std::remove_reference_t<decltype(dst)>>(n);
    return std::nullopt;
  };
  auto real_flag = [](std::string_view name, std::string_view v, double min, double max,
                      double& dst) -> std::optional<std::string> {
    const std::string s(v);
    char* end = nullptr;
    const double x = std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size() || !(x >= min && x <= max))
      return fmt::format("--{} must be a number in [{}, {}], got '{}'", name, min, max, v);
    dst = x;
    return std::nullopt;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--json") { o.json = true; continue; }
    if (i + 1 >= argc) return fmt::format("unknown flag or missing value: {}", flag);
    const std::string_view v = argv[++i];
    std::optional<std::string> bad;
    if (flag == "--connect") {
      const auto colon = v.rfind(':');
      if (colon == std::string_view::npos) return fmt::format("--connect wants HOST:PORT, got '{}'", v);
      o.host = std::string(v.substr(0, colon));
      bad = uint_flag("connect port", v.substr(colon + 1), 1, 65535, o.port);
    } else if (flag == "--trace") o.trace = std::string(v);
    else if (flag == "--requests") bad = uint_flag("requests", v, 1, requests_max, o.requests);
    else if (flag == "--rate-multiplier") bad = real_flag("rate-multiplier", v, 1e-3, 1e6, o.rate_multiplier);
    else if (flag == "--token-scale") bad = real_flag("token-scale", v, 1, 1e6, o.token_scale);
    else if (flag == "--prompt-max") bad = uint_flag("prompt-max", v, 2, tokens_max, o.prompt_max);
    else if (flag == "--output-max") bad = uint_flag("output-max", v, 1, tokens_max, o.output_max);
    else if (flag == "--apps") bad = uint_flag("apps", v, 1, 1u << 20, o.conv.apps);
    else if (flag == "--system-tokens") bad = uint_flag("system-tokens", v, 0, tokens_max, o.conv.system_prompt_tokens);
    else if (flag == "--continue-probability") bad = real_flag("continue-probability", v, 0, 1, o.conv.continue_probability);
    else if (flag == "--open-max") bad = uint_flag("open-max", v, 1, 1u << 20, o.conv.open_max);
    else if (flag == "--vocab") bad = uint_flag("vocab", v, 4, 1u << 24, o.vocab);
    else if (flag == "--block-tokens") bad = uint_flag("block-tokens", v, 1, 4096, o.block_tokens);
    else if (flag == "--replicas") bad = uint_flag("replicas", v, 1, 4096, o.replicas);
    else if (flag == "--model") o.model = std::string(v);
    else if (flag == "--seed") bad = uint_flag("seed", v, 0, UINT64_MAX, o.seed);
    else return fmt::format("unknown flag {}", flag);
    if (bad) return bad;
  }
  return std::nullopt;
}

/// One request of the replay, and what came back.
struct replay_request {
  double at_s = 0;
  std::vector<std::int32_t> prompt;
  std::uint32_t max_tokens = 0;
  std::uint32_t reusable_tokens = 0;
  // Results.
  bool done = false;
  std::string error;
  std::optional<double> ttft_ms;  // client: sent -> first chunk
  double server_ttft_ms = 0;
  std::uint32_t prompt_tokens = 0, cached_tokens = 0;
  std::string replica;
};

/// The trace's first rows as scaled conversations, with what an unbounded
/// cache could reuse of each prompt.
exa::expected<std::vector<replay_request>> build_workload(const options& o) {
  auto rows = exa::chaos::load_azure_trace(o.trace, o.rate_multiplier, trace_span_s / o.rate_multiplier);
  if (!rows) return std::unexpected(rows.error());
  if (rows->size() > o.requests) rows->resize(o.requests);
  for (auto& r : *rows) {
    auto scaled = [&](std::uint32_t n, std::uint32_t cap, std::uint32_t floor) {
      return std::clamp(static_cast<std::uint32_t>(std::lround(n / o.token_scale)), floor, cap);
    };
    r.prompt_tokens = scaled(r.prompt_tokens, o.prompt_max, 2);
    r.max_tokens = scaled(r.max_tokens, o.output_max, 1);
  }
  exa::chaos::make_conversations(*rows, o.conv, o.seed);
  std::vector<replay_request> out;
  std::unordered_set<std::uint64_t> seen;
  for (const auto& r : *rows) {
    replay_request q;
    q.at_s = r.at_s;
    q.prompt = exa::chaos::segment_prompt_ids(r.segments, o.vocab);
    q.max_tokens = r.max_tokens;
    const auto hashes = exa::model::prefix_block_hashes(q.prompt, o.block_tokens);
    std::size_t hit = 0;
    while (hit < hashes.size() && seen.contains(hashes[hit])) ++hit;
    // The engine computes a prompt's last token again for its logits.
    const std::size_t last_full = (q.prompt.size() - 1) / o.block_tokens;
    q.reusable_tokens = static_cast<std::uint32_t>(std::min(hit, last_full) * o.block_tokens);
    seen.insert(hashes.begin(), hashes.end());
    out.push_back(std::move(q));
  }
  return out;
}

using exa::bench::ms_between;
using exa::bench::request_times;
using exa::bench::sink_impl;

/// Sends every request at its arrival on one connection and waits for all.
void replay(const options& o, std::vector<replay_request>& requests, kj::AsyncIoContext& io) {
  auto address = io.provider->getNetwork().parseAddress(o.host, o.port).wait(io.waitScope);
  auto stream = address->connect().wait(io.waitScope);
  capnp::TwoPartyClient client(*stream);
  auto gateway = client.bootstrap().castAs<exa::rpc::Service>().gatewayRequest().send().wait(io.waitScope).getGateway();
  auto& timer = io.provider->getTimer();
  const auto start = timer.now();
  auto calls = kj::heapArrayBuilder<kj::Promise<void>>(requests.size());
  for (auto& q : requests) {
    const auto at = start + static_cast<std::int64_t>(q.at_s * 1e6) * kj::MICROSECONDS;
    calls.add(timer.atTime(at).then([&q, &gateway, &o] {
      auto times = std::make_shared<request_times>();
      auto req = gateway.generateRequest();
      auto g = req.initRequest();
      g.setModel(o.model);
      auto ids = g.getPrompt().initTokenIds(static_cast<unsigned>(q.prompt.size()));
      for (std::size_t i = 0; i < q.prompt.size(); ++i) ids.set(static_cast<unsigned>(i), q.prompt[i]);
      g.setMaxTokens(q.max_tokens);
      g.setIgnoreEos(true);  // the trace's output length, not where the model would stop
      req.setSink(kj::heap<sink_impl>(times));
      times->start = clock_type::now();
      return req.send().then(
          [&q, times](capnp::Response<exa::rpc::Gateway::GenerateResults> response) {
            const auto r = response.getResult();
            q.done = true;
            if (r.hasError()) {
              q.error = std::string(r.getError().getCode().cStr()) + ": " + r.getError().getMessage().cStr();
              return;
            }
            if (times->first_chunk) q.ttft_ms = ms_between(times->start, *times->first_chunk);
            q.server_ttft_ms = r.getTimings().getTtftMs();
            q.prompt_tokens = r.getUsage().getPromptTokens();
            q.cached_tokens = r.getUsage().getCachedTokens();
            q.replica = r.getReplica();
          },
          [&q](kj::Exception&& e) {
            q.done = true;
            q.error = std::string("exception: ") + e.getDescription().cStr();
          });
    }));
  }
  const double last_s = requests.empty() ? 0 : requests.back().at_s;
  const auto limit = static_cast<std::int64_t>(last_s * 1e6) * kj::MICROSECONDS + drain_grace;
  kj::joinPromises(calls.finish())
      .exclusiveJoin(timer.afterDelay(limit).then(
          []() -> kj::Promise<void> { return KJ_EXCEPTION(FAILED, "calls still in flight after the drain grace"); }))
      .wait(io.waitScope);
}

double rank(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::clamp<std::size_t>(i, 1, v.size()) - 1];
}

void report(const options& o, const std::vector<replay_request>& requests, double wall_s) {
  std::uint64_t prompt = 0, cached = 0, reusable = 0, ok = 0, errors = 0, with_hit = 0;
  std::vector<double> ttft, server_ttft;
  std::map<std::string, std::uint64_t> per_replica;
  std::string first_error;
  for (const auto& q : requests) {
    if (!q.error.empty() || !q.ttft_ms) {
      ++errors;
      if (first_error.empty()) first_error = q.error.empty() ? "no chunk before the result" : q.error;
      continue;
    }
    ++ok;
    prompt += q.prompt_tokens;
    cached += q.cached_tokens;
    reusable += q.reusable_tokens;
    with_hit += q.cached_tokens > 0 ? 1 : 0;
    ttft.push_back(*q.ttft_ms);
    server_ttft.push_back(q.server_ttft_ms);
    ++per_replica[q.replica];
  }
  std::uint64_t busiest = 0;
  for (const auto& [id, n] : per_replica) busiest = std::max(busiest, n);
  const double replicas = o.replicas > 0 ? o.replicas : static_cast<double>(std::max<std::size_t>(1, per_replica.size()));
  const double mean = static_cast<double>(ok) / replicas;
  const double hit_pct = prompt > 0 ? 100.0 * static_cast<double>(cached) / static_cast<double>(prompt) : 0;
  const double reusable_pct = prompt > 0 ? 100.0 * static_cast<double>(reusable) / static_cast<double>(prompt) : 0;
  std::string spread;
  for (const auto& [id, n] : per_replica) spread += fmt::format("{}{}", spread.empty() ? "" : " ", n);
  if (o.json) {
    fmt::print(R"({{"requests":{},"errors":{},"wall_s":{:.1f},"prompt_tokens":{},"cached_tokens":{},)"
               R"("hit_percent":{:.1f},"reusable_tokens":{},"reusable_percent":{:.1f},"prefill_tokens":{},)"
               R"("requests_with_hit":{},"ttft_ms":{{"p50":{:.2f},"p90":{:.2f},"p99":{:.2f}}},)"
               R"("server_ttft_ms":{{"p50":{:.2f},"p99":{:.2f}}},"replicas_seen":{},"requests_per_replica_max":{},)"
               R"("requests_per_replica_mean":{:.1f},"per_replica":"{}"{}}})"
               "\n",
               ok, errors, wall_s, prompt, cached, hit_pct, reusable, reusable_pct, prompt - cached, with_hit,
               rank(ttft, 0.5), rank(ttft, 0.9), rank(ttft, 0.99), rank(server_ttft, 0.5), rank(server_ttft, 0.99),
               per_replica.size(), busiest, mean, spread,
               first_error.empty() ? "" : fmt::format(R"(,"first_error":"{}")", first_error));
    return;
  }
  fmt::print("prefix_replay {}:{}  {} requests ({} errors) in {:.1f} s\n", o.host, o.port, ok, errors, wall_s);
  fmt::print("  prompt tokens {}  cached {} ({:.1f} %)  reusable {} ({:.1f} %)  prefill computed {}\n", prompt,
             cached, hit_pct, reusable, reusable_pct, prompt - cached);
  fmt::print("  ttft ms (client) p50 {:.2f}  p90 {:.2f}  p99 {:.2f}   (server) p50 {:.2f}  p99 {:.2f}\n",
             rank(ttft, 0.5), rank(ttft, 0.9), rank(ttft, 0.99), rank(server_ttft, 0.5), rank(server_ttft, 0.99));
  fmt::print("  requests per replica: {}  max/mean {}/{:.1f} ({:.2f})\n", spread, busiest, mean,
             mean > 0 ? static_cast<double>(busiest) / mean : 0.0);
  if (!first_error.empty()) fmt::print("  first error: {}\n", first_error);
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]) == "--help" || std::string_view(argv[i]) == "-h") {
      std::fputs(usage, stdout);
      return 0;
    }
  if (auto bad = parse_options(argc, argv, o)) {
    std::fprintf(stderr, "prefix_replay: %s\n\n%s", bad->c_str(), usage);
    return 2;
  }
  auto requests = build_workload(o);
  if (!requests) {
    std::fprintf(stderr, "prefix_replay: %s\n", requests.error().message.c_str());
    return 1;
  }
  auto io = kj::setupAsyncIo();
  const auto start = clock_type::now();
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&] { replay(o, *requests, io); })) {
    std::fprintf(stderr, "prefix_replay: %s\n", e->getDescription().cStr());
    return 1;
  }
  report(o, *requests, std::chrono::duration<double>(clock_type::now() - start).count());
  return 0;
}
