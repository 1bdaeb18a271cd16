// exaserve-cli: the command-line client of the ExaServe RPC API.

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <thread>
#include <unistd.h>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "render.hpp"
#include "rpc_client.hpp"
#include "template/chat_template.hpp"

namespace {

using namespace exa;

constexpr const char* usage = R"(usage: exaserve-cli [--connect HOST:PORT] [--api-key KEY]
                   [--tls-ca CA.pem [--tls-cert C --tls-key K] [--tls-server-name NAME]] <command> [args]

Talks to an ExaServe server over Cap'n Proto RPC (default 127.0.0.1:7000).
A server started with --keys-file wants an API key (--api-key, or the
environment variable EXASERVE_API_KEY); status, models, deploy, undeploy,
scale, drain, undrain and rollout want an admin key.

commands:
  status      nodes, devices, replicas (lifecycle state, load, KV use), deployments
  models      deployments that can serve requests
  generate [--model M] [--max-tokens N] [--temperature T] [--seed S] [--priority interactive|batch] PROMPT
              stream a completion to stdout (model: the first deployment if not given;
              max tokens: 64)
  deploy --name N [--model-file F] [--replicas R] [--kv-tokens K] [--routing P] [--sha256 HEX]
         [--tenant T]    (only T's API keys, and admin keys, see it; default: shared)
         [--warm-pool-percent P]   (replicas standing by, loaded, for failures and scale-ups; default 10)
         [--autoscale-min N --autoscale-max M [--autoscale-metric queue_depth|ttft_p99_ms|kv_utilization]
          [--autoscale-target X] [--idle-to-zero-s S]]   (autoscaling; off without --autoscale-max)
         [--chat-template NAME|FILE]   (the deployment's own chat template: a built-in's name
                                        or a Jinja file read HERE and sent as text; it wins over
                                        the gateway's --chat-template and the model file's)
         [--draft-model F [--draft-sha256 HEX] [--draft-tokens K]]   (speculative decoding: a
                                        draft GGUF on the server with the model's vocabulary
                                        proposes K tokens per step, 1-8, default 4)
         [--tp N]   (each replica tensor-parallel over N devices of one node: 1, 2, 4 or 8)
         [--prefix-slack-tokens T] [--prefix-slack-ratio X] [--prefix-slack-s S]   (prefix_aware's
                                        load bound: a cached prefix wins while its replica's
                                        queue is within max(min(T, what it prefills in S
                                        seconds), X x least) of the least loaded; default 2048,
                                        0.25, 0.2; S 0: T alone)
  undeploy NAME
  scale NAME REPLICAS   (0: cold -- kept, and started again by its next request, which waits)
  drain node N | replica ID [--deadline-s S]
              no new requests; in-flight ones finish, or after S seconds (default:
              the controller's, 60) resume elsewhere token-exact; each slot is placed
              elsewhere. A drained node takes nothing new until undrained.
  undrain node N
  rollout NAME --model-file F [--version V] [--sha256 HEX] [--steps 1,10,100] [--bake-s S]
          [--max-unavailable N] [--surge N] [--min-samples N]
              start a new version NAME@V: traffic moves through the steps (percent),
              each baked S seconds (default 300) and judged against the old version
              (TTFT p99, TPOT p99, errors); a regression rolls back at once. Surge N
              (default 1) starts new replicas first; --surge 0 replaces in place.
              Requests may pin a version ("model": "NAME@V"); one conversation (the
              OpenAI `user`) stays on one version.
  rollout status|pause|resume|abort|promote NAME
              one line: phase, step, traffic split, last verdict with its numbers
  top [--interval-s S] [--iterations N]
              a live view, refreshed every S seconds (default 2): nodes, deployments,
              replicas by state, load and queues, the replicas worth watching;
              until Ctrl-C, or N screens (one, without clearing, when stdout is not
              a terminal)

Errors go to stderr; exit status 2 for usage errors, 1 for other failures.
Logs go to stderr (EXASERVE_LOG=debug|info|warn|error|off).
)";

struct usage_error {
  std::string message;
};

/// `--name value` / `--name=value` flags (only those in `allowed`) and
/// positional arguments, from argv[first, argc).
struct command_args {
  std::map<std::string, std::string> flags;
  std::vector<std::string> positional;

  bool has(const std::string& name) const { return flags.count(name) != 0; }
  std::string get(const std::string& name, std::string fallback = {}) const {
    auto it = flags.find(name);
    return it == flags.end() ? fallback : it->second;
  }
};

std::expected<command_args, usage_error> parse_args(int argc, char** argv, int first,
                                                    const std::set<std::string>& allowed) {
  command_args out;
  for (int i = first; i < argc; ++i) {
    std::string_view a = argv[i];
    if (!a.starts_with("--") || a == "--") {
      out.positional.emplace_back(a);
      continue;
    }
    std::string name(a.substr(2)), value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return std::unexpected(usage_error{"flag --" + name + " needs a value"});
    }
    if (allowed.count(name) == 0) return std::unexpected(usage_error{"unknown flag --" + name});
    if (!out.flags.emplace(name, value).second) return std::unexpected(usage_error{"flag --" + name + " given twice"});
  }
  return out;
}

std::expected<std::uint64_t, usage_error> parse_uint(const std::string& what, const std::string& text,
                                                     std::uint64_t max) {
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || end != text.data() + text.size() || v > max)
    return std::unexpected(usage_error{what + " must be an integer in [0, " + std::to_string(max) + "], not '" + text + "'"});
  return v;
}

