// rpc_loadgen: a load generator for the Cap'n Proto RPC front door. Closed
// loop (default): it keeps `concurrency` generate() calls in flight on one KJ
// event loop (a new call starts the moment one finishes). Open loop
// (--rate): calls arrive as a seeded Poisson process whatever the server's
// pace, at most `concurrency` in flight (an arrival past that is counted as
// skipped, never queued). It records per request the time to the first
// TokenSink chunk and to the call's return, from the moment the call was due.
// Percentiles are exact (nearest rank over every recorded sample), not
// histogram buckets.
//
// Used by scripts/bench_serve.sh and bench/fair_cluster.sh; its numbers go to
// docs/PERFORMANCE.md.

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
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "rpc_timing.hpp"
#include "schemas/exaserve.capnp.h"

namespace {

using exa::bench::clock_type;

/// The server refuses more generate calls than this in flight on one door
/// (apps/frontdoor/rpc_service.hpp); asking for more measures refusals.
constexpr std::uint32_t concurrency_max = 4096;
constexpr std::uint32_t connections_max = 256;
constexpr std::uint32_t duration_s_max = 3600;
constexpr std::uint32_t max_tokens_max = 16384;
constexpr std::uint32_t deadline_ms_max = 86400000;
constexpr double rate_max = 100000;
/// After the measured window, calls still in flight get this long to finish
/// before the run is declared hung.
constexpr auto drain_grace = 10 * kj::SECONDS;

constexpr const char* usage = R"(usage: rpc_loadgen [flags]

Load over Cap'n Proto RPC. Closed loop (default): --concurrency calls in
flight, each replaced by a new one as soon as it returns. Open loop (--rate):
calls arrive as a Poisson process of that rate, at most --concurrency in
flight (arrivals past it are counted as skipped). Measures time to first
token (first TokenSink chunk) and end-to-end latency per request.

  --connect HOST:PORT   server RPC address (default 127.0.0.1:7000)
  --concurrency C       calls in flight (default 1, at most 4096); with
                        --rate, the most in flight
  --rate R              open loop: R calls per second on average (Poisson)
  --seed S              random seed of the arrivals and prompt tags (default 1)
  --api-key KEY         the key the server wants (default: $EXASERVE_API_KEY)
  --priority P          interactive (default) or batch
  --unique-prompts      start each prompt with a tag of its own (seeded), so
                        no two share a prefix-cache block
  --connections K       TCP connections the calls are spread over (default 1)
  --duration-s S        measured seconds (default 10)
  --warmup-s W          seconds run before measuring, not recorded (default 2)
  --max-tokens N        tokens per request (default 1)
  --model M             deployment name (default tiny)
  --prompt TEXT         prompt text (default "Hello")
  --ignore-eos          keep generating past end-of-sequence
  --deadline-ms D       per-request deadline sent to the server (default 0:
                        the server's default)
  --json                one JSON object on stdout instead of the table
  --samples FILE        also write every sampled call (due at s, ttft ms, e2e
                        ms), one per line, in completion order
)";

struct options {
  std::string host = "127.0.0.1";
  std::uint16_t port = 7000;
  std::uint32_t concurrency = 1;
  std::uint32_t connections = 1;
  std::uint32_t duration_s = 10;
  std::uint32_t warmup_s = 2;
  std::uint32_t max_tokens = 1;
  std::string model = "tiny";
  std::string prompt = "Hello";
  std::uint32_t deadline_ms = 0;
  bool ignore_eos = false;
  bool json = false;
  double rate = 0;  // 0: closed loop
  std::uint64_t seed = 1;
  std::string api_key;
  bool batch = false;
  bool unique_prompts = false;
  std::string samples_file;
};

std::optional<std::uint64_t> parse_uint(std::string_view v, std::uint64_t min, std::uint64_t max) {
  std::uint64_t out = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size() || out < min || out > max) return std::nullopt;
  return out;
}

