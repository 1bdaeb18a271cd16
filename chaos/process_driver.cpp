#include "chaos/process_driver.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <memory>
#include <set>
#include <thread>

#include "chaos/attribution.hpp"
#include "chaos/child_process.hpp"
#include "chaos/event_merge.hpp"
#include "chaos/host_link.hpp"
#include "chaos/invariants.hpp"
#include "chaos/workload_client.hpp"

namespace exa::chaos {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

std::int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The cluster's processes and their links.
class process_cluster {
 public:
  process_cluster(const process_run_config& cfg, bool namespaces) : cfg_(cfg), namespaces_(namespaces) {
    tag_ = static_cast<unsigned>(::getpid() % 10000);
  }
  ~process_cluster() { stop_all(); }

  expected<void> start() {
    const auto& c = cfg_.plan.cluster;
    // A work directory used before: its logs and journal would mix with this run's.
    std::error_code ec;
    fs::remove_all(dir("events"), ec);
    fs::remove_all(dir("state"), ec);
    fs::create_directories(dir("events"));
    if (auto ok = write_config(); !ok) return ok;
    if (namespaces_) {
      if (c.nodes > 250) return make_error(errc::unsupported, "network namespaces: at most 250 nodes per run");
      auto certs = child_process::start({cfg_.exaserve_bin, "gen-certs", dir("certs"), "--force"}, cfg_.work_dir,
                                        "gen-certs");
      if (!certs) return std::unexpected(certs.error());
      const auto rc = (*certs)->wait_exit(milliseconds(60000));
      if (rc != 0) return make_error(errc::io_error, "gen-certs failed:\n" + (*certs)->err());
      for (std::uint32_t n = 0; n < c.nodes; ++n) {
        auto link = host_link::create(tag_, n);
        if (!link) return make_error(errc::unavailable, fmt::format("cannot set up the namespace of node {}", n));
        links_.push_back(std::move(link));
      }
      netem_ = links_.front()->netem_works();
    }
    if (auto ok = start_controller(); !ok) return ok;
    for (std::uint32_t n = 0; n < c.nodes; ++n)
      if (auto ok = start_node(n); !ok) return ok;
    for (std::uint32_t g = 0; g < c.gateways; ++g)
      if (auto ok = start_gateway(g); !ok) return ok;
    return {};
  }

  bool namespaces() const { return namespaces_; }
  bool netem_available() const { return netem_; }
  host_link* link(std::uint32_t node) { return node < links_.size() ? links_[node].get() : nullptr; }
  child_process* node(std::uint32_t n) { return n < nodes_.size() ? nodes_[n].get() : nullptr; }
  child_process* controller() { return controller_.get(); }
  child_process* gateway(std::uint32_t g) { return g < gateways_.size() ? gateways_[g].get() : nullptr; }

  // HTTP ports of the gateways still running.
  std::vector<std::uint16_t> live_gateway_ports() {
    std::vector<std::uint16_t> out;
    for (std::size_t g = 0; g < gateways_.size(); ++g)
      if (gateways_[g]->running()) out.push_back(http_ports_[g]);
    return out;
  }

  expected<void> start_controller() {
    const auto& c = cfg_.plan.cluster;
    const std::string host = namespaces_ ? "0.0.0.0" : "127.0.0.1";
    const std::string name = controller_starts_ == 0 ? "controller" : fmt::format("controller-{}", controller_starts_ + 1);
    std::vector<std::string> argv{cfg_.exaserve_bin, "controller", "--listen", host + ":" + std::to_string(controller_port_),
                                  "--config", dir("cluster.ini"), "--state-dir", dir("state"), "--wait-nodes",
                                  std::to_string(c.nodes), "--event-log", event_log_path(name)};
    add_transport(argv, "controller");
    auto p = child_process::start(argv, cfg_.work_dir, name);
    if (!p) return std::unexpected(p.error());
    auto out = (*p)->wait_for("listening on", timeout());
    if (!out) return std::unexpected(out.error());
    const auto port = number_after(*out, "listening on " + host + ":");
    if (!port) return make_error(errc::internal, "the controller did not say its port:\n" + *out);
    controller_port_ = static_cast<std::uint16_t>(*port);
    controller_ = std::move(*p);
    ++controller_starts_;
    return {};
  }

  std::vector<std::string> event_logs() const { return logs_; }

