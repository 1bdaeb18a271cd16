// exaserve controller | node | gateway: the roles of a distributed cluster,
// one process each, joined over CAF's middleman (docs/DEPLOYMENT.md).

#include <spdlog/spdlog.h>

#include <csignal>
#include <cstdio>

#include "actors/distributed.hpp"
#include "cluster/routing.hpp"
#include "cluster/event_log.hpp"
#include "gpu/device_select.hpp"
#include "args.hpp"
#include "cli_util.hpp"
#include "commands.hpp"
#include "frontdoor.hpp"
#include "status_door.hpp"
#include "serve_config.hpp"
#include "serving.hpp"
#include "template/chat_template.hpp"

namespace exa::app {
namespace {

const flag_spec cluster_flag{"cluster", true,
                             "cluster name; every process of a cluster gives the same one (default exaserve)"};
const flag_spec help_flag{"help", false, "show this help"};
const flag_spec tls_cert_flag{"tls-cert", true, "this process's certificate (PEM), signed by the cluster CA"};
const flag_spec tls_key_flag{"tls-key", true, "its private key (PEM)"};
const flag_spec tls_ca_flag{"tls-ca", true, "the cluster CA (PEM): peers without a certificate it signed are refused"};
const flag_spec insecure_flag{"insecure", false, "plain TCP beyond loopback: unauthenticated and unencrypted, on purpose"};
const flag_spec event_log_flag{"event-log", true,
                               "append this process's events (replica and node states, clock offsets) to FILE as "
                               "JSON lines stamped with the wall clock; `exaserve events merge` orders several"};

// The flags every role takes: trust (TLS, --insecure), the cluster's name, help.
std::vector<flag_spec> with_common_flags(std::vector<flag_spec> own) {
  for (const auto& f : {tls_cert_flag, tls_key_flag, tls_ca_flag, insecure_flag, cluster_flag, event_log_flag, help_flag})
    own.push_back(f);
  return own;
}

// Fills a role's transport choice from the common flags.
template <class Options>
void set_transport(const args& a, Options& o) {
  o.tls = {a.get_or("tls-cert", ""), a.get_or("tls-key", ""), a.get_or("tls-ca", "")};
  o.insecure = a.has("insecure");
}

void wait_for_stop(sigset_t& s) {
  int sig = 0;
  sigwait(&s, &sig);
  spdlog::info("event=shutdown signal={}", sig == SIGINT ? "SIGINT" : "SIGTERM");
}

expected<actors::host_port> address_flag(const args& a, const std::string& name, const std::string& fallback,
                                         bool required) {
  auto v = a.get(name);
  if (!v && required) return make_error(errc::invalid_argument, "--" + name + " HOST:PORT is required");
  auto hp = actors::parse_host_port(v.value_or(fallback));
  if (!hp) return make_error(errc::invalid_argument, "--" + name + ": " + hp.error().message);
  return hp;
}

// --event-log FILE: the process's event log, written as events happen.
expected<std::shared_ptr<cluster::event_log>> event_log_flag_value(const args& a) {
  auto path = a.get("event-log");
  if (!path) return std::shared_ptr<cluster::event_log>{};
  auto log = cluster::event_log::to_file(*path);
  if (!log) return make_error(errc::invalid_argument, "--event-log: " + log.error().message);
  return log;
}

const flag_spec metrics_listen_flag{"metrics-listen", true,
                                    "HOST:PORT of this process's status port: GET /metrics, /healthz and /readyz "
                                    "over plain HTTP (default: none); `exaserve aggregate` scrapes it"};

// --metrics-listen: the status port, or null when the flag is absent.
expected<std::unique_ptr<status_door>> status_port(const args& a, status_handlers handlers) {
  auto v = a.get("metrics-listen");
  if (!v) return std::unique_ptr<status_door>{};
  auto hp = actors::parse_host_port(*v);
  if (!hp) return make_error(errc::invalid_argument, "--metrics-listen: " + hp.error().message);
  return status_door::start(hp->host, hp->port, std::move(handlers));
}

actors::cluster_identity identity(const args& a) {
  actors::cluster_identity id;
  id.cluster = a.get_or("cluster", "exaserve");
  id.version = actors::build_version();
  return id;
}

const std::vector<flag_spec> controller_flags = with_common_flags({
    {"listen", true, "HOST:PORT nodes and gateways join at (default 127.0.0.1:7100)"},
    {"state-dir", true, "the controller's journal (required): deployments, epochs and replica ids survive a restart"},
    {"config", true, "same format as `serve`: [cluster] timings and engine, [deployment NAME] sections; "
                     "its deployments seed a fresh state directory"},
    {"model", true, "GGUF file of the first deployment (default: the generated tiny model)"},
    {"replicas", true, "replicas of the first deployment (default 2)"},
    {"engine", true, "cpu (default) or null: the engine replicas are placed with"},
    {"wait-nodes", true, "place the configured deployments once this many nodes joined (default 1)"},
    metrics_listen_flag,
});

const std::vector<flag_spec> node_flags = with_common_flags({
    {"join", true, "HOST:PORT of the controller (required)"},
    {"node-id", true, "this node's id, unique in the cluster (required)"},
    {"rack", true, "rack (failure domain) of this node (default 0)"},
    {"region", true, "region of this node (default none): gateways of a region prefer its replicas"},
    {"devices", true, "devices on this node (default 1)"},
    {"device-kind", true, "cpu (default), cuda (that many GPUs; an error naming the CUDA runtime's reason without "
                          "them) or auto (GPUs when there are enough, else CPU devices)"},
    {"device-memory", true, "memory budget of each device in bytes (default 1073741824)"},
    {"engine", true, "cpu or null: overrides the controller's engine on this node"},
    {"device-threads", true, "engine worker threads per device (default 1)"},
    {"no-step-stop", false, "engine steps never stop part way for a lighter tenant's arriving prompt (they do by "
                            "default: every step on CPU devices, long ones on CUDA devices; see [cluster] "
                            "step_stop in docs/DEPLOYMENT.md)"},
    {"listen", true, "HOST:PORT gateways reach this node at (default 127.0.0.1:0, any free port)"},
    {"join-timeout-ms", true, "keep trying to reach the controller this long at start (default 60000)"},
    {"model-dir", true, "a model missing at its deployed path is looked for here, as <sha256>.gguf "
                        "(deployments that pin one) or by its file name"},
    {"model-store", true, "the operator's model store (a directory, e.g. a network mount): a model found nowhere on "
                          "this node is copied from it into the node's cache, checked and renamed into place"},
    {"model-cache-dir", true, "this node's own directory that models fetched from the store are copied to "
                              "(required with --model-store; evicted copies are deleted from it)"},
    {"model-cache-mb", true, "model files kept loaded on this node, in MiB; least recently used ones not in use "
                             "are evicted first, never one a replica maps (default 65536)"},
    {"drain-deadline-ms", true, "on SIGTERM: the controller moves this node's slots and its in-flight "
                                "requests finish; past this deadline they resume elsewhere (default 20000; "
                                "0 = stop at once)"},
    metrics_listen_flag,
});

const std::vector<flag_spec> gateway_flags = with_common_flags({
    {"join", true, "HOST:PORT of the controller (required)"},
    {"host", true, "address the front doors bind (default 127.0.0.1)"},
    {"http-port", true, "HTTP port (default 8000; 0 = any free port)"},
    {"rpc-port", true, "Cap'n Proto RPC port (default 7000; 0 = any free port)"},
    {"request-deadline-ms", true, "deadline of a request that names none (default 120000)"},
    {"region", true, "this gateway's region (default none): its replicas first, others when those are saturated or down"},
    {"chat-template", true, "chat template for /v1/chat/completions instead of each model file's own: a built-in name (llama3, llama3.1, chatml, qwen2.5, mistral, mistral-v3, gemma, phi3, zephyr, smollm2) or a template file"},
    {"join-timeout-ms", true, "keep trying to reach the controller this long at start (default 60000)"},
    keys_file_flag(),
    no_auth_flag(),
    door_tls_flags()[0],
    door_tls_flags()[1],
    door_tls_flags()[2],
});

}  // namespace

int cmd_controller(int argc, char** argv) {
  auto a = args::parse(argc, argv, 2, controller_flags);
  if (!a) return fail("controller", a.error());
  if (a->has("help")) {
    std::printf("usage: exaserve controller --state-dir DIR [--listen HOST:PORT] [--config FILE]\n%s",
                describe_flags(controller_flags).c_str());
    return 0;
  }
  auto config = load_serve_config(*a);
  if (!config) return fail("controller", config.error());
  auto listen = address_flag(*a, "listen", "127.0.0.1:7100", false);
  if (!listen) return fail("controller", listen.error());
  if (!a->has("state-dir")) return fail("controller", {errc::invalid_argument, "--state-dir DIR is required"});
  auto wait_nodes = a->get_int("wait-nodes", 1, 1, 1 << 20);
  if (!wait_nodes) return fail("controller", wait_nodes.error());
  auto events = event_log_flag_value(*a);
  if (!events) return fail("controller", events.error());
  auto signals = block_stop_signals();
  actors::controller_options o;
  o.identity = identity(*a);
  o.listen = *listen;
  o.deploy_after_nodes = static_cast<std::uint32_t>(*wait_nodes);
  o.state_dir = *a->get("state-dir");
  set_transport(*a, o);
  o.cluster = config->cluster;
  o.cluster.event_log = *events;
  const bool o_tls_enabled = o.tls.enabled();
  if (!o_tls_enabled)
    spdlog::warn("event=cluster_transport_plain detail=\"no --tls-cert/--tls-key/--tls-ca: cluster traffic is neither "
                 "encrypted nor authenticated\"");
  auto controller = actors::controller_process::start(std::move(o));
  if (!controller) return fail("controller", controller.error());
  auto* c = controller->get();
  auto status = status_port(*a, {[c] { return c->metrics_text(); }, {}});
  if (!status) return fail("controller", status.error());
  std::printf("exaserve controller listening on %s:%u (%s)\n", listen->host.c_str(), (*controller)->port(),
              o_tls_enabled ? "mutual TLS" : "plain TCP");
  if (*status) std::printf("exaserve controller status port at %s\n", (*status)->url().c_str());
  std::fflush(stdout);
  wait_for_stop(signals);
  if (*status) (*status)->stop();
  (*controller)->stop();
  spdlog::info("event=stopped role=controller");
  return 0;
}

int cmd_node(int argc, char** argv) {
  auto a = args::parse(argc, argv, 2, node_flags);
  if (!a) return fail("node", a.error());
  if (a->has("help")) {
    std::printf("usage: exaserve node --join HOST:PORT --node-id N [--rack R] [--devices G] [--device-memory BYTES] "
                "[--engine cpu|null] [--device-kind cpu|cuda|auto] [--listen HOST:PORT]\n%s",
                describe_flags(node_flags).c_str());
    return 0;
  }
  auto join = address_flag(*a, "join", "", true);
  if (!join) return fail("node", join.error());
  if (auto ok = init_engine_isa(); !ok) return fail("node", ok.error());
  auto listen = address_flag(*a, "listen", "127.0.0.1:0", false);
  if (!listen) return fail("node", listen.error());
  if (!a->has("node-id")) return fail("node", {errc::invalid_argument, "--node-id N is required"});
  auto id = a->get_int("node-id", 0, 0, 1 << 20);
  auto rack = a->get_int("rack", 0, 0, 1 << 20);
  auto devices = a->get_int("devices", 1, 1, 64);
  auto memory = a->get_int("device-memory", 1ll << 30, 16ll << 20, 1ll << 50);
  auto threads = a->get_int("device-threads", 1, 1, 256);
  auto join_timeout = a->get_int("join-timeout-ms", 60000, 100, 86400000);
  auto drain_deadline = a->get_int("drain-deadline-ms", 20000, 0, 3600000);
  auto cache_mb = a->get_int("model-cache-mb", 65536, 1, 1ll << 30);
  for (const auto* v : {&id, &rack, &devices, &memory, &threads, &join_timeout, &drain_deadline, &cache_mb})
    if (!*v) return fail("node", v->error());
  auto events = event_log_flag_value(*a);
  if (!events) return fail("node", events.error());
  auto signals = block_stop_signals();
  actors::node_options o;
  o.identity = identity(*a);
  o.join = *join;
  o.listen = *listen;
  o.node = static_cast<std::uint32_t>(*id);
  o.rack = static_cast<std::uint32_t>(*rack);
  o.region = a->get_or("region", "");
  if (auto ok = cluster::check_region(o.region); !ok) return fail("node", ok.error());
  o.devices = static_cast<std::uint32_t>(*devices);
  o.device_memory_bytes = static_cast<std::uint64_t>(*memory);
  o.device_threads = static_cast<std::uint32_t>(*threads);
  o.step_stop = !a->has("no-step-stop");
  o.device_kind = a->get_or("device-kind", "cpu");
  if (auto k = gpu::parse_kind_request(o.device_kind); !k)
    return fail("node", {errc::invalid_argument, "--device-kind: " + k.error().message});
  o.engine = a->get_or("engine", "");
  o.join_timeout_ms = static_cast<std::uint32_t>(*join_timeout);
  o.event_log = *events;
  o.model_dir = a->get_or("model-dir", "");
  o.model_store = a->get_or("model-store", "");
  o.model_cache_dir = a->get_or("model-cache-dir", "");
  if (!o.model_store.empty() && o.model_cache_dir.empty())
    return fail("node", {errc::invalid_argument, "--model-store needs --model-cache-dir: a directory on this node's "
                                                 "own disk that fetched models are copied to"});
  o.model_cache_bytes = static_cast<std::uint64_t>(*cache_mb) << 20;
  set_transport(*a, o);
  auto node = actors::node_process::start(std::move(o));
  if (!node) return fail("node", node.error());
  auto* n = node->get();
  auto status = status_port(*a, {[n] { return n->metrics_text(); }, [n] { return n->ready(); }});
  if (!status) return fail("node", status.error());
  std::printf("exaserve node %lld joined %s:%u; gateways reach it at %s:%u\n", static_cast<long long>(*id),
              join->host.c_str(), join->port, listen->host.c_str(), (*node)->port());
  if (*status) std::printf("exaserve node %lld status port at %s\n", static_cast<long long>(*id), (*status)->url().c_str());
  std::fflush(stdout);
  wait_for_stop(signals);
  // Drained before exit: the slots move first, what is in flight finishes
  // (or resumes elsewhere past the deadline), and only then do we go.
  if (*drain_deadline > 0) (*node)->drain(std::chrono::milliseconds(*drain_deadline));
  if (*status) (*status)->stop();
  (*node)->stop();
  spdlog::info("event=stopped role=node");
  return 0;
}

int cmd_gateway(int argc, char** argv) {
  auto a = args::parse(argc, argv, 2, gateway_flags);
  if (!a) return fail("gateway", a.error());
  if (a->has("help")) {
    std::printf("usage: exaserve gateway --join HOST:PORT [--http-port P] [--rpc-port P]\n%s",
                describe_flags(gateway_flags).c_str());
    return 0;
  }
  auto join = address_flag(*a, "join", "", true);
  if (!join) return fail("gateway", join.error());
  frontdoor_config door_config = default_serve_config().server;
  door_config.host = a->get_or("host", door_config.host);
  auto http = a->get_int("http-port", door_config.http_port, 0, 65535);
  auto rpc = a->get_int("rpc-port", door_config.rpc_port, 0, 65535);
  auto deadline = a->get_int("request-deadline-ms", 120000, 100, 86400000);
  auto join_timeout = a->get_int("join-timeout-ms", 60000, 100, 86400000);
  for (const auto* v : {&http, &rpc, &deadline, &join_timeout})
    if (!*v) return fail("gateway", v->error());
  auto events = event_log_flag_value(*a);
  if (!events) return fail("gateway", events.error());
  door_config.http_port = static_cast<std::uint16_t>(*http);
  door_config.rpc_port = static_cast<std::uint16_t>(*rpc);
  auto keys = keys_from_flags(*a);
  if (!keys) return fail("gateway", keys.error());
  door_config.keys = *keys;
  // Limits are shared with the other gateways through the controller.
  if (door_config.keys) door_config.quotas = std::make_shared<auth::quota_board>();
  if (auto ok = door_tls_from_flags(*a, door_config); !ok) return fail("gateway", ok.error());
  auto signals = block_stop_signals();
  block_reload_signal(signals);  // SIGHUP re-reads the keys file
  actors::gateway_options o;
  o.identity = identity(*a);
  o.join = *join;
  o.request_deadline_ms = static_cast<std::uint32_t>(*deadline);
  o.region = a->get_or("region", "");
  if (auto ok = cluster::check_region(o.region); !ok) return fail("gateway", ok.error());
  o.chat_template = a->get_or("chat-template", "");
  if (auto ok = jinja::check_template_override(o.chat_template); !ok) return fail("gateway", ok.error());
  o.join_timeout_ms = static_cast<std::uint32_t>(*join_timeout);
  o.event_log = *events;
  o.quotas = door_config.quotas;
  set_transport(*a, o);
  auto gateway = actors::gateway_process::start(std::move(o));
  if (!gateway) return fail("gateway", gateway.error());
  auto door = frontdoor::start(door_config, (*gateway)->backend());
  if (!door) {
    (*gateway)->stop();
    return fail("gateway", door.error());
  }
  std::printf("exaserve gateway serving HTTP at %s and RPC on %s:%u (controller %s:%u)\n", (*door)->http_url().c_str(),
              door_config.host.c_str(), (*door)->rpc_port(), join->host.c_str(), join->port);
  std::fflush(stdout);
  const int sig = wait_for_stop_signal(signals, door_config.keys.get(), door->get());
  spdlog::info("event=shutdown signal={}", sig == SIGINT ? "SIGINT" : "SIGTERM");
  // No new requests; those in flight finish (up to a grace period) before
  // the doors close.
  (*door)->stop_accepting();
  drain(*(*gateway)->backend(), std::chrono::seconds(10));
  (*door)->stop();
  (*gateway)->stop();
  spdlog::info("event=stopped role=gateway");
  return 0;
}

}  // namespace exa::app