// The whole text as a number (strtod's syntax, so "inf" and "nan" too:
// ranges are the caller's), or nothing.
std::optional<double> parse_number(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size()) return std::nullopt;
  return v;
}

int fail(const char* command, const error& e) {
  std::fprintf(stderr, "exaserve-cli %s: %s\n", command, to_string(e).c_str());
  return 1;
}

int usage_fail(const char* command, const usage_error& e) {
  std::fprintf(stderr, "exaserve-cli %s: %s\nRun `exaserve-cli --help` for usage.\n", command, e.message.c_str());
  return 2;
}

using client_ptr = std::unique_ptr<cli::rpc_client>;

int cmd_status(cli::rpc_client& client) {
  auto s = client.status();
  if (!s) return fail("status", s.error());
  std::fputs(cli::render_status(*s).c_str(), stdout);
  return 0;
}

int cmd_models(cli::rpc_client& client) {
  auto m = client.models();
  if (!m) return fail("models", m.error());
  std::fputs(cli::render_models(*m).c_str(), stdout);
  return 0;
}

std::expected<api::generate_request, usage_error> generate_request_from(const command_args& args) {
  if (args.positional.size() != 1) return std::unexpected(usage_error{"generate takes exactly one PROMPT argument"});
  api::generate_request req;
  req.model = args.get("model");
  req.prompt_text = args.positional[0];
  auto max_tokens = parse_uint("--max-tokens", args.get("max-tokens", "64"), 1u << 20);
  if (!max_tokens) return std::unexpected(max_tokens.error());
  req.max_tokens = static_cast<std::uint32_t>(*max_tokens);
  auto seed = parse_uint("--seed", args.get("seed", "0"), UINT64_MAX);
  if (!seed) return std::unexpected(seed.error());
  req.sampling.seed = *seed;
  if (args.has("temperature")) {
    const std::string t = args.get("temperature");
    char* end = nullptr;
    const double v = std::strtod(t.c_str(), &end);
    if (t.empty() || *end != '\0' || !std::isfinite(v) || v < 0)
      return std::unexpected(usage_error{"--temperature must be a non-negative number, not '" + t + "'"});
    req.sampling.temperature = static_cast<float>(v);
  }
  if (args.has("priority")) {
    req.priority = args.get("priority");
    if (req.priority != "interactive" && req.priority != "batch")
      return std::unexpected(usage_error{"--priority must be interactive or batch, not '" + req.priority + "'"});
  }
  return req;
}

int cmd_generate(cli::rpc_client& client, const command_args& args) {
  auto req = generate_request_from(args);
  if (!req) return usage_fail("generate", req.error());
  if (req->model.empty()) {
    // No model named: the first deployment is the obvious choice.
    auto models = client.models();
    if (!models) return fail("generate", models.error());
    if (models->empty()) return fail("generate", error{errc::not_found, "the server has no deployments; deploy one first"});
    req->model = models->front().name;
  }
  bool wrote = false;
  auto result = client.generate(*req, [&](const api::token_chunk& chunk) {
    std::fwrite(chunk.text.data(), 1, chunk.text.size(), stdout);
    std::fflush(stdout);  // the point of streaming: show tokens as they come
    wrote = wrote || !chunk.text.empty();
  });
  if (wrote) std::fputc('\n', stdout);
  if (!result) return fail("generate", result.error());
  if (result->err) return fail("generate", *result->err);
  if (result->reason == api::finish_reason::cancelled)
    return fail("generate", error{errc::cancelled, "the request was cancelled"});
  spdlog::info(
      "event=generate_done model={} finish={} prompt_tokens={} cached_tokens={} completion_tokens={} ttft_ms={:.1f} "
      "e2e_ms={:.1f}",
      req->model, result->reason == api::finish_reason::length ? "length" : "stop", result->usage.prompt_tokens,
      result->usage.cached_tokens, result->usage.completion_tokens, result->timings.ttft_ms, result->timings.e2e_ms);
  return 0;
}