  // Processes that are gone though the driver did not end them (`killed`:
  // the pids its faults killed): each a crash, with its last words.
  std::vector<std::string> exited_on_their_own(const std::set<pid_t>& killed) {
    std::vector<child_process*> all{controller_.get()};
    for (auto& n : nodes_) all.push_back(n.get());
    for (auto& g : gateways_) all.push_back(g.get());
    std::vector<std::string> out;
    for (child_process* p : all) {
      if (!p || killed.count(p->pid()) || p->running()) continue;
      const auto status = p->wait_exit(milliseconds(0));
      std::string err = p->err();
      while (!err.empty() && err.back() == '\n') err.pop_back();
      const auto nl = err.rfind('\n');
      out.push_back(fmt::format("{} (pid {}) exited with status {} while no fault ended it; its last line: {}",
                                p->name(), p->pid(), status.value_or(-1),
                                nl == std::string::npos ? err : err.substr(nl + 1)));
    }
    return out;
  }

  // Every process stops: SIGTERM (SIGCONT first, for frozen ones), a grace
  // period, then SIGKILL; all reaped.
  void stop_all() {
    for (auto& g : gateways_) g->stop(milliseconds(5000));
    for (auto& n : nodes_) n->stop(milliseconds(5000));
    if (controller_) controller_->stop(milliseconds(5000));
    for (auto& l : links_)
      if (l) l->heal();
  }

 private:
  std::string dir(const std::string& name) const { return cfg_.work_dir + "/" + name; }
  milliseconds timeout() const { return milliseconds(static_cast<std::int64_t>(cfg_.start_timeout_s * 1000)); }
  std::string event_log_path(const std::string& process) {
    logs_.push_back(dir("events/" + process + ".jsonl"));
    return logs_.back();
  }

  expected<void> write_config() {
    const auto& c = cfg_.plan.cluster;
    std::ofstream f(dir("cluster.ini"));
    f << "# written by exaserve chaos --processes for plan " << cfg_.plan.name << "\n"
      << "[cluster]\n"
      << "engine = " << c.engine << "\n"
      << "heartbeat_interval_ms = " << std::max(10u, c.heartbeat_interval_ms) << "\n"
      << "suspect_after_missed = " << c.suspect_after_missed << "\n"
      << "observation_window_ms = " << c.observation_window_ms << "\n"
      << "request_deadline_ms = " << std::max(100u, c.request_deadline_ms) << "\n"
      << "kv_tokens = 4096\n"
      << "[deployment " << workload_deployment << "]\n"
      << "model = " << cfg_.model_file << "\n"
      << "replicas = " << c.replicas << "\n";
    if (!f) return make_error(errc::io_error, "cannot write " + dir("cluster.ini"));
    return {};
  }

  void add_transport(std::vector<std::string>& argv, const std::string& role) const {
    if (!namespaces_) return;  // loopback: plain TCP is allowed
    for (const auto& [flag, file] : {std::pair{"--tls-cert", role + ".pem"}, std::pair{"--tls-key", role + ".key"},
                                     std::pair{"--tls-ca", std::string("ca.pem")}}) {
      argv.push_back(flag);
      argv.push_back(dir("certs/" + file));
    }
  }

  expected<void> start_node(std::uint32_t n) {
    const auto& c = cfg_.plan.cluster;
    const std::string name = fmt::format("node-{}", n);
    std::vector<std::string> argv;
    std::string join = "127.0.0.1:" + std::to_string(controller_port_), listen = "127.0.0.1:0";
    if (namespaces_) {
      argv = {"/usr/sbin/ip", "netns", "exec", links_[n]->ns()};  // execs exaserve: the same pid
      join = links_[n]->host_ip() + ":" + std::to_string(controller_port_);
      listen = links_[n]->ns_ip() + ":0";
    }
    for (const std::string& a : {cfg_.exaserve_bin, std::string("node"), std::string("--join"), join,
                                 std::string("--node-id"), std::to_string(n), std::string("--rack"),
                                 std::to_string(n % c.racks), std::string("--devices"),
                                 std::to_string(c.devices_per_node), std::string("--device-memory"),
                                 std::to_string(256ull << 20), std::string("--engine"), c.engine,
                                 std::string("--listen"), listen, std::string("--event-log"), event_log_path(name)})
      argv.push_back(a);
    add_transport(argv, "node");
    auto p = child_process::start(argv, cfg_.work_dir, name);
    if (!p) return std::unexpected(p.error());
    if (auto out = (*p)->wait_for("joined", timeout()); !out) return std::unexpected(out.error());
    nodes_.push_back(std::move(*p));
    return {};
  }

