#include "actors/distributed.hpp"
#include "actors/tls_error_queue.hpp"

#include <caf/actor_registry.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/middleman_actor.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/openssl/publish.hpp>
#include <caf/openssl/remote_actor.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <spdlog/spdlog.h>

#include <charconv>
#include <cstdlib>
#include <random>
#include <set>
#include <thread>
#include <unistd.h>

#include "actors/cluster_metrics.hpp"
#include "actors/cluster_supervisor.hpp"
#include "actors/gateway_bridge.hpp"
#include "actors/hub_actor.hpp"
#include "actors/messages.hpp"
#include "actors/transport.hpp"
#include "actors/uplink_actor.hpp"
#include "cluster/journal.hpp"
#include "cluster/membership.hpp"
#include "gpu/device_select.hpp"
#include "metrics/aggregate.hpp"
#include "metrics/prometheus.hpp"

#ifndef EXASERVE_VERSION
#define EXASERVE_VERSION "unknown"
#endif

namespace exa::actors {
namespace {

/// Default transport timeout for nodes and gateways, which learn the
/// cluster's timings only after they connected: the default detector
/// settings' confirmation (5 × 2 s + 30 s) plus margin.
constexpr std::uint32_t default_transport_timeout_ms = 44000;
/// How long an uplink waits for a reconnect step, and its longest backoff.
constexpr std::uint32_t uplink_request_timeout_ms = 5000;
constexpr std::uint32_t uplink_retry_max_ms = 2000;

class net_config : public caf::actor_system_config {
 public:
  /// `light_idle`: nodes and the controller, whose work is a trickle of
  /// control messages; many such processes share a host in tests and
  /// scale runs, and CAF's default idle polling (about 100 + 500 polls after
  /// every burst, and a stealing wake-up every 10 ms) costs each a few
  /// percent of a core. Workers still wake at once for their own jobs.
  net_config(std::uint32_t transport_timeout_ms, bool light_idle, const tls_options& tls)
      : net_config(transport_timeout_ms, tls) {
    if (!light_idle) return;
    set("work-stealing.aggressive-poll-attempts", std::size_t{10});
    set("work-stealing.moderate-poll-attempts", std::size_t{20});
    set("work-stealing.relaxed-sleep-duration", caf::timespan{std::chrono::milliseconds(100)});
  }
  net_config(std::uint32_t transport_timeout_ms, const tls_options& tls) {
    load<caf::io::middleman>();
    if (tls.enabled()) {
      // Both sides then require a peer certificate that verifies against
      // the CA (SSL_VERIFY_PEER | FAIL_IF_NO_PEER_CERT): a process holding
      // no certificate of this cluster's CA cannot join or send a message.
      load<caf::openssl::manager>();
      // One dying peer must not close every other connection (see
      // tls_error_queue.hpp); a build where the guard is not in front of
      // libssl says so once.
      if (!tls_error_queue_guarded())
        spdlog::warn("event=tls_error_queue_unguarded detail=\"one TLS peer's abrupt death may close other "
                     "connections of this process\"");
      openssl_certificate = tls.cert;
      openssl_key = tls.key;
      openssl_cafile = tls.ca;
    }
    register_message_types(*this);
    set("logger.verbosity", caf::atom("quiet"));
    set("logger.console", caf::atom("none"));
    set("scheduler.max-threads", static_cast<std::size_t>(std::max(2u, std::thread::hardware_concurrency())));
    // Every role shares one application id; the cluster name and build
    // version are checked by our own hello, so a refusal names its reason
    // in both processes' logs.
    set("middleman.app-identifiers", std::vector<std::string>{"exaserve"});
    // A frozen peer sends nothing: heartbeats let the transport notice it
    // too, after our own detector (see transport_timeout_ms) has decided.
    set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(1000)});
    set("middleman.connection-timeout", caf::timespan{std::chrono::milliseconds(transport_timeout_ms)});
  }
};

std::string format_host_port(const host_port& hp) { return hp.host + ":" + std::to_string(hp.port); }