/// Parses argv into `out`; returns an error message for a bad command line.
std::optional<std::string> parse_options(int argc, char** argv, options& out) {
  auto uint_flag = [](std::string_view name, std::string_view v, std::uint64_t min, std::uint64_t max,
                      auto& dst) -> std::optional<std::string> {
    auto n = parse_uint(v, min, max);
    if (!n) return fmt::format("--{} must be an integer in [{}, {}], got '{}'", name, min, max, v);
    dst = static_cast<std::remove_reference_t<decltype(dst)>>(*n);
    return std::nullopt;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--json") { out.json = true; continue; }
    if (flag == "--ignore-eos") { out.ignore_eos = true; continue; }
    if (flag == "--unique-prompts") { out.unique_prompts = true; continue; }
    if (i + 1 >= argc) return fmt::format("unknown flag or missing value: {}", flag);
    const std::string_view v = argv[++i];
    std::optional<std::string> bad;
    if (flag == "--connect") {
      const auto colon = v.rfind(':');
      if (colon == std::string_view::npos) return fmt::format("--connect wants HOST:PORT, got '{}'", v);
      out.host = std::string(v.substr(0, colon));
      bad = uint_flag("connect port", v.substr(colon + 1), 1, 65535, out.port);
    } else if (flag == "--concurrency") bad = uint_flag("concurrency", v, 1, concurrency_max, out.concurrency);
    else if (flag == "--connections") bad = uint_flag("connections", v, 1, connections_max, out.connections);
    else if (flag == "--duration-s") bad = uint_flag("duration-s", v, 1, duration_s_max, out.duration_s);
    else if (flag == "--warmup-s") bad = uint_flag("warmup-s", v, 0, duration_s_max, out.warmup_s);
    else if (flag == "--max-tokens") bad = uint_flag("max-tokens", v, 1, max_tokens_max, out.max_tokens);
    else if (flag == "--deadline-ms") bad = uint_flag("deadline-ms", v, 0, deadline_ms_max, out.deadline_ms);
    else if (flag == "--seed") bad = uint_flag("seed", v, 0, UINT64_MAX, out.seed);
    else if (flag == "--rate") {
      std::string text(v);
      char* end = nullptr;
      const double r = std::strtod(text.c_str(), &end);
      if (text.empty() || end != text.c_str() + text.size() || !(r > 0) || r > rate_max)
        return fmt::format("--rate must be a number of calls per second in (0, {}], got '{}'", rate_max, v);
      out.rate = r;
    } else if (flag == "--api-key") out.api_key = std::string(v);
    else if (flag == "--samples") out.samples_file = std::string(v);
    else if (flag == "--priority") {
      if (v != "interactive" && v != "batch") return fmt::format("--priority must be interactive or batch, got '{}'", v);
      out.batch = v == "batch";
    } else if (flag == "--model") out.model = std::string(v);
    else if (flag == "--prompt") out.prompt = std::string(v);
    else return fmt::format("unknown flag {}", flag);
    if (bad) return bad;
  }
  out.connections = std::min(out.connections, out.concurrency);
  if (out.api_key.empty())
    if (const char* k = std::getenv("EXASERVE_API_KEY")) out.api_key = k;
  return std::nullopt;
}

using exa::bench::ms_between;
using exa::bench::request_times;
using exa::bench::sink_impl;

struct percentiles {
  double p50 = 0, p90 = 0, p99 = 0, max = 0, mean = 0;
};

/// Nearest-rank percentiles: the value below which p of the samples lie,
/// taken from the samples themselves (no interpolation, no buckets).
percentiles summarize(std::vector<double> samples) {
  percentiles out;
  if (samples.empty()) return out;
  std::sort(samples.begin(), samples.end());
  auto rank = [&](double p) {
    const auto i = static_cast<std::size_t>(std::ceil(p * static_cast<double>(samples.size())));
    return samples[std::clamp<std::size_t>(i, 1, samples.size()) - 1];
  };
  out.p50 = rank(0.50);
  out.p90 = rank(0.90);
  out.p99 = rank(0.99);
  out.max = samples.back();
  double sum = 0;
  for (double s : samples) sum += s;
  out.mean = sum / static_cast<double>(samples.size());
  return out;
}