  expected<void> start_gateway(std::uint32_t g) {
    const std::string name = fmt::format("gateway-{}", g);
    std::vector<std::string> argv{cfg_.exaserve_bin, "gateway", "--join", "127.0.0.1:" + std::to_string(controller_port_),
                                  "--http-port", "0", "--rpc-port", "0", "--request-deadline-ms",
                                  std::to_string(std::max(100u, cfg_.plan.cluster.request_deadline_ms)), "--event-log",
                                  event_log_path(name)};
    add_transport(argv, "gateway");
    auto p = child_process::start(argv, cfg_.work_dir, name);
    if (!p) return std::unexpected(p.error());
    auto out = (*p)->wait_for("serving HTTP", timeout());
    if (!out) return std::unexpected(out.error());
    const auto port = number_after(*out, "serving HTTP at http://127.0.0.1:");
    if (!port) return make_error(errc::internal, name + " did not say its HTTP port:\n" + *out);
    http_ports_.push_back(static_cast<std::uint16_t>(*port));
    gateways_.push_back(std::move(*p));
    return {};
  }

  const process_run_config& cfg_;
  bool namespaces_;
  bool netem_ = false;
  unsigned tag_ = 0;
  std::uint16_t controller_port_ = 0;
  unsigned controller_starts_ = 0;
  std::vector<std::unique_ptr<host_link>> links_;
  std::unique_ptr<child_process> controller_;
  std::vector<std::unique_ptr<child_process>> nodes_, gateways_;
  std::vector<std::uint16_t> http_ports_;
  std::vector<std::string> logs_;
};

// Every process's log so far, merged with the driver's.
std::vector<event> merged(const std::vector<std::string>& files, const event_log& driver, std::size_t* torn = nullptr) {
  std::vector<std::vector<event>> logs{driver.events()};
  for (const auto& f : files) {
    auto r = read_event_log(f);
    if (!r) {
      spdlog::warn("event=chaos_event_log_unreadable file={} error=\"{}\"", f, r.error().message);
      continue;
    }
    if (torn) *torn += r->torn_lines;
    logs.push_back(std::move(r->events));
  }
  return merge_logs(logs);
}

std::uint32_t up_now(process_cluster& pc, const event_log& driver) {
  const auto up = replicas_up(merged(pc.event_logs(), driver));
  const auto it = up.find(workload_deployment);
  return it == up.end() ? 0 : it->second;
}

// A fault that cannot run here is logged as "<kind>:skipped (<why>)".
struct injector {
  process_cluster& pc;
  event_log& log;
  std::vector<std::string>& skipped;
  pending_clears& clears;
  // Timed faults to undo: (when, what to do).
  std::vector<std::pair<std::int64_t, std::function<void()>>> undo;
  std::set<pid_t> killed;  // processes its faults ended

  void kill(child_process* p) {
    if (!p) return;
    killed.insert(p->pid());
    p->signal(SIGKILL);
  }