// Publishes over TLS when the OpenSSL module is loaded, else plain TCP.
caf::expected<std::uint16_t> publish(caf::actor_system& sys, const caf::actor& whom, const host_port& at) {
  if (sys.has_openssl_manager()) return caf::openssl::publish(whom, at.port, at.host.c_str(), true);
  return sys.middleman().publish(whom, at.port, at.host.c_str(), true);
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

cluster::member_identity member(const cluster_identity& id, std::string role) {
  return {id.cluster, id.version.empty() ? build_version() : id.version, std::move(role)};
}

// The controller's published front: answers hello with the current control
// plane (looked up each time: the supervisor may have restarted it).
caf::behavior directory_actor(caf::event_based_actor* self, cluster::member_identity ours, welcome_msg timings) {
  return {
      [=](const hello_msg& h) -> caf::result<welcome_msg> {
        const cluster::member_identity joining{h.who.cluster, h.who.version, h.who.role};
        if (auto ok = cluster::check_join(ours, joining); !ok) {
          spdlog::error("event=join_refused role={} node={} peer_cluster={} peer_version={} reason=\"{}\"", h.who.role,
                        h.node, h.who.cluster, h.who.version, ok.error().message);
          return to_caf(ok.error());
        }
        auto& reg = self->home_system().registry();
        welcome_msg w = timings;
        w.controller = caf::actor_cast<caf::actor>(reg.get(controller_atom::value));
        w.health_monitor = caf::actor_cast<caf::actor>(reg.get(health_atom::value));
        if (!w.controller || !w.health_monitor)
          return to_caf({errc::unavailable, "the controller is restarting; join again shortly"});
        spdlog::info("event=join_accepted role={} node={}", h.who.role, h.node);
        return w;
      },
  };
}

// Connects a process to the controller and says hello, retrying with
// backoff while the controller cannot be reached (not up yet, or swamped
// by a whole cluster starting at once) until `timeout_ms`. A refusal ends
// it at once. Errors name the address and the reason.
expected<std::pair<caf::actor, welcome_msg>> join(caf::actor_system& sys, const host_port& at,
                                                  const cluster::member_identity& who, cluster::node_id node,
                                                  std::uint32_t timeout_ms) {
  const std::string where = format_host_port(at);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto backoff = std::chrono::milliseconds(100);
  for (std::uint32_t attempt = 1;; ++attempt) {
    auto dir = sys.has_openssl_manager() ? caf::openssl::remote_actor(sys, at.host, at.port)
                                         : sys.middleman().remote_actor(at.host, at.port);
    if (!dir) {
      std::string why = sys.render(dir.error());
      if (why.find("handshake") != std::string::npos)
        why += " (a refused TLS handshake looks like this: both sides need --tls-cert, --tls-key and --tls-ca with "
               "certificates of the same cluster CA)";
      if (std::chrono::steady_clock::now() + backoff > deadline)
        return make_error(errc::unavailable, "cannot reach the controller at " + where + " (" +
                                                 std::to_string(attempt) + " attempts): " + why);
      spdlog::warn("event=join_retry role={} node={} attempt={} controller={} error=\"{}\"", who.role, node, attempt,
                   where, why);
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
      continue;
    }
    caf::scoped_actor self{sys};
    expected<std::pair<caf::actor, welcome_msg>> out = make_error(errc::internal, "no reply");
    self->request(*dir, std::chrono::milliseconds(std::max(1000u, timeout_ms / 2)),
                  hello_msg{{who.cluster, who.version, who.role}, node})
        .receive([&](const welcome_msg& w) { out = std::make_pair(*dir, w); },
                 [&](const caf::error& e) {
                   const error err = from_caf(e);
                   out = make_error(err.code, "the controller at " + where + " refused this " + who.role + ": " +
                                                  err.message);
                 });
    return out;
  }
}

uplink_config make_uplink(const host_port& at, const cluster::member_identity& who, cluster::node_id node) {
  uplink_config u;
  u.host = at.host;
  u.port = at.port;
  u.hello = hello_msg{{who.cluster, who.version, who.role}, node};
  u.request_timeout_ms = uplink_request_timeout_ms;
  u.retry_max_ms = uplink_retry_max_ms;
  return u;
}

// A gateway's link to the nodes: for every node the controller announces,
// connect to it directly (so tokens flow node -> gateway), then subscribe
// the router at its hub.
caf::behavior gateway_agent(caf::event_based_actor* self, caf::actor router) {
  return {
      [=](const node_announce& n) {
        auto hp = parse_host_port(n.address);
        if (n.address.empty() || !hp) {
          self->send(n.hub, subscribe_msg{router});
          return;
        }
        self->request(connector(self->home_system()), std::chrono::seconds(10), caf::connect_atom::value, hp->host, hp->port)
            .then(
                [=](const caf::node_id&, const caf::strong_actor_ptr& hub, const std::set<std::string>&) {
                  auto direct = caf::actor_cast<caf::actor>(hub);
                  spdlog::info("event=gateway_node_connected node={} address={}", n.node, n.address);
                  self->send(direct ? direct : n.hub, subscribe_msg{router});
                },
                [=](const caf::error& e) {
                  spdlog::warn("event=gateway_node_unreachable node={} address={} error=\"{}\" "
                               "detail=\"its traffic goes through the controller\"",
                               n.node, n.address, caf::to_string(e));
                  self->send(n.hub, subscribe_msg{router});
                });
      },
  };
}

}  // namespace

