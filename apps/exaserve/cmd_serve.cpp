// exaserve serve: the embedded cluster behind the HTTP and RPC front doors.

#include <spdlog/spdlog.h>

#include <csignal>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "actors/embedded_cluster.hpp"
#include "args.hpp"
#include "cli_util.hpp"
#include "commands.hpp"
#include "frontdoor.hpp"
#include "serve_config.hpp"
#include "serving.hpp"
#include "template/chat_template.hpp"

namespace exa::app {
namespace {

const std::vector<flag_spec> flags = [] {
  std::vector<flag_spec> f = {
    {"config", true, "config file ([cluster], [server], [deployment NAME] sections)"},
    {"model", true, "GGUF file of the first deployment (default: the generated tiny model)"},
    {"replicas", true, "replicas of the first deployment (default 2)"},
    {"nodes", true, "nodes of the embedded cluster (default 2)"},
    {"devices-per-node", true, "devices per node (default 2)"},
    {"device-memory-mb", true, "memory budget of each device (default 1024)"},
    {"engine", true, "cpu (default) or null (zero-cost, for serving benchmarks)"},
    {"device-kind", true, "cpu (default), cuda (nodes x devices-per-node GPUs of this host; an error naming the "
                          "CUDA runtime's reason without them) or auto (GPUs when there are enough, else CPU devices)"},
    {"host", true, "address to bind (default 127.0.0.1)"},
    {"http-port", true, "HTTP port (default 8000; 0 = any free port)"},
    {"rpc-port", true, "Cap'n Proto RPC port (default 7000; 0 = any free port)"},
    {"chat-template", true, "chat template for /v1/chat/completions instead of each model file's own: a built-in name (llama3, llama3.1, chatml, qwen2.5, mistral, mistral-v3, gemma, phi3, zephyr, smollm2) or a template file"},
    keys_file_flag(),
    no_auth_flag(),
    {"help", false, "show this help"},
  };
  for (auto& t : door_tls_flags()) f.push_back(t);
  return f;
}();

void print_banner(const frontdoor& door, const serve_config& config) {
  const std::string model = config.cluster.deployments.empty() ? "tiny" : config.cluster.deployments.front().name;
  std::printf(
      "\nExaServe is serving (%u nodes x %u devices, engine %s).\n"
      "  HTTP (OpenAI-compatible): %s\n"
      "  Cap'n Proto RPC:          %s:%u   (build/bin/exaserve-cli --connect %s:%u status)\n"
      "  health: %s/healthz  ready: %s/readyz  metrics: %s/metrics\n\n"
      "Try:\n"
      "  curl %s/v1/completions -H 'Content-Type: application/json' \\\n"
      "       -d '{\"model\": \"%s\", \"prompt\": \"Hello\", \"max_tokens\": 32, \"stream\": true}'\n\n"
      "Ctrl-C drains and stops.\n",
      config.cluster.nodes, config.cluster.devices_per_node, config.cluster.engine.c_str(), door.http_url().c_str(),
      config.server.host.c_str(), door.rpc_port(), config.server.host.c_str(), door.rpc_port(), door.http_url().c_str(),
      door.http_url().c_str(), door.http_url().c_str(), door.http_url().c_str(), model.c_str());
  std::fflush(stdout);
}

}  // namespace

int cmd_serve(int argc, char** argv) {
  auto a = args::parse(argc, argv, 2, flags);
  if (!a) return fail("serve", a.error());
  if (a->has("help")) {
    std::printf("usage: exaserve serve [--config FILE] [--model FILE] [--nodes N] [--devices-per-node G] "
                "[--http-port 8000] [--rpc-port 7000]\n%s", describe_flags(flags).c_str());
    return 0;
  }
  auto config = load_serve_config(*a);
  if (!config) return fail("serve", config.error());
  if (auto ok = init_engine_isa(); !ok) return fail("serve", ok.error());
  if (auto ok = jinja::check_template_override(config->cluster.chat_template); !ok) return fail("serve", ok.error());
  auto keys = keys_from_flags(*a);
  if (!keys) return fail("serve", keys.error());
  config->server.keys = *keys;
  if (auto ok = door_tls_from_flags(*a, config->server); !ok) return fail("serve", ok.error());

  // Block the stop signals before any thread starts, so only sigwait sees them.
  sigset_t stop_signals = block_stop_signals();
  block_reload_signal(stop_signals);  // SIGHUP re-reads the keys file

  auto cluster = actors::embedded_cluster::start(config->cluster);
  if (!cluster) return fail("serve", cluster.error());
  auto door = frontdoor::start(config->server, (*cluster)->backend());
  if (!door) {
    (*cluster)->stop();
    return fail("serve", door.error());
  }
  spdlog::info("event=serve_starting http={} rpc_port={}", (*door)->http_url(), (*door)->rpc_port());
  if (!wait_ready(*(*cluster)->backend(), std::chrono::seconds(120)))
    spdlog::warn("event=not_ready_yet detail=\"no ready replica after 120 s; serving anyway (see /readyz)\"");
  print_banner(**door, *config);

  const int sig = wait_for_stop_signal(stop_signals, config->server.keys.get(), door->get());
  spdlog::info("event=shutdown signal={} detail=\"draining in-flight requests\"", sig == SIGINT ? "SIGINT" : "SIGTERM");
  (*door)->stop_accepting();  // no new requests while the ones in flight finish
  drain(*(*cluster)->backend(), std::chrono::seconds(10));
  (*door)->stop();
  (*cluster)->stop();
  spdlog::info("event=stopped");
  return 0;
}

}  // namespace exa::app