  void inject(const scheduled_fault& f, std::int64_t now) {
    event e;
    // Stamped before it is done: a kill's consequences (the controller
    // losing the node within a millisecond) must not come before their cause.
    e.t_ns = wall_ns();
    e.kind = event_kind::fault_injected;
    e.fault_id = f.id;
    e.detail = std::string(to_string(f.spec.kind));
    e.node = f.spec.node ? static_cast<std::int64_t>(*f.spec.node) : -1;
    const std::uint32_t n = f.spec.node.value_or(0);
    const std::int64_t until = now + static_cast<std::int64_t>(f.spec.duration_s * 1e9);
    bool timed = false;
    std::string skip;
    switch (f.spec.kind) {
      case fault_kind::kill_process:
        kill(pc.node(n));
        break;
      case fault_kind::stop_process:
        if (auto* p = pc.node(n)) {
          p->signal(SIGSTOP);
          if (f.spec.duration_s > 0) {
            timed = true;
            undo.emplace_back(until, [p] { p->signal(SIGCONT); });
          }
        }
        break;
      case fault_kind::cont_process:
        if (auto* p = pc.node(n)) p->signal(SIGCONT);
        break;
      case fault_kind::partition_host:
        if (auto* l = pc.link(n)) {
          if (!l->cut()) skip = "the link would not go down";
          timed = skip.empty();
          if (timed) undo.emplace_back(until, [l] { l->heal(); });
        } else {
          skip = "no network namespaces: nodes share loopback";
        }
        break;
      case fault_kind::netem:
        if (auto* l = pc.link(n); !l) {
          skip = "no network namespaces: nodes share loopback";
        } else if (!pc.netem_available()) {
          skip = "this kernel has no netem qdisc (sch_netem)";
        } else if (!l->netem(f.spec.delay_ms, f.spec.probability)) {
          skip = "tc refused the netem qdisc";
        } else {
          timed = true;
          undo.emplace_back(until, [l] { l->netem_off(); });
        }
        break;
      case fault_kind::kill_controller:
        kill(pc.controller());
        break;
      case fault_kind::restart_controller: {
        if (auto* c = pc.controller(); c && c->running()) {
          killed.insert(c->pid());
          c->stop(milliseconds(5000));
        }
        if (auto ok = pc.start_controller(); !ok) {
          spdlog::error("event=chaos_restart_failed error=\"{}\"", ok.error().message);
          e.detail += ":failed";
        }
        break;
      }
      case fault_kind::kill_gateway:
        kill(pc.gateway(f.spec.gateway.value_or(0)));
        break;
      default: skip = "not a process fault"; break;  // check_plan_mode keeps these out
    }
    if (!skip.empty()) {
      e.detail += ":skipped";  // the reason goes to the outcome's list
      skipped.push_back(fmt::format("fault {} {} at {:.1f} s: {}", f.id, to_string(f.spec.kind), f.at_s, skip));
      timed = false;
    }
    spdlog::warn("event=chaos_inject fault={} kind=\"{}\" node={} at_s={:.3f}", f.id, e.detail, e.node, f.at_s);
    log.append(e);
    if (timed) clears.emplace_back(until, f.id);
  }

  void undo_due(std::int64_t now) {
    for (auto it = undo.begin(); it != undo.end();) {
      if (it->first > now) {
        ++it;
        continue;
      }
      it->second();
      it = undo.erase(it);
    }
  }
};

}  // namespace

bool network_namespaces_available() { return host_link::available(); }