caf::io::middleman_actor connector(caf::actor_system& sys) {
  return sys.has_openssl_manager() ? sys.openssl_manager().actor_handle() : sys.middleman().actor_handle();
}

expected<void> check_transport(const tls_options& tls, bool insecure, const std::vector<host_port>& addresses) {
  if (tls.enabled()) {
    const std::pair<const char*, const std::string*> files[] = {
        {"--tls-cert", &tls.cert}, {"--tls-key", &tls.key}, {"--tls-ca", &tls.ca}};
    for (const auto& [flag, value] : files)
      if (value->empty())
        return make_error(errc::invalid_argument,
                          std::string(flag) + " is missing: TLS needs all of --tls-cert, --tls-key and --tls-ca");
    for (const auto& [flag, value] : files)
      if (::access(value->c_str(), R_OK) != 0)
        return make_error(errc::invalid_argument, std::string(flag) + " '" + *value + "' cannot be read");
    return {};
  }
  if (insecure) return {};
  for (const auto& a : addresses)
    if (!is_loopback(a.host))
      return make_error(errc::invalid_argument,
                        "plain TCP on " + format_host_port(a) + " is not loopback: give --tls-cert, --tls-key and --tls-ca "
                        "(exaserve gen-certs DIR writes them), or --insecure to run unauthenticated on purpose");
  return {};
}

std::string build_version() {
  if (const char* v = std::getenv("EXASERVE_PROTOCOL_VERSION"); v && *v) return v;
  return std::string("exaserve/") + EXASERVE_VERSION;
}

expected<host_port> parse_host_port(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
    return make_error(errc::invalid_argument, "expected HOST:PORT, got '" + text + "'");
  host_port out;
  out.host = text.substr(0, colon);
  unsigned port = 0;
  const char* b = text.data() + colon + 1;
  const char* e = text.data() + text.size();
  const auto [end, ec] = std::from_chars(b, e, port);
  if (ec != std::errc() || end != e || port > 65535)
    return make_error(errc::invalid_argument, "port of '" + text + "' must be a number in [0, 65535]");
  out.port = static_cast<std::uint16_t>(port);
  return out;
}

// ------------------------------------------------------------- controller

struct controller_process::impl {
  impl(std::uint32_t transport_ms, const tls_options& tls) : config(transport_ms, true, tls), system(config) {}
  net_config config;
  caf::actor_system system;
  caf::actor root;
  caf::actor directory;
  std::shared_ptr<cluster_metrics> metrics;
  std::uint16_t port = 0;
  bool stopped = false;
};