struct results {
  std::vector<double> ttft_ms, e2e_ms, server_ttft_ms;
  std::vector<double> start_s;  // when each sampled call was due, seconds into the measured window
  std::uint64_t completed_in_window = 0;
  std::uint64_t errors = 0;
  std::uint64_t skipped = 0;  // open loop: arrivals while --concurrency calls were in flight
  std::map<std::string, std::uint64_t> errors_by_code;
  std::string first_error;
};

class loadgen {
 public:
  loadgen(const options& o, kj::AsyncIoContext& io) : opts_(o), io_(io) {}

  /// Connects, runs warm-up and the measured window, and waits for the calls
  /// still in flight. Throws (a kj::Exception) if the server cannot be
  /// reached or the run hangs.
  void run() {
    connect();
    const auto now = clock_type::now();
    measure_start_ = now + std::chrono::seconds(opts_.warmup_s);
    measure_end_ = measure_start_ + std::chrono::seconds(opts_.duration_s);
    const auto limit = (opts_.warmup_s + opts_.duration_s) * kj::SECONDS + drain_grace;
    auto work = opts_.rate > 0 ? open_loop(now) : closed_loop();
    auto all = work.exclusiveJoin(
        io_.provider->getTimer().afterDelay(limit).then(
            []() -> kj::Promise<void> { return KJ_EXCEPTION(FAILED, "calls still in flight after the drain grace"); }));
    all.wait(io_.waitScope);
  }

  const results& result() const { return results_; }

 private:
  void connect() {
    auto& network = io_.provider->getNetwork();
    for (std::uint32_t i = 0; i < opts_.connections; ++i) {
      auto address = network.parseAddress(opts_.host, opts_.port).wait(io_.waitScope);
      auto stream = address->connect().wait(io_.waitScope);
      auto client = kj::heap<capnp::TwoPartyClient>(*stream);
      auto service = client->bootstrap().castAs<exa::rpc::Service>();
      // Waiting for the Gateway here keeps connection setup out of the
      // first requests' latency.
      auto greq = service.gatewayRequest();
      if (!opts_.api_key.empty()) greq.setApiKey(opts_.api_key);
      auto gateway = greq.send().wait(io_.waitScope).getGateway();
      gateways_.push_back(kj::mv(gateway));
      clients_.push_back(kj::mv(client));
      streams_.push_back(kj::mv(stream));
    }
  }

  kj::Promise<void> closed_loop() {
    auto workers = kj::heapArrayBuilder<kj::Promise<void>>(opts_.concurrency);
    for (std::uint32_t i = 0; i < opts_.concurrency; ++i) workers.add(worker(gateways_[i % gateways_.size()]));
    return kj::joinPromises(workers.finish());
  }

  /// Poisson arrivals from `start` (the warm-up's start) until the measured
  /// window ends, then waits for the calls in flight. Each call's clock
  /// starts when it was due. The schedule is a function of the seed: the
  /// due times, as offsets from the window's start, are the same in every
  /// run (--samples writes them).
  kj::Promise<void> open_loop(clock_type::time_point start) {
    rng_.seed(opts_.seed);
    next_due_ = start;
    return arrivals().then([this] { return all_done(); });
  }