// deploy's request from its flags, checked before any connection (so a bad
// flag is named even with no server); on failure the exit code, its message
// already printed: 2 for usage, 1 for a chat template that cannot be read.
std::expected<api::deploy_request, int> deploy_request_from(const command_args& args) {
  if (!args.positional.empty()) return std::unexpected(usage_fail("deploy", {"deploy takes only flags"}));
  if (!args.has("name")) return std::unexpected(usage_fail("deploy", {"--name is required"}));
  auto replicas = parse_uint("--replicas", args.get("replicas", "1"), 1u << 16);
  if (!replicas) return std::unexpected(usage_fail("deploy", replicas.error()));
  auto kv = parse_uint("--kv-tokens", args.get("kv-tokens", "0"), UINT32_MAX);
  if (!kv) return std::unexpected(usage_fail("deploy", kv.error()));
  api::deploy_request req{args.get("name"), args.get("model-file"), static_cast<std::uint32_t>(*replicas),
                          static_cast<std::uint32_t>(*kv), args.get("routing")};
  req.model_sha256 = args.get("sha256");
  req.tenant = args.get("tenant");
  auto warm = parse_uint("--warm-pool-percent", args.get("warm-pool-percent", "10"), 50);
  if (!warm) return std::unexpected(usage_fail("deploy", warm.error()));
  req.warm_pool_percent = static_cast<std::uint32_t>(*warm);
  auto amin = parse_uint("--autoscale-min", args.get("autoscale-min", "1"), 1u << 16);
  if (!amin) return std::unexpected(usage_fail("deploy", amin.error()));
  auto amax = parse_uint("--autoscale-max", args.get("autoscale-max", "0"), 1u << 16);
  if (!amax) return std::unexpected(usage_fail("deploy", amax.error()));
  auto idle = parse_uint("--idle-to-zero-s", args.get("idle-to-zero-s", "0"), 604800);
  if (!idle) return std::unexpected(usage_fail("deploy", idle.error()));
  req.autoscale_min = static_cast<std::uint32_t>(*amin);
  req.autoscale_max = static_cast<std::uint32_t>(*amax);
  req.idle_to_zero_s = static_cast<std::uint32_t>(*idle);
  req.autoscale_metric = args.get("autoscale-metric");
  if (args.has("autoscale-target")) {
    const std::string t = args.get("autoscale-target");
    const auto v = parse_number(t);
    if (!v || !(*v > 0))
      return std::unexpected(usage_fail("deploy", {"--autoscale-target: expected a number above 0, got '" + t + "'"}));
    req.autoscale_target = *v;
  }
  if (args.has("chat-template")) {
    // The file is read here, where the operator named it: the controller
    // and the gateways may run elsewhere, so the text is what travels.
    auto t = jinja::resolve_template_override(args.get("chat-template"));
    if (!t) return std::unexpected(fail("deploy", t.error()));
    req.chat_template = std::move(t->text);
  }
  req.draft_model = args.get("draft-model");
  req.draft_sha256 = args.get("draft-sha256");
  if ((args.has("draft-tokens") || args.has("draft-sha256")) && req.draft_model.empty())
    return std::unexpected(usage_fail("deploy", {"--draft-tokens and --draft-sha256 need --draft-model"}));
  if (args.has("draft-tokens")) {
    // The engine's bound (engine::max_draft_tokens); the controller checks it again.
    auto k = parse_uint("--draft-tokens", args.get("draft-tokens"), 8);
    if (!k || *k == 0)
      return std::unexpected(
          usage_fail("deploy", {"--draft-tokens must be in [1, 8], got '" + args.get("draft-tokens") + "'"}));
    req.draft_tokens = static_cast<std::uint32_t>(*k);
  }
  if (args.has("tp")) {
    // The ledger's bound (cluster::max_tensor_parallel); the controller checks the model splits.
    auto tp = parse_uint("--tp", args.get("tp"), 8);
    if (!tp || (*tp != 1 && *tp != 2 && *tp != 4 && *tp != 8))
      return std::unexpected(usage_fail("deploy", {"--tp must be 1, 2, 4 or 8, got '" + args.get("tp") + "'"}));
    req.tensor_parallel = static_cast<std::uint32_t>(*tp);
  }
  // Ranges (cluster::check_prefix_slack) are the controller's to check, as for a config file.
  if (args.has("prefix-slack-tokens")) {
    auto t = parse_uint("--prefix-slack-tokens", args.get("prefix-slack-tokens"), UINT64_MAX);
    if (!t) return std::unexpected(usage_fail("deploy", t.error()));
    req.prefix_slack_tokens = *t;
  }
  if (args.has("prefix-slack-ratio")) {
    const auto v = parse_number(args.get("prefix-slack-ratio"));
    if (!v)
      return std::unexpected(
          usage_fail("deploy", {"--prefix-slack-ratio: expected a number, got '" + args.get("prefix-slack-ratio") + "'"}));
    req.prefix_slack_ratio = *v;
  }
  if (args.has("prefix-slack-s")) {
    const auto v = parse_number(args.get("prefix-slack-s"));
    if (!v)
      return std::unexpected(usage_fail(
          "deploy", {"--prefix-slack-s: expected a number of seconds, got '" + args.get("prefix-slack-s") + "'"}));
    req.prefix_slack_s = *v;
  }
  return req;
}