controller_process::controller_process(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
controller_process::~controller_process() { stop(); }
std::uint16_t controller_process::port() const { return impl_->port; }
std::string controller_process::metrics_text() const { return metrics::render_prometheus(*impl_->metrics->registry); }

expected<std::unique_ptr<controller_process>> controller_process::start(controller_options o) {
  const auto& c = o.cluster;
  if (auto ok = check_transport(o.tls, o.insecure, {o.listen}); !ok) return std::unexpected(ok.error());
  auto p = std::make_unique<impl>(
      cluster::transport_timeout_ms(c.heartbeat_interval_ms, c.suspect_after_missed, c.observation_window_ms), o.tls);
  auto metrics = cluster_metrics::create();
  p->metrics = metrics;
  auto plan = make_cluster_plan(c, metrics);
  if (!plan) return std::unexpected(plan.error());
  // Nodes are not listed: they join.
  plan->nodes.clear();
  plan->controller.nodes.clear();
  plan->health.nodes.clear();
  plan->router_is_hub = true;
  plan->controller.deploy_after_nodes = std::max(1u, o.deploy_after_nodes);
  plan->controller.migrate_on_link_loss = false;  // a dropped connection is a suspicion here
  if (o.state_dir.empty()) return make_error(errc::invalid_argument, "the controller needs a state directory");
  cluster::journal_recovery recovery;
  auto journal = cluster::journal::open(o.state_dir, &recovery);
  if (!journal) return std::unexpected(journal.error());
  if (recovery.torn_tail)
    spdlog::warn("event=journal_torn_tail dir={} record={} offset={} detail=\"the last record was cut short by a "
                 "crash and is dropped; everything before it is recovered\"",
                 o.state_dir, recovery.torn_record, recovery.torn_offset);
  spdlog::info("event=journal_opened dir={} from_snapshot={} records_replayed={} deployments={}", o.state_dir,
               recovery.from_snapshot, recovery.records_replayed, journal->state().deployments.size());
  plan->controller.journal = std::make_shared<cluster::journal>(std::move(*journal));
  plan->controller.reconcile_window_ms = cluster::reconcile_window_ms(
      cluster::node_lease_ms(c.heartbeat_interval_ms, c.suspect_after_missed, c.observation_window_ms),
      c.heartbeat_interval_ms, uplink_request_timeout_ms, uplink_retry_max_ms);
  p->root = p->system.spawn(cluster_supervisor, std::move(*plan));
  welcome_msg timings;
  timings.heartbeat_interval_ms = c.heartbeat_interval_ms;
  timings.lease_ms = cluster::node_lease_ms(c.heartbeat_interval_ms, c.suspect_after_missed, c.observation_window_ms);
  timings.engine = c.engine;
  p->directory = p->system.spawn(directory_actor, member(o.identity, "controller"), timings);
  auto port = publish(p->system, p->directory, o.listen);
  if (!port)
    return make_error(errc::unavailable, "cannot listen on " + format_host_port(o.listen) + ": " +
                                             p->system.render(port.error()));
  p->port = *port;
  spdlog::info("event=controller_listening address={}:{} cluster={} version={}", o.listen.host, p->port,
               o.identity.cluster, member(o.identity, "").version);
  return std::unique_ptr<controller_process>(new controller_process(std::move(p)));
}

void controller_process::stop() {
  if (!impl_ || impl_->stopped) return;
  impl_->stopped = true;
  caf::anon_send_exit(impl_->directory, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(impl_->root, caf::exit_reason::user_shutdown);
  impl_->directory = nullptr;
  impl_->root = nullptr;
}

// ------------------------------------------------------------------- node

struct node_process::impl {
  impl(std::uint32_t transport_ms, const tls_options& tls) : config(transport_ms, true, tls), system(config) {}
  net_config config;
  caf::actor_system system;
  caf::actor root;
  caf::actor hub;
  caf::actor uplink;
  std::shared_ptr<cluster_metrics> metrics;
  std::uint32_t node = 0;
  std::uint32_t rack = 0;
  std::uint16_t port = 0;
  bool stopped = false;
};

node_process::node_process(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
node_process::~node_process() { stop(); }
std::uint16_t node_process::port() const { return impl_->port; }
std::string node_process::metrics_text() const {
  // Every series says which node and rack it comes from, so an aggregator
  // above can keep racks apart (or drop the node) without being told.
  metrics::aggregation_rule own;
  own.add_labels = {{"node", std::to_string(impl_->node)}, {"rack", std::to_string(impl_->rack)}};
  const metrics::registry_snapshot snapshot[] = {impl_->metrics->registry->snapshot()};
  return metrics::render_prometheus(metrics::aggregate(snapshot, own));
}

expected<void> node_process::ready() const {
  const auto family = impl_->metrics->node_replicas->snapshot();
  const auto node = std::to_string(impl_->node);
  std::string starting;
  double total = 0;
  for (const auto& s : family.series) {
    if (s.label_values.size() != 2 || s.label_values[0] != node || s.value <= 0) continue;
    const auto& state = s.label_values[1];
    if (state != "creating" && state != "loading" && state != "warming") continue;
    total += s.value;
    starting += (starting.empty() ? "" : ", ") + state + " " + metrics::format_sample_value(s.value);
  }
  if (total > 0)
    return make_error(errc::unavailable, metrics::format_sample_value(total) + " replicas still starting (" + starting + ")");
  return {};
}

namespace {
// Replicas of `node` in a live state, from its gauge of replicas by state.
double live_replicas(const cluster_metrics& m, std::uint32_t node) {
  const auto family = m.node_replicas->snapshot();
  const auto id = std::to_string(node);
  double total = 0;
  for (const auto& s : family.series)
    if (s.label_values.size() == 2 && s.label_values[0] == id && s.label_values[1] != "stopped" &&
        s.label_values[1] != "failed")
      total += std::max(0.0, s.value);
  return total;
}
}  // namespace

std::size_t node_process::drain(std::chrono::milliseconds deadline) {
  auto& p = *impl_;
  if (p.stopped) return 0;
  const double before = live_replicas(*p.metrics, p.node);
  spdlog::info("event=node_draining node={} replicas={} deadline_ms={}", p.node, before, deadline.count());
  if (before == 0) return 0;
  // Through the uplink, which forwards whatever is not its own to the controller.
  caf::anon_send(p.uplink, node_leaving{p.node, static_cast<std::uint32_t>(deadline.count())});
  const auto until = std::chrono::steady_clock::now() + deadline + std::chrono::seconds(5);
  double left = before;
  while (std::chrono::steady_clock::now() < until) {
    left = live_replicas(*p.metrics, p.node);
    if (left == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (left > 0)
    spdlog::warn("event=node_drain_incomplete node={} replicas_left={} detail=\"stopping anyway; their requests "
                 "resume elsewhere\"",
                 p.node, left);
  else
    spdlog::info("event=node_drained node={} replicas={}", p.node, before);
  return static_cast<std::size_t>(left);
}

expected<std::unique_ptr<node_process>> node_process::start(node_options o) {
  if (o.devices == 0 || o.devices > 64) return make_error(errc::invalid_argument, "--devices must be in [1, 64]");
  if (!o.engine.empty() && o.engine != "cpu" && o.engine != "null")
    return make_error(errc::invalid_argument, "--engine must be cpu or null, got '" + o.engine + "'");
  if (auto ok = check_transport(o.tls, o.insecure, {o.join, o.listen}); !ok) return std::unexpected(ok.error());
  // The devices before the controller hears of us: a node that cannot have
  // the GPUs it was asked for never joins.
  auto request = gpu::parse_kind_request(o.device_kind);
  if (!request) return make_error(errc::invalid_argument, "--device-kind: " + request.error().message);
  auto kind = gpu::resolve_device_kind(*request, o.devices);
  if (!kind) return std::unexpected(kind.error());
  device_config device;
  device.memory_bytes = o.device_memory_bytes;
  device.threads = o.device_threads;
  std::vector<std::shared_ptr<gpu::device>> opened;
  if (kind->kind != gpu::device_kind::cpu) {  // GPUs: opened once; the ledger gets what they reserved
    auto d = gpu::open_devices(kind->kind, o.devices, device_options_of(device));
    if (!d) return std::unexpected(d.error());
    opened = std::move(*d);
    device.memory_bytes = gpu::min_memory_budget(opened);
  }
  auto p = std::make_unique<impl>(default_transport_timeout_ms, o.tls);
  const auto who = member(o.identity, "node");
  auto joined = join(p->system, o.join, who, o.node, o.join_timeout_ms);
  if (!joined) return std::unexpected(joined.error());
  const welcome_msg& w = joined->second;
  // The node and its replicas talk to the control plane through the uplink,
  // which outlives a controller restart.
  p->uplink = p->system.spawn(uplink_actor, make_uplink(o.join, who, o.node), w);
  p->hub = p->system.spawn(hub_actor);
  auto port = publish(p->system, p->hub, o.listen);
  if (!port)
    return make_error(errc::unavailable, "cannot listen on " + format_host_port(o.listen) + ": " +
                                             p->system.render(port.error()));
  p->port = *port;

  node_config nc;
  nc.id = o.node;
  nc.rack = o.rack;
  nc.region = o.region;
  nc.devices = o.devices;
  nc.device = device;
  nc.device.measure_wall_time = true;
  nc.device_kind = kind->kind;
  nc.opened_devices = std::move(opened);
  nc.heartbeat_interval_ms = w.heartbeat_interval_ms;
  nc.lease_ms = w.lease_ms;
  nc.replica_step_stop = o.step_stop;
  nc.metrics = cluster_metrics::create();
  p->metrics = nc.metrics;
  p->node = o.node;
  p->rack = o.rack;
  nc.address = o.listen.host + ":" + std::to_string(p->port);
  nc.engine = o.engine;
  nc.hooks.log = o.event_log;
  nc.model_dir = o.model_dir;
  nc.model_store = o.model_store;
  nc.model_cache_dir = o.model_cache_dir;
  nc.model_cache_bytes = o.model_cache_bytes;
  cluster_plan plan;
  plan.nodes.push_back(nc);
  plan.metrics = nc.metrics;
  p->root = p->system.spawn(nodes_supervisor, std::move(plan), p->uplink, p->hub, p->uplink);
  spdlog::info("event=node_joined node={} rack={} devices={} device_kind={} device_memory_bytes={} address={} "
               "heartbeat_interval_ms={} lease_ms={}",
               o.node, o.rack, o.devices, gpu::to_string(kind->kind), device.memory_bytes, nc.address,
               w.heartbeat_interval_ms, w.lease_ms);
  return std::unique_ptr<node_process>(new node_process(std::move(p)));
}

void node_process::stop() {
  if (!impl_ || impl_->stopped) return;
  impl_->stopped = true;
  caf::anon_send_exit(impl_->root, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(impl_->hub, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(impl_->uplink, caf::exit_reason::user_shutdown);
  impl_->root = nullptr;
  impl_->hub = nullptr;
  impl_->uplink = nullptr;
}

// ---------------------------------------------------------------- gateway

struct gateway_process::impl {
  impl(std::uint32_t transport_ms, const tls_options& tls) : config(transport_ms, tls), system(config) {}
  net_config config;
  caf::actor_system system;
  caf::actor router;
  caf::actor agent;
  caf::actor uplink;
  std::shared_ptr<api::gateway_backend> backend;
  bool stopped = false;
};

gateway_process::gateway_process(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
gateway_process::~gateway_process() { stop(); }
std::shared_ptr<api::gateway_backend> gateway_process::backend() const { return impl_->backend; }

expected<std::unique_ptr<gateway_process>> gateway_process::start(gateway_options o) {
  if (auto ok = check_transport(o.tls, o.insecure, {o.join}); !ok) return std::unexpected(ok.error());
  auto p = std::make_unique<impl>(default_transport_timeout_ms, o.tls);
  const auto who = member(o.identity, "gateway");
  auto joined = join(p->system, o.join, who, 0, o.join_timeout_ms);
  if (!joined) return std::unexpected(joined.error());
  const welcome_msg& w = joined->second;
  auto metrics = cluster_metrics::create();
  router_config rc;
  rc.await_controller = true;  // a request sent before the controller's list arrives waits for it
  rc.table.default_policy = o.default_routing;
  rc.region = o.region;
  rc.admission.queued_per_model_max = o.queued_per_model_max;
  rc.admission.queued_global_max = o.queued_global_max;
  rc.request_deadline_ms = o.request_deadline_ms;
  rc.max_attempts = o.max_attempts;
  rc.chat_template = o.chat_template;
  rc.hooks.log = o.event_log;
  // 24 random bits per gateway above a 40-bit counter: gateways that share
  // replicas do not reuse each other's request numbers.
  std::random_device rd;
  rc.request_number_base = (std::uint64_t{rd()} & 0xFFFFFFu) << 40;
  rc.quotas = o.quotas;
  if (o.fair_across_gateways) rc.fair_shares = std::make_shared<cluster::fair_share_board>();
  rc.gateway_id = (std::uint64_t{rd()} << 32) | rd();
  p->router = p->system.spawn(router_actor, rc, metrics);
  register_as(p->system, router_atom::value, p->router);
  register_as(p->system, controller_atom::value, w.controller);
  p->agent = p->system.spawn(gateway_agent, p->router);
  auto uplink = make_uplink(o.join, who, 0);
  uplink.gateway = gateway_join{p->router, p->agent};
  p->uplink = p->system.spawn(uplink_actor, uplink, w);
  caf::anon_send(w.controller, gateway_join{p->router, p->agent});
  p->backend = make_gateway_bridge(p->system, metrics);
  spdlog::info("event=gateway_joined controller={}", format_host_port(o.join));
  return std::unique_ptr<gateway_process>(new gateway_process(std::move(p)));
}

void gateway_process::stop() {
  if (!impl_ || impl_->stopped) return;
  impl_->stopped = true;
  caf::anon_send_exit(impl_->uplink, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(impl_->agent, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(impl_->router, caf::exit_reason::user_shutdown);
  impl_->uplink = nullptr;
  auto& reg = impl_->system.registry();
  reg.erase(router_atom::value);
  reg.erase(controller_atom::value);
  impl_->agent = nullptr;
  impl_->router = nullptr;
}

}  // namespace exa::actors
