// fair_yield: a light tenant's time to first token beside a heavy tenant
// flooding one CPU engine, in real time, with and without the engine stopping
// a step at a layer boundary for the light prompt (cpu_engine's
// offer_arrival). What it drives is what a replica does: one thread runs
// steps back to back; requests that arrive while a step runs are submitted
// when it returns, and (with yield) offered to the engine at once, as
// replica_actor does. Three ways, alternated round by round:
//   alone    - the light tenant by itself
//   no-yield - beside the flood, arrivals wait for the step in flight
//   yield    - beside the flood, the step in flight may stop for them
// The flood keeps --flood sequences in flight (a new one as one finishes);
// light requests arrive at seeded exponential intervals. Prints each way's
// light TTFT p50/p99, p99 against alone, the flood's tokens/s and the steps
// that yielded. Usage: bench/fair_yield.sh or fair_yield --help.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "engine/cpu_engine.hpp"
#include "engine/isa.hpp"
#include "engine/thread_pool.hpp"
#include "gpu/cpu_memory_pool.hpp"
#include "model/llama_model.hpp"

namespace {

using namespace exa;
using clock_type = std::chrono::steady_clock;

constexpr const char* usage = R"(usage: fair_yield --model FILE [flags]
  --threads N          engine threads (default 2)
  --flood N            heavy sequences kept in flight (default 16, at most 256)
  --flood-prompt P     heavy prompt tokens (default 128)
  --flood-tokens M     heavy max_tokens (default 64)
  --light-prompt P     light prompt tokens (default 64)
  --light-tokens M     light max_tokens (default 2)
  --light-rate R       light arrivals per second (default 4)
  --light-requests K   light requests per way per round (default 60)
  --rounds N           rounds of the three ways (default 2)
  --seed S             arrival and prompt seed (default 1)
  --verbose            every light request's TTFT, in arrival order
)";

struct options {
  std::string model;
  unsigned threads = 2, flood = 16, flood_prompt = 128, flood_tokens = 64, light_prompt = 64, light_tokens = 2;
  double light_rate = 4;
  unsigned light_requests = 60, rounds = 2;
  std::uint64_t seed = 1;
  bool verbose = false;
};

bool parse(int argc, char** argv, options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--verbose") {
      o.verbose = true;
      continue;
    }
    if (flag == "--help" || flag == "-h") {
      std::fputs(usage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "fair_yield: %s needs a value\n%s", argv[i], usage);
      return false;
    }
    const std::string v = argv[++i];
    try {
      const auto num = [&](unsigned lo, unsigned hi) {
        const unsigned long n = std::stoul(v);
        if (n < lo || n > hi) throw std::out_of_range(v);
        return static_cast<unsigned>(n);
      };
      if (flag == "--model") o.model = v;
      else if (flag == "--threads") o.threads = num(1, 256);
      else if (flag == "--flood") o.flood = num(1, 256);
      else if (flag == "--flood-prompt") o.flood_prompt = num(1, 4096);
      else if (flag == "--flood-tokens") o.flood_tokens = num(1, 4096);
      else if (flag == "--light-prompt") o.light_prompt = num(1, 4096);
      else if (flag == "--light-tokens") o.light_tokens = num(1, 4096);
      else if (flag == "--light-requests") o.light_requests = num(1, 100000);
      else if (flag == "--rounds") o.rounds = num(1, 100);
      else if (flag == "--seed") o.seed = std::stoull(v);
      else if (flag == "--light-rate") {
        o.light_rate = std::stod(v);
        if (!(o.light_rate > 0 && o.light_rate <= 1000)) throw std::out_of_range(v);
      } else {
        std::fprintf(stderr, "fair_yield: unknown flag %s\n%s", argv[i - 1], usage);
        return false;
      }
    } catch (const std::exception&) {
      std::fprintf(stderr, "fair_yield: bad value '%s' for %s\n", v.c_str(), argv[i - 1]);
      return false;
    }
  }
  if (o.model.empty()) {
    std::fprintf(stderr, "fair_yield: --model FILE is required\n%s", usage);
    return false;
  }
  return true;
}

enum class way { alone, no_yield, yield };
const char* name(way w) { return w == way::alone ? "alone" : w == way::no_yield ? "no-yield" : "yield"; }