int cmd_deploy(cli::rpc_client& client, const api::deploy_request& req) {
  if (auto r = client.deploy(req); !r) return fail("deploy", r.error());
  std::printf("deployed %s (%u replicas)\n", req.name.c_str(), req.replicas);
  return 0;
}

int cmd_undeploy(cli::rpc_client& client, const command_args& args) {
  if (args.positional.size() != 1) return usage_fail("undeploy", {"undeploy takes exactly one NAME"});
  if (auto r = client.undeploy(args.positional[0]); !r) return fail("undeploy", r.error());
  std::printf("undeployed %s\n", args.positional[0].c_str());
  return 0;
}

int cmd_scale(cli::rpc_client& client, const command_args& args) {
  if (args.positional.size() != 2) return usage_fail("scale", {"scale takes NAME REPLICAS"});
  auto replicas = parse_uint("REPLICAS", args.positional[1], 1u << 16);
  if (!replicas) return usage_fail("scale", replicas.error());
  const auto n = static_cast<std::uint32_t>(*replicas);
  if (auto r = client.scale(args.positional[0], n); !r) return fail("scale", r.error());
  std::printf("scaled %s to %u replicas\n", args.positional[0].c_str(), n);
  return 0;
}

// drain node N | drain replica ID | undrain node N
int cmd_drain(cli::rpc_client& client, const command_args& args, bool undrain) {
  const char* name = undrain ? "undrain" : "drain";
  if (args.positional.size() != 2 || (args.positional[0] != "node" && args.positional[0] != "replica"))
    return usage_fail(name, {std::string(name) + " takes node N or replica ID"});
  api::drain_request req;
  req.kind = args.positional[0] == "node" ? api::drain_request::target::node : api::drain_request::target::replica;
  req.undrain = undrain;
  auto id = parse_uint(args.positional[0] == "node" ? "N" : "ID", args.positional[1], std::uint64_t{1} << 62);
  if (!id) return usage_fail(name, id.error());
  req.id = *id;
  if (args.has("deadline-s")) {
    if (undrain) return usage_fail(name, {"undrain takes no --deadline-s"});
    auto s = parse_uint("--deadline-s", args.get("deadline-s"), 24 * 3600);
    if (!s) return usage_fail(name, s.error());
    if (*s == 0) return usage_fail(name, {"--deadline-s must be at least 1"});
    req.deadline_ms = static_cast<std::uint32_t>(*s * 1000);
  }
  auto r = client.drain(req);
  if (!r) return fail(name, r.error());
  const std::string what = args.positional[0] + " " + args.positional[1];
  if (undrain) std::printf("undrained %s\n", what.c_str());
  else
    std::printf("draining %s: %u replicas, deadline %.0f s\n", what.c_str(), r->replicas, r->deadline_ms / 1000.0);
  return 0;
}