  kj::Promise<void> arrivals() {
    std::exponential_distribution<double> gap(opts_.rate);
    next_due_ += std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(gap(rng_)));
    if (next_due_ >= measure_end_) return kj::READY_NOW;
    return until(next_due_).then([this] {
      if (in_flight_ >= opts_.concurrency) {
        if (next_due_ >= measure_start_) ++results_.skipped;
      } else {
        ++in_flight_;
        auto& gateway = gateways_[issued_++ % gateways_.size()];
        // Counted out whether the call returned or failed (one_request
        // catches the call's errors, not a failure to read its answer).
        tasks_.add(one_request(gateway, next_due_).then([this] { call_done(); }, [this](kj::Exception&& e) {
          note_error("exception", e.getDescription().cStr());
          call_done();
        }));
      }
      return arrivals();
    });
  }

  /// Resolves once clock_type's now has reached `due`. A KJ timer counts from
  /// the event loop's last look at its clock, which is stale by as long as the
  /// loop has been busy, so one wait can end early: the call then started
  /// before it was due and its TTFT, measured from the due time, came out
  /// negative. Waiting again for what is left fixes that.
  kj::Promise<void> until(clock_type::time_point due) {
    const auto wait = due - clock_type::now();
    if (wait <= clock_type::duration::zero()) return kj::READY_NOW;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(wait).count();
    return io_.provider->getTimer().afterDelay(ns * kj::NANOSECONDS).then([this, due] { return until(due); });
  }

  void call_done() {
    if (--in_flight_ == 0) KJ_IF_MAYBE(d, done_) (*d)->fulfill();
  }

  kj::Promise<void> all_done() {
    if (in_flight_ == 0) return kj::READY_NOW;
    auto paf = kj::newPromiseAndFulfiller<void>();
    done_ = kj::mv(paf.fulfiller);
    return kj::mv(paf.promise);
  }

  /// One closed-loop slot: issues calls back to back until the measured
  /// window ends.
  kj::Promise<void> worker(exa::rpc::Gateway::Client& gateway) {
    if (clock_type::now() >= measure_end_) return kj::READY_NOW;
    return one_request(gateway).then([this, &gateway] { return worker(gateway); });
  }

  kj::Promise<void> one_request(exa::rpc::Gateway::Client& gateway,
                                std::optional<clock_type::time_point> due = std::nullopt) {
    auto times = std::make_shared<request_times>();
    auto req = gateway.generateRequest();
    auto g = req.initRequest();
    g.setModel(opts_.model);
    if (opts_.unique_prompts)
      g.getPrompt().setText(fmt::format("{:08x} {}", tag_rng_() >> 32, opts_.prompt));
    else
      g.getPrompt().setText(opts_.prompt);
    g.setMaxTokens(opts_.max_tokens);
    g.setIgnoreEos(opts_.ignore_eos);
    g.setDeadlineMs(opts_.deadline_ms);
    if (opts_.batch) g.setPriority(exa::rpc::Priority::BATCH);
    req.setSink(kj::heap<sink_impl>(times));
    times->start = due ? *due : clock_type::now();
    return req.send().then(
        [this, times](capnp::Response<exa::rpc::Gateway::GenerateResults> response) {
          record(*times, clock_type::now(), response.getResult());
        },
        [this](kj::Exception&& e) {
          note_error("exception", e.getDescription().cStr());
          // A lost connection fails every later call at once; stop rather
          // than spin recording errors.
          if (e.getType() == kj::Exception::Type::DISCONNECTED) measure_end_ = clock_type::now();
        });
  }

  void record(const request_times& times, clock_type::time_point done, exa::rpc::GenerateResult::Reader r) {
    if (r.hasError()) {
      note_error(r.getError().getCode().cStr(), r.getError().getMessage().cStr());
      return;
    }
    if (!times.first_chunk) {
      note_error("no_chunk", "call returned without a TokenSink chunk");
      return;
    }
    if (done >= measure_start_ && done < measure_end_) ++results_.completed_in_window;
    // Latency samples: every request issued inside the window, including
    // the last few that finish just after it closes.
    if (times.start < measure_start_) return;
    results_.start_s.push_back(ms_between(measure_start_, times.start) / 1000);
    results_.ttft_ms.push_back(ms_between(times.start, *times.first_chunk));
    results_.e2e_ms.push_back(ms_between(times.start, done));
    results_.server_ttft_ms.push_back(r.getTimings().getTtftMs());
  }

  void note_error(const std::string& code, const std::string& message) {
    ++results_.errors;
    ++results_.errors_by_code[code];
    if (results_.first_error.empty()) results_.first_error = code + ": " + message;
  }

  options opts_;
  kj::AsyncIoContext& io_;
  std::vector<kj::Own<kj::AsyncIoStream>> streams_;
  std::vector<kj::Own<capnp::TwoPartyClient>> clients_;
  std::vector<exa::rpc::Gateway::Client> gateways_;
  clock_type::time_point measure_start_, measure_end_;
  results results_;
  // Open loop.
  class task_errors final : public kj::TaskSet::ErrorHandler {
   public:
    void taskFailed(kj::Exception&& e) override { KJ_LOG(ERROR, "rpc_loadgen call failed", e); }
  } task_errors_;
  kj::TaskSet tasks_{task_errors_};
  std::mt19937_64 rng_;
  std::mt19937_64 tag_rng_{opts_.seed ^ 0x9e3779b97f4a7c15ull};  // --unique-prompts
  clock_type::time_point next_due_;
  std::uint32_t in_flight_ = 0;
  std::uint64_t issued_ = 0;
  kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> done_;
};

