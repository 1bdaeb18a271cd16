// exaserve: one binary, one subcommand per job.

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstring>
#include <string_view>

#include "commands.hpp"

namespace {

constexpr const char* usage = R"(usage: exaserve <command> [flags]

commands:
  serve          start the embedded cluster behind the HTTP and RPC front doors
  controller     run a distributed cluster's controller (nodes and gateways join it)
  node           run one node of a distributed cluster: devices and replicas
  gateway        run the HTTP and RPC front doors of a distributed cluster
  gen-certs      write a cluster CA and certificates for controller, node and gateway
  keys           add, revoke and list API keys in a keys file (add prints the key once)
  generate       generate text or token ids from a GGUF model
  chat-template  print a conversation rendered with a model's chat template (as transformers renders it)
  gen-model      write a Llama-architecture GGUF model with deterministic random weights
  tokenize       print a text's token ids with a model file's tokenizer (as llama.cpp tokenizes)
  detokenize     print the text of token ids with a model file's tokenizer
  check-model    load a model file and find NaN or infinite values in its tensors
  bench-engine   measure prefill and decode throughput of the CPU engine
  plan           print the memory ledger: how many replicas of a model fit a GPU and a node
  chaos          run a fault plan under load (one process, or --processes) and check invariants
  sim            rehearse a cluster (up to 256 nodes, 3072 replicas) in virtual time
  aggregate      scrape processes' /metrics, sum them by level (rack, global) and serve the result
  metric-names   list every metric family exaserve exports (NAME TYPE), for dashboards and alert rules
  events         merge the event logs of a cluster's processes by clock-corrected time

Run `exaserve <command> --help` for the flags of a command.
Logs go to stderr (EXASERVE_LOG=debug|info|warn|error|off); results to stdout.
)";

void setup_logging() {
  // Logs on stderr, so stdout carries only a command's result.
  auto logger = spdlog::stderr_color_mt("exaserve");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  spdlog::set_level(spdlog::level::info);
  if (const char* lvl = std::getenv("EXASERVE_LOG"); lvl && *lvl)
    spdlog::set_level(spdlog::level::from_str(lvl));
}

}  // namespace

int main(int argc, char** argv) {
  setup_logging();
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string_view cmd = argv[1];
  if (cmd == "serve") return exa::app::cmd_serve(argc, argv);
  if (cmd == "generate") return exa::app::cmd_generate(argc, argv);
  if (cmd == "chat-template") return exa::app::cmd_chat_template(argc, argv);
  if (cmd == "gen-model") return exa::app::cmd_gen_model(argc, argv);
  if (cmd == "tokenize") return exa::app::cmd_tokenize(argc, argv);
  if (cmd == "detokenize") return exa::app::cmd_detokenize(argc, argv);
  if (cmd == "check-model") return exa::app::cmd_check_model(argc, argv);
  if (cmd == "bench-engine") return exa::app::cmd_bench_engine(argc, argv);
  if (cmd == "plan") return exa::app::cmd_plan(argc, argv);
  if (cmd == "chaos") return exa::app::cmd_chaos(argc, argv);
  if (cmd == "sim") return exa::app::cmd_sim(argc, argv);
  if (cmd == "events") return exa::app::cmd_events(argc, argv);
  if (cmd == "controller") return exa::app::cmd_controller(argc, argv);
  if (cmd == "node") return exa::app::cmd_node(argc, argv);
  if (cmd == "gateway") return exa::app::cmd_gateway(argc, argv);
  if (cmd == "gen-certs") return exa::app::cmd_gen_certs(argc, argv);
  if (cmd == "keys") return exa::app::cmd_keys(argc, argv);
  if (cmd == "aggregate") return exa::app::cmd_aggregate(argc, argv);
  if (cmd == "metric-names") return exa::app::cmd_metric_names(argc, argv);
  std::fprintf(stderr, "exaserve: unknown command '%s'\n\n%s", argv[1], usage);
  return 2;
}