// rollout NAME --model-file F [...] | rollout status|pause|resume|abort|promote NAME
int cmd_rollout(cli::rpc_client& client, const command_args& args) {
  static const std::map<std::string, api::rollout_request::op> ops = {
      {"status", api::rollout_request::op::status}, {"pause", api::rollout_request::op::pause},
      {"resume", api::rollout_request::op::resume}, {"abort", api::rollout_request::op::abort},
      {"promote", api::rollout_request::op::promote}};
  api::rollout_request req;
  if (args.positional.size() == 2 && ops.count(args.positional[0])) {
    if (!args.flags.empty()) return usage_fail("rollout", {"rollout " + args.positional[0] + " takes only NAME"});
    req.what = ops.at(args.positional[0]);
    req.name = args.positional[1];
  } else if (args.positional.size() == 1) {
    req.what = api::rollout_request::op::start;
    req.name = args.positional[0];
    req.model_file = args.get("model-file");
    if (req.model_file.empty()) return usage_fail("rollout", {"rollout NAME needs --model-file F"});
    req.version = args.get("version");
    req.model_sha256 = args.get("sha256");
    req.steps = args.get("steps");
    const auto number = [&](const char* flag, std::uint32_t fallback, std::uint64_t max,
                            std::uint32_t& out) -> std::optional<usage_error> {
      auto v = parse_uint(std::string("--") + flag, args.get(flag, std::to_string(fallback)), max);
      if (!v) return v.error();
      out = static_cast<std::uint32_t>(*v);
      return std::nullopt;
    };
    if (auto e = number("bake-s", 0, 7 * 24 * 3600, req.bake_s)) return usage_fail("rollout", *e);
    if (auto e = number("max-unavailable", 1, 4096, req.max_unavailable)) return usage_fail("rollout", *e);
    if (auto e = number("surge", 1, 4096, req.surge)) return usage_fail("rollout", *e);
    if (auto e = number("min-samples", 0, 1u << 20, req.min_samples)) return usage_fail("rollout", *e);
  } else {
    return usage_fail("rollout", {"rollout takes NAME --model-file F, or status|pause|resume|abort|promote NAME"});
  }
  auto r = client.rollout(req);
  if (!r) return fail("rollout", r.error());
  std::printf("%s\n", r->status.c_str());
  return 0;
}

int cmd_top(cli::rpc_client& client, const command_args& args) {
  if (!args.positional.empty()) return usage_fail("top", {"top takes no arguments"});
  auto interval = parse_uint("--interval-s", args.get("interval-s", "2"), 3600);
  if (!interval) return usage_fail("top", interval.error());
  if (*interval == 0) return usage_fail("top", {"--interval-s must be at least 1"});
  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  std::uint64_t iterations = tty ? 0 : 1;  // 0: until interrupted
  if (args.has("iterations")) {
    auto n = parse_uint("--iterations", args.get("iterations"), 1u << 30);
    if (!n) return usage_fail("top", n.error());
    if (*n == 0) return usage_fail("top", {"--iterations must be at least 1"});
    iterations = *n;
  }
  for (std::uint64_t i = 0; iterations == 0 || i < iterations; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::seconds(*interval));
    auto s = client.status();
    if (!s) return fail("top", s.error());
    const auto t = std::time(nullptr);
    char now[32];
    std::strftime(now, sizeof now, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
    const std::string screen = cli::render_top(*s, now);
    if (tty) std::fputs("\x1b[H\x1b[2J", stdout);  // home, clear
    else if (i > 0) std::fputs("\n", stdout);
    std::fputs(screen.c_str(), stdout);
    std::fflush(stdout);
  }
  return 0;
}

struct endpoint {
  std::string host = "127.0.0.1";
  std::uint16_t port = 7000;
};

std::expected<endpoint, usage_error> parse_endpoint(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) return std::unexpected(usage_error{"--connect wants HOST:PORT, not '" + text + "'"});
  endpoint e;
  e.host = text.substr(0, colon);
  if (e.host.size() > 2 && e.host.front() == '[' && e.host.back() == ']') e.host = e.host.substr(1, e.host.size() - 2);
  auto port = parse_uint("the port", text.substr(colon + 1), 65535);
  if (!port || *port == 0) return std::unexpected(usage_error{"--connect wants a port in [1, 65535], not '" + text + "'"});
  e.port = static_cast<std::uint16_t>(*port);
  return e;
}

void setup_logging() {
  auto logger = spdlog::stderr_color_mt("exaserve-cli");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  spdlog::set_level(spdlog::level::info);
  if (const char* lvl = std::getenv("EXASERVE_LOG"); lvl && *lvl) spdlog::set_level(spdlog::level::from_str(lvl));
}