std::string json_percentiles(const percentiles& p) {
  return fmt::format(R"({{"p50":{:.4f},"p90":{:.4f},"p99":{:.4f},"max":{:.4f},"mean":{:.4f}}})", p.p50, p.p90,
                     p.p99, p.max, p.mean);
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
      continue;
    }
    out += c;
  }
  return out;
}

void print_report(const options& o, const results& r) {
  const double rps = static_cast<double>(r.completed_in_window) / o.duration_s;
  const auto ttft = summarize(r.ttft_ms), e2e = summarize(r.e2e_ms), server = summarize(r.server_ttft_ms);
  if (o.json) {
    std::string by_code;
    for (const auto& [code, n] : r.errors_by_code)
      by_code += fmt::format(R"({}"{}":{})", by_code.empty() ? "" : ",", json_escape(code), n);
    fmt::print(R"({{"door":"rpc","concurrency":{},"connections":{},"duration_s":{},"max_tokens":{},)"
               R"("rate":{},"skipped":{},"requests":{},"requests_per_s":{:.1f},"errors":{},"errors_by_code":{{{}}},)"
               R"("ttft_ms":{},"e2e_ms":{},"server_ttft_ms":{}}})"
               "\n",
               o.concurrency, o.connections, o.duration_s, o.max_tokens, o.rate, r.skipped, r.ttft_ms.size(), rps,
               r.errors, by_code,
               json_percentiles(ttft), json_percentiles(e2e), json_percentiles(server));
    return;
  }
  fmt::print("rpc_loadgen {}:{}  concurrency {}  connections {}  {} s (+{} s warm-up)  max_tokens {}\n", o.host,
             o.port, o.concurrency, o.connections, o.duration_s, o.warmup_s, o.max_tokens);
  fmt::print("  requests/s  {:.1f}   ({} latency samples, {} errors, {} skipped)\n", rps, r.ttft_ms.size(), r.errors,
             r.skipped);
  fmt::print("  {:<22} {:>9} {:>9} {:>9} {:>9} {:>9}\n", "latency (ms)", "p50", "p90", "p99", "max", "mean");
  auto row = [](const char* name, const percentiles& p) {
    fmt::print("  {:<22} {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f}\n", name, p.p50, p.p90, p.p99, p.max, p.mean);
  };
  row("ttft (client)", ttft);
  row("e2e (client)", e2e);
  row("ttft (server-reported)", server);
  if (!r.first_error.empty()) fmt::print("  first error: {}\n", r.first_error);
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
    std::fprintf(stderr, "rpc_loadgen: %s\n\n%s", bad->c_str(), usage);
    return 2;
  }
  auto io = kj::setupAsyncIo();
  loadgen gen(o, io);
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&] { gen.run(); })) {
    std::fprintf(stderr, "rpc_loadgen: %s\n", e->getDescription().cStr());
    return 1;
  }
  print_report(o, gen.result());
  if (!o.samples_file.empty()) {
    std::FILE* f = std::fopen(o.samples_file.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "rpc_loadgen: cannot write %s\n", o.samples_file.c_str());
      return 1;
    }
    const auto& r = gen.result();
    for (std::size_t i = 0; i < r.ttft_ms.size(); ++i)
      std::fprintf(f, "%.3f %.3f %.3f\n", r.start_s[i], r.ttft_ms[i], r.e2e_ms[i]);
    std::fclose(f);
  }
  // Every call failing means the numbers describe refusals, not serving.
  return gen.result().ttft_ms.empty() ? 1 : 0;
}