struct outcome {
  std::vector<double> ttft_ms;  // light requests
  std::uint64_t flood_tokens = 0;
  double seconds = 0;
  std::uint64_t yielded_steps = 0;
};

std::vector<model::token_id> prompt_of(std::size_t n, std::uint32_t vocab, std::mt19937_64& rng) {
  std::vector<model::token_id> p(n);
  for (auto& t : p) t = static_cast<model::token_id>(3 + rng() % (vocab - 3));
  return p;
}

// One way, on a fresh engine: the flood (unless alone) warms up for a
// second, then the light requests arrive; ends when the last one has its
// first token.
outcome run_way(way w, const options& o, const std::shared_ptr<const model::llama_model>& m,
                engine::thread_pool& threads, std::uint64_t seed) {
  const auto& cfg = m->config();
  const std::uint32_t kv_tokens = (o.flood + 4) * (o.flood_prompt + o.flood_tokens + 32) +
                                  8 * (o.light_prompt + o.light_tokens + 32);
  auto pool = gpu::cpu_memory_pool::create(engine::cpu_engine::kv_block_bytes(cfg, 16), kv_tokens / 16 + 1, true);
  if (!pool) {
    std::fprintf(stderr, "fair_yield: %s\n", to_string(pool.error()).c_str());
    std::exit(1);
  }
  engine::cpu_engine_config ec;
  ec.prefix_cache = false;  // every prompt is new anyway; keep the engines alike
  engine::cpu_engine eng(m, **pool, threads, ec);

  std::mt19937_64 rng(seed);
  std::mutex mu;
  std::condition_variable wake;
  std::vector<std::pair<engine::seq_id, clock_type::time_point>> arrived;  // light, not yet submitted
  std::atomic<bool> in_step{false};
  std::atomic<bool> arrivals_done{false};

  // Light arrivals: their own thread, as requests reach a replica's mailbox.
  const std::uint64_t light_base = 1'000'000;
  std::vector<std::vector<model::token_id>> light_prompts;
  for (unsigned i = 0; i < o.light_requests; ++i) light_prompts.push_back(prompt_of(o.light_prompt, cfg.vocab_size, rng));
  std::vector<double> gaps_s;
  std::exponential_distribution<double> gap(o.light_rate);
  for (unsigned i = 0; i < o.light_requests; ++i) gaps_s.push_back(gap(rng));
  const bool flood = w != way::alone;
  std::thread arrivals([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(flood ? 1000 : 100));
    for (unsigned i = 0; i < o.light_requests; ++i) {
      std::this_thread::sleep_for(std::chrono::duration<double>(gaps_s[i]));
      {
        const std::lock_guard lock(mu);
        arrived.emplace_back(light_base + i, clock_type::now());
      }
      if (w == way::yield && in_step.load())
        eng.offer_arrival({light_base + i, "light", 1, engine::request_priority::interactive});
      wake.notify_one();
    }
    arrivals_done = true;
    wake.notify_one();
  });

  outcome out;
  std::map<engine::seq_id, clock_type::time_point> waiting_first;  // light, submitted
  std::uint64_t next_flood = 1;
  unsigned flood_running = 0;
  unsigned light_done = 0;
  const auto start = clock_type::now();
  const auto submit_flood = [&] {
    engine::generation_request r;
    r.id = next_flood++;
    r.prompt = prompt_of(o.flood_prompt, cfg.vocab_size, rng);
    r.max_tokens = o.flood_tokens;
    r.tenant = "heavy";
    if (!eng.submit(std::move(r))) std::exit(1);
    ++flood_running;
  };
  while (light_done < o.light_requests) {
    while (flood && flood_running < o.flood) submit_flood();
    std::vector<std::pair<engine::seq_id, clock_type::time_point>> now_arrived;
    {
      std::unique_lock lock(mu);
      if (eng.idle() && arrived.empty())
        wake.wait_for(lock, std::chrono::milliseconds(50), [&] { return !arrived.empty(); });
      now_arrived.swap(arrived);
    }
    for (auto& [id, at] : now_arrived) {
      engine::generation_request r;
      r.id = id;
      r.prompt = light_prompts[id - light_base];
      r.max_tokens = o.light_tokens;
      r.tenant = "light";
      if (auto ok = eng.submit(std::move(r)); !ok) {
        std::fprintf(stderr, "fair_yield: light submit refused: %s\n", to_string(ok.error()).c_str());
        std::exit(1);
      }
      waiting_first[id] = at;
    }
    if (eng.idle()) continue;
    in_step = true;
    const engine::step_result r = eng.step();
    in_step = false;
    const auto now = clock_type::now();
    for (const auto& t : r.tokens) {
      if (t.id < light_base) {
        ++out.flood_tokens;
        continue;
      }
      if (auto it = waiting_first.find(t.id); it != waiting_first.end()) {
        out.ttft_ms.push_back(std::chrono::duration<double, std::milli>(now - it->second).count());
        waiting_first.erase(it);
        ++light_done;
      }
    }
    for (const auto& f : r.finished)
      if (f.id < light_base) --flood_running;
  }
  out.seconds = std::chrono::duration<double>(clock_type::now() - start).count();
  out.yielded_steps = eng.stats().yielded_steps;
  arrivals.join();
  return out;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t i = std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  if (!parse(argc, argv, o)) return 2;
  auto model = model::llama_model::load(o.model);
  if (!model) {
    std::fprintf(stderr, "fair_yield: %s\n", to_string(model.error()).c_str());
    return 1;
  }
  engine::thread_pool threads(o.threads);
  std::printf("fair_yield: model=%s layers=%u isa=%s threads=%u flood=%u prompts %u/%u tokens %u/%u rate=%.1f/s\n",
              o.model.c_str(), (*model)->config().n_layers, std::string(engine::to_string(engine::active_isa())).c_str(),
              o.threads, o.flood, o.flood_prompt, o.light_prompt, o.flood_tokens, o.light_tokens, o.light_rate);
  std::map<way, outcome> total;
  // Each round's p99 against that round's alone p99: the host's speed may
  // change between rounds, less within one.
  std::map<way, std::vector<double>> round_ratio;
  for (unsigned round = 0; round < o.rounds; ++round) {
    double alone_round = 0;
    for (const way w : {way::alone, way::no_yield, way::yield}) {
      const outcome got = run_way(w, o, *model, threads, o.seed + round);
      const double p99 = percentile(got.ttft_ms, 0.99);
      if (w == way::alone) alone_round = p99;
      round_ratio[w].push_back(p99 / alone_round);
      std::printf("round %u %-8s light ttft p50 %7.1f ms p99 %7.1f ms (%.2fx alone)  flood %7.1f tok/s  yielded steps %llu\n",
                  round, name(w), percentile(got.ttft_ms, 0.5), p99, p99 / alone_round,
                  got.flood_tokens / got.seconds, static_cast<unsigned long long>(got.yielded_steps));
      if (o.verbose) {
        for (const double v : got.ttft_ms) std::printf(" %.0f", v);
        std::printf("\n");
      }
      std::fflush(stdout);
      auto& t = total[w];
      t.ttft_ms.insert(t.ttft_ms.end(), got.ttft_ms.begin(), got.ttft_ms.end());
      t.flood_tokens += got.flood_tokens;
      t.seconds += got.seconds;
      t.yielded_steps += got.yielded_steps;
    }
  }
  const double alone_p99 = percentile(total[way::alone].ttft_ms, 0.99);
  std::printf("\n%-8s %12s %12s %16s %22s %12s %14s\n", "way", "ttft p50 ms", "ttft p99 ms", "p99 / alone p99",
              "median round p99 ratio", "flood tok/s", "yielded steps");
  for (const way w : {way::alone, way::no_yield, way::yield}) {
    const auto& t = total[w];
    std::printf("%-8s %12.1f %12.1f %16.2f %22.2f %12.1f %14llu\n", name(w), percentile(t.ttft_ms, 0.5),
                percentile(t.ttft_ms, 0.99), percentile(t.ttft_ms, 0.99) / alone_p99, percentile(round_ratio[w], 0.5),
                w == way::alone ? 0.0 : t.flood_tokens / t.seconds, static_cast<unsigned long long>(t.yielded_steps));
  }
  return 0;
}