expected<process_run_outcome> run_processes(const process_run_config& cfg) {
  if (auto ok = check_plan_mode(cfg.plan, true); !ok) return std::unexpected(ok.error());
  const std::uint64_t seed = cfg.seed.value_or(cfg.plan.seed);
  bool namespaces = false;
  if (cfg.network != process_network::loopback) {
    namespaces = network_namespaces_available();
    if (!namespaces && cfg.network == process_network::namespaces)
      return make_error(errc::unavailable, "network namespaces need root and `ip netns` (iproute2)");
  }
  const timeline tl = make_timeline(cfg.plan, seed);
  auto expected_tokens = expected_outputs(cfg.model_file, cfg.plan, tl.requests);
  if (!expected_tokens) return std::unexpected(expected_tokens.error());
  std::error_code ec;
  fs::create_directories(cfg.work_dir, ec);
  if (ec) return make_error(errc::io_error, "cannot create " + cfg.work_dir + ": " + ec.message());

  const auto wall0 = std::chrono::steady_clock::now();
  process_cluster pc(cfg, namespaces);
  spdlog::info("event=chaos_processes_start plan={} nodes={} gateways={} network={} dir={}", cfg.plan.name,
               cfg.plan.cluster.nodes, cfg.plan.cluster.gateways, namespaces ? "namespaces" : "loopback", cfg.work_dir);
  if (auto ok = pc.start(); !ok) return std::unexpected(ok.error());
  auto log = std::make_shared<event_log>();
  const std::uint32_t desired = cfg.plan.cluster.replicas;
  // Ready: every replica up, as the nodes' own logs say.
  const auto ready_by = std::chrono::steady_clock::now() + milliseconds(static_cast<std::int64_t>(cfg.start_timeout_s * 1000));
  const auto stop_now = [&] { return cfg.interrupted && cfg.interrupted->load(); };
  const auto interrupted = [] { return make_error(errc::cancelled, "interrupted: every process stopped, namespaces removed"); };
  while (up_now(pc, *log) < desired) {
    if (stop_now()) return interrupted();
    if (std::chrono::steady_clock::now() > ready_by)
      return make_error(errc::deadline_exceeded, fmt::format("the cluster did not bring up {} replicas in {:.0f} s "
                                                             "(process output in {})",
                                                             desired, cfg.start_timeout_s, cfg.work_dir));
    std::this_thread::sleep_for(milliseconds(100));
  }
  spdlog::info("event=chaos_processes_ready replicas={} after_s={:.1f}", desired,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count());

  process_run_outcome out;
  out.namespaces = namespaces;
  pending_clears clears;
  injector inj{pc, *log, out.skipped, clears, {}};
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed_ns = [&] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  };
  const std::int64_t t0_wall = wall_ns();
  std::vector<std::thread> clients;
  std::size_t next_fault = 0, next_request = 0;
  std::int64_t last_progress = 0;
  const std::int64_t duration = static_cast<std::int64_t>(cfg.plan.workload.duration_s * 1e9);
  while (next_fault < tl.faults.size() || next_request < tl.requests.size() || !clears.empty() || !inj.undo.empty()) {
    if (stop_now()) break;
    const std::int64_t t = elapsed_ns();
    inj.undo_due(t0_wall + t);
    while (next_fault < tl.faults.size() && tl.faults[next_fault].at_s * 1e9 <= t)
      inj.inject(tl.faults[next_fault++], t0_wall + t);
    while (next_request < tl.requests.size() && tl.requests[next_request].at_s * 1e9 <= t) {
      const auto r = tl.requests[next_request];
      const auto ports = pc.live_gateway_ports();
      if (ports.empty()) {
        log_accepted(*log, wall_ns(), r);
        event f;
        f.t_ns = wall_ns();
        f.kind = event_kind::request_finished;
        f.request_id = r.id;
        f.outcome = "error";
        f.detail = "client: no gateway running";
        log->append(std::move(f));
      } else {
        const std::uint16_t port = ports[next_request % ports.size()];
        clients.emplace_back([&cfg, &log, r, port] { http_request(port, cfg.plan, r, *log, wall_ns); });
      }
      ++next_request;
    }
    log_cleared(*log, clears, wall_ns());
    if (t - last_progress >= 5'000'000'000) {
      last_progress = t;
      spdlog::info("event=chaos_progress elapsed_s={:.0f} duration_s={:.0f} requests_sent={} faults_injected={}",
                   t / 1e9, duration / 1e9, next_request, next_fault);
    }
    std::this_thread::sleep_for(milliseconds(2));
  }
  for (auto& c : clients) c.join();  // each bounded by the request deadline
  if (stop_now()) {
    for (auto& u : inj.undo) u.second();
    return interrupted();
  }
  // The settle time to show recovery, bounded by the drain limit.
  const auto settle_until = std::max(duration, tl.last_fault_end_ns) + tl.settle_ns;
  const auto drain_until = std::max(duration, tl.last_fault_end_ns) + static_cast<std::int64_t>(cfg.drain_s * 1e9);
  while (!stop_now() && elapsed_ns() < drain_until && (elapsed_ns() < settle_until || up_now(pc, *log) < desired))
    std::this_thread::sleep_for(milliseconds(100));
  const std::int64_t end_ns = wall_ns();  // the run ends here; shutting down is not part of it
  const auto crashed = pc.exited_on_their_own(inj.killed);
  pc.stop_all();

  std::size_t torn = 0;
  auto all = merged(pc.event_logs(), *log, &torn);
  if (torn > 0) spdlog::warn("event=chaos_torn_event_lines lines={} detail=\"a process died mid-line\"", torn);
  all.erase(std::remove_if(all.begin(), all.end(), [&](const event& e) { return e.t_ns > end_ns; }), all.end());
  out.log = attribute_faults(std::move(all), desired);
  invariant_inputs inputs;
  inputs.expected_tokens = std::move(*expected_tokens);
  inputs.desired_replicas[workload_deployment] = desired;
  auto violations = check_invariants(out.log, inputs);
  for (const auto& c : crashed) violations.push_back({"process_exited", c});
  out.report = make_report(cfg.plan.name, seed, out.log, std::move(violations));
  out.report.resumed = -1;  // HTTP clients cannot see a move
  out.report.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  out.event_logs = pc.event_logs();
  return out;
}

}  // namespace exa::chaos