const std::map<std::string, std::set<std::string>> command_flags = {
    {"status", {}},
    {"models", {}},
    {"generate", {"model", "max-tokens", "temperature", "seed", "priority"}},
    {"deploy", {"name", "model-file", "replicas", "kv-tokens", "routing", "sha256", "tenant", "warm-pool-percent",
                "autoscale-min", "autoscale-max", "autoscale-metric", "autoscale-target", "idle-to-zero-s", "chat-template",
                "draft-model", "draft-sha256", "draft-tokens", "tp", "prefix-slack-tokens", "prefix-slack-ratio",
                "prefix-slack-s"}},
    {"undeploy", {}},
    {"scale", {}},
    {"drain", {"deadline-s"}},
    {"undrain", {}},
    {"top", {"interval-s", "iterations"}},
    {"rollout", {"model-file", "version", "sha256", "steps", "bake-s", "max-unavailable", "surge", "min-samples"}},
};

// Every command but deploy, whose request main builds before connecting.
int dispatch(const std::string& cmd, cli::rpc_client& client, const command_args& args) {
  if (cmd == "status") return cmd_status(client);
  if (cmd == "models") return cmd_models(client);
  if (cmd == "generate") return cmd_generate(client, args);
  if (cmd == "undeploy") return cmd_undeploy(client, args);
  if (cmd == "drain") return cmd_drain(client, args, false);
  if (cmd == "undrain") return cmd_drain(client, args, true);
  if (cmd == "top") return cmd_top(client, args);
  if (cmd == "rollout") return cmd_rollout(client, args);
  return cmd_scale(client, args);
}

}  // namespace

int main(int argc, char** argv) {
  setup_logging();
  int i = 1;
  std::string connect = "127.0.0.1:7000";
  const char* env_key = std::getenv("EXASERVE_API_KEY");
  std::string api_key = env_key ? env_key : "";
  cli::rpc_client::tls_files tls;
  for (; i < argc && std::string_view(argv[i]).starts_with("-"); ++i) {
    const std::string_view a = argv[i];
    if (a == "--help" || a == "-h") return std::fputs(usage, stdout), 0;
    if (a == "--connect" && i + 1 < argc) {
      connect = argv[++i];
    } else if (a.starts_with("--connect=")) {
      connect = std::string(a.substr(10));
    } else if ((a == "--tls-ca" || a == "--tls-cert" || a == "--tls-key" || a == "--tls-server-name") && i + 1 < argc) {
      (a == "--tls-ca" ? tls.ca : a == "--tls-cert" ? tls.cert : a == "--tls-key" ? tls.key : tls.server_name) = argv[++i];
    } else if (a == "--api-key" && i + 1 < argc) {
      api_key = argv[++i];
    } else if (a.starts_with("--api-key=")) {
      api_key = std::string(a.substr(10));
    } else {
      std::fprintf(stderr, "exaserve-cli: unknown option '%s'\n\n%s", argv[i], usage);
      return 2;
    }
  }
  if (i >= argc) return std::fputs(usage, stderr), 2;
  const std::string cmd = argv[i];
  auto flags = command_flags.find(cmd);
  if (flags == command_flags.end()) {
    std::fprintf(stderr, "exaserve-cli: unknown command '%s'\n\n%s", cmd.c_str(), usage);
    return 2;
  }
  auto args = parse_args(argc, argv, i + 1, flags->second);
  if (!args) return usage_fail(cmd.c_str(), args.error());
  auto where = parse_endpoint(connect);
  if (!where) return usage_fail(cmd.c_str(), where.error());
  if (tls.cert.empty() != tls.key.empty())
    return usage_fail(cmd.c_str(), {"--tls-cert and --tls-key go together"});
  if (!tls.cert.empty() && tls.ca.empty())
    return usage_fail(cmd.c_str(), {"a client certificate needs --tls-ca, the CA of the server's certificate"});
  // Flags that need no server are checked before connecting to one.
  std::optional<api::deploy_request> deploy;
  if (cmd == "deploy") {
    auto d = deploy_request_from(*args);
    if (!d) return d.error();
    deploy = std::move(*d);
  }
  if (cmd == "generate")
    if (auto g = generate_request_from(*args); !g) return usage_fail("generate", g.error());
  auto client = cli::rpc_client::connect(where->host, where->port, api_key, tls);
  if (!client) return fail(cmd.c_str(), client.error());
  if (deploy) return cmd_deploy(**client, *deploy);
  return dispatch(cmd, **client, *args);
}
