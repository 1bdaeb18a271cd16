#include "chaos/driver.hpp"

#include <caf/actor_registry.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "actors/cluster_supervisor.hpp"
#include "actors/embedded_cluster.hpp"
#include "actors/messages.hpp"
#include "chaos/driver_detail.hpp"
#include "chaos/attribution.hpp"
#include "chaos/invariants.hpp"
#include "chaos/workload_client.hpp"
#include "chaos/sse_client.hpp"
#include "cluster/fault_injector.hpp"
#include "common/splitmix64.hpp"
#include "engine/cpu_engine.hpp"
#include "engine/null_engine.hpp"
#include "engine/thread_pool.hpp"
#include "gpu/cpu_memory_pool.hpp"
#include "model/llama_model.hpp"

namespace exa::chaos {
namespace {

using json = nlohmann::json;
constexpr const char* deployment_name = workload_deployment;

actors::cluster_options options_for(const run_config& rc, std::shared_ptr<cluster::fault_injector> inj,
                                    std::shared_ptr<event_log> log) {
  const auto& c = rc.plan.cluster;
  actors::cluster_options o;
  o.nodes = c.nodes;
  o.devices_per_node = c.devices_per_node;
  o.racks = c.racks;
  o.device_memory_bytes = 64ull << 20;
  o.engine = c.engine;
  o.default_model_file = rc.model_file;
  o.default_kv_tokens = 4096;
  o.heartbeat_interval_ms = c.heartbeat_interval_ms;
  o.suspect_after_missed = c.suspect_after_missed;
  o.observation_window_ms = c.observation_window_ms;
  o.device_check_interval_ms = c.device_check_interval_ms;
  o.device_check_timeout_ms = std::max(1u, std::min(5000u, c.device_check_interval_ms / 2));
  o.step_timeout_ms = std::max(100u, std::min(60000u, c.heartbeat_interval_ms * 3));
  o.request_deadline_ms = c.request_deadline_ms;
  o.migration_parallelism = c.migration_parallelism;
  o.degraded_step_ms = c.degraded_step_ms;
  o.degraded_replace_after_ms = c.degraded_replace_after_ms;
  o.max_attempts = 8;
  o.deterministic = !rc.real_time;
  o.model_step_time = true;  // in virtual time: faults must be able to land mid-stream
  o.fault_injector = std::move(inj);
  o.event_log = std::move(log);
  api::deploy_request d;
  d.name = deployment_name;
  d.replicas = c.replicas;
  o.deployments.push_back(d);
  return o;
}

api::generate_request to_api(const run_config& rc, const scheduled_request& r) {
  api::generate_request g;
  g.request_id = r.id;
  g.model = deployment_name;
  g.prompt_text = workload_prompt(rc.plan.workload, r.prompt);
  g.max_tokens = r.max_tokens;
  g.sampling.temperature = r.temperature;
  g.sampling.seed = r.seed & 0x7fffffffffffffffull;  // the API takes 63-bit seeds
  g.ignore_eos = true;
  return g;
}

// Logs one request's stream as its client sees it.
struct logging_sink final : api::stream_sink {
  std::shared_ptr<event_log> log;
  std::function<std::int64_t()> now;
  std::string id;
  std::int64_t start = 0, first = -1;
  std::uint64_t tokens = 0;
  std::atomic<bool>* done_flag = nullptr;

  void on_chunk(const api::token_chunk& c) override {
    if (c.tokens.empty()) return;
    event e;
    e.t_ns = now();
    if (first < 0) first = e.t_ns;
    e.kind = event_kind::request_tokens;
    e.request_id = id;
    e.index = c.first_index;
    e.tokens = c.tokens;
    tokens += c.tokens.size();
    log->append(std::move(e));
  }
  void on_done(const api::generate_result& r) override {
    event e;
    e.t_ns = now();
    e.kind = event_kind::request_finished;
    e.request_id = id;
    e.outcome = r.reason == api::finish_reason::error       ? "error"
                : r.reason == api::finish_reason::cancelled ? "cancelled"
                                                            : "completed";
    if (r.err) e.detail = std::string(to_string(r.err->code));
    e.count = r.usage.completion_tokens;
    e.index = r.resumes;
    e.value_ms = first < 0 ? -1.0 : (first - start) / 1e6;
    e.value2_ms = (e.t_ns - start) / 1e6;
    log->append(std::move(e));
    if (done_flag) done_flag->store(true);
  }
};

}  // namespace

namespace detail {

std::uint64_t mix(std::uint64_t x) { return splitmix64(x); }

caf::error fault_reason(const std::string& what) { return caf::make_error(caf::sec::runtime_error, what); }

// Applies one fault now; returns the time it stops being active (ns) for
// timed faults, 0 otherwise.
std::int64_t inject(cluster_access& ca, cluster::fault_injector& inj, event_log& log, const scheduled_fault& f,
                    std::uint64_t seed) {
  event e;
  e.kind = event_kind::fault_injected;
  e.fault_id = f.id;
  e.detail = std::string(to_string(f.spec.kind));
  const auto now = ca.now_ns();
  const auto until = now + static_cast<std::int64_t>(f.spec.duration_s * 1e9);
  const std::uint32_t node = f.spec.node.value_or(0);
  e.node = f.spec.node ? static_cast<std::int64_t>(node) : -1;
  switch (f.spec.kind) {
    case fault_kind::kill_replica: {
      std::vector<api::replica_status> live;
      for (auto& r : ca.replicas())
        if ((r.state == "ready" || r.state == "serving") && (!f.spec.node || r.node == node)) live.push_back(r);
      if (live.empty()) {
        e.detail += ":no_target";
        break;
      }
      const auto& victim = live[mix(seed ^ f.id) % live.size()];
      e.replica = std::stoull(victim.id);
      e.node = victim.node;
      e.slot = victim.slot;
      if (auto n = ca.node(victim.node)) caf::anon_send(n, actors::kill_replica{e.replica});
      break;
    }
    case fault_kind::kill_node:
      if (auto n = ca.node(node))
        caf::anon_send<caf::message_priority::high>(n, caf::exit_msg{caf::actor_addr{}, fault_reason("node killed (injected)")});
      break;
    case fault_kind::kill_router:
    case fault_kind::kill_controller:
    case fault_kind::kill_health_monitor: {
      const caf::atom_value name = f.spec.kind == fault_kind::kill_router
                                       ? caf::atom_value{actors::router_atom::value}
                                       : f.spec.kind == fault_kind::kill_controller
                                             ? caf::atom_value{actors::controller_atom::value}
                                             : caf::atom_value{actors::health_atom::value};
      if (auto a = caf::actor_cast<caf::actor>(ca.cluster.system().registry().get(name)))
        caf::anon_send<caf::message_priority::high>(a, caf::exit_msg{caf::actor_addr{}, fault_reason("killed (injected)")});
      break;
    }
    case fault_kind::partition_node: inj.arm(node, cluster::channel_fault::partition, until); break;
    case fault_kind::heartbeat_jitter:
      inj.arm(node, cluster::channel_fault::jitter, until, 1.0, std::int64_t{f.spec.delay_ms} * 1000000);
      break;
    case fault_kind::drop_messages: inj.arm(node, cluster::channel_fault::drop, until, f.spec.probability); break;
    case fault_kind::delay_messages:
      inj.arm(node, cluster::channel_fault::delay, until, 1.0, std::int64_t{f.spec.delay_ms} * 1000000);
      break;
    case fault_kind::duplicate_messages:
      inj.arm(node, cluster::channel_fault::duplicate, until, f.spec.probability);
      break;
    default:  // process faults: check_plan_mode keeps them out of one-process runs
      e.detail += ":needs_processes";
      break;
    case fault_kind::fail_device:
    case fault_kind::hang_device:
    case fault_kind::slow_model_load:
    case fault_kind::slow_device: {
      const std::string kind = f.spec.kind == fault_kind::fail_device   ? "fail"
                               : f.spec.kind == fault_kind::hang_device ? "hang"
                               : f.spec.kind == fault_kind::slow_device ? "slow"
                                                                        : "slow_load";
      e.device = f.spec.device ? static_cast<std::int64_t>(*f.spec.device) : -1;
      if (auto n = ca.node(node))
        caf::anon_send(n, actors::inject_fault{kind, f.spec.device.value_or(0),
                                               static_cast<std::uint32_t>(f.spec.duration_s * 1000), f.spec.delay_ms});
      break;
    }
  }
  e.t_ns = now;
  spdlog::warn("event=chaos_inject fault={} kind={} node={} replica={} at_s={:.3f}", f.id, e.detail, e.node, e.replica,
               f.at_s);
  log.append(e);
  return f.spec.duration_s > 0 ? until : 0;
}

}  // namespace detail

namespace {

using detail::cluster_access;
using detail::inject;

}  // namespace

namespace {

std::uint32_t ready_replicas(cluster_access& ca) {
  std::uint32_t n = 0;
  for (const auto& r : ca.replicas()) n += r.state == "ready" || r.state == "serving";
  return n;
}

// Virtual time: step the test scheduler, feeding faults and requests in.
void run_virtual(const run_config& rc, actors::embedded_cluster& cluster, cluster::fault_injector& inj,
                 const std::shared_ptr<event_log>& log, const timeline& tl, std::uint64_t seed) {
  auto* sched = cluster.test_scheduler();
  cluster_access ca{cluster, true};
  const auto step = std::chrono::milliseconds(std::clamp(rc.plan.cluster.heartbeat_interval_ms / 4, 1u, 10u));
  const std::int64_t start = ca.now_ns();
  const std::int64_t duration = static_cast<std::int64_t>(rc.plan.workload.duration_s * 1e9);
  const std::int64_t limit = duration + static_cast<std::int64_t>(rc.drain_s * 1e9);
  pending_clears clears;
  std::vector<std::atomic<bool>> done(tl.requests.size());
  std::size_t next_fault = 0, next_request = 0;
  std::uint64_t checks = 0;
  auto backend = cluster.backend();
  for (;;) {
    const std::int64_t elapsed = ca.now_ns() - start;
    while (next_fault < tl.faults.size() && tl.faults[next_fault].at_s * 1e9 <= elapsed) {
      if (auto until = inject(ca, inj, *log, tl.faults[next_fault], seed)) clears.emplace_back(until, tl.faults[next_fault].id);
      ++next_fault;
    }
    while (next_request < tl.requests.size() && tl.requests[next_request].at_s * 1e9 <= elapsed) {
      const auto& r = tl.requests[next_request];
      auto sink = std::make_shared<logging_sink>();
      sink->log = log;
      sink->now = [&ca] { return ca.now_ns(); };
      sink->id = r.id;
      sink->start = ca.now_ns();
      sink->done_flag = &done[next_request];
      log_accepted(*log, sink->start, r);
      backend->generate(to_api(rc, r), sink);
      ++next_request;
    }
    log_cleared(*log, clears, ca.now_ns());
    const bool all_done = next_request == tl.requests.size() &&
                          std::all_of(done.begin(), done.end(), [](const auto& d) { return d.load(); });
    if (elapsed >= limit) break;
    if (elapsed >= duration && all_done && clears.empty() && elapsed >= tl.last_fault_end_ns + tl.settle_ns &&
        ++checks % 50 == 0 && ready_replicas(ca) >= rc.plan.cluster.replicas)
      break;  // the workload is done and the cluster is whole again
    sched->advance_time(step);
    for (int guard = 0; sched->run() > 0 && guard < 1000; ++guard) {
    }
  }
}

// Real time: the cluster on real threads behind the HTTP front door.
expected<void> run_real_time(const run_config& rc, actors::embedded_cluster& cluster, cluster::fault_injector& inj,
                             const std::shared_ptr<event_log>& log, const timeline& tl, std::uint64_t seed) {
  if (!rc.serve_http) return make_error(errc::invalid_argument, "a real-time chaos run needs an HTTP front door");
  auto door = rc.serve_http(cluster.backend());
  if (!door) return std::unexpected(door.error());
  cluster_access ca{cluster, false};
  const auto now = [&ca] { return ca.now_ns(); };
  const std::uint16_t port = (*door)->http_port();
  const auto start_wall = std::chrono::steady_clock::now();
  const auto elapsed_ns = [&] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_wall).count();
  };
  std::vector<std::thread> clients;
  pending_clears clears;
  std::size_t next_fault = 0, next_request = 0;
  const std::int64_t duration = static_cast<std::int64_t>(rc.plan.workload.duration_s * 1e9);
  std::int64_t last_progress = 0;
  while (next_fault < tl.faults.size() || next_request < tl.requests.size() || !clears.empty()) {
    const std::int64_t t = elapsed_ns();
    while (next_fault < tl.faults.size() && tl.faults[next_fault].at_s * 1e9 <= t) {
      if (auto until = inject(ca, inj, *log, tl.faults[next_fault], seed)) clears.emplace_back(until, tl.faults[next_fault].id);
      ++next_fault;
    }
    while (next_request < tl.requests.size() && tl.requests[next_request].at_s * 1e9 <= t) {
      const auto r = tl.requests[next_request++];
      clients.emplace_back([&, r] { http_request(port, rc.plan, r, *log, now); });
    }
    log_cleared(*log, clears, ca.now_ns());
    if (t - last_progress >= 5'000'000'000) {  // progress on long runs
      last_progress = t;
      spdlog::info("event=chaos_progress elapsed_s={:.0f} duration_s={:.0f} requests_sent={} faults_injected={}",
                   t / 1e9, duration / 1e9, next_request, next_fault);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (auto& c : clients) c.join();
  // Give the cluster its settle time to show it recovered (up to the drain limit).
  const auto settle_until = std::max(duration, tl.last_fault_end_ns) + tl.settle_ns;
  const auto drain_until = duration + static_cast<std::int64_t>(rc.drain_s * 1e9);
  while (elapsed_ns() < drain_until &&
         (elapsed_ns() < settle_until || ready_replicas(ca) < rc.plan.cluster.replicas))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  (*door)->stop();
  return {};
}

}  // namespace

expected<run_outcome> run_plan(const run_config& rc) {
  if (auto ok = check_plan_mode(rc.plan, false); !ok) return std::unexpected(ok.error());
  const std::uint64_t seed = rc.seed.value_or(rc.plan.seed);
  const timeline tl = make_timeline(rc.plan, seed);
  auto expected_tokens = expected_outputs(rc.model_file, rc.plan, tl.requests);
  if (!expected_tokens) return std::unexpected(expected_tokens.error());
  auto inj = std::make_shared<cluster::fault_injector>(seed);
  auto log = std::make_shared<event_log>();
  const auto wall0 = std::chrono::steady_clock::now();
  auto cluster = actors::embedded_cluster::start(options_for(rc, inj, log));
  if (!cluster) return std::unexpected(cluster.error());
  if (rc.real_time) {
    if (auto ok = run_real_time(rc, **cluster, *inj, log, tl, seed); !ok) return std::unexpected(ok.error());
  } else {
    run_virtual(rc, **cluster, *inj, log, tl, seed);
  }
  (*cluster)->stop();
  run_outcome out;
  out.log = attribute_faults(log->events(), rc.plan.cluster.replicas);
  invariant_inputs inputs;
  inputs.expected_tokens = std::move(*expected_tokens);
  inputs.desired_replicas[deployment_name] = rc.plan.cluster.replicas;
  auto violations = check_invariants(out.log, inputs);
  out.report = make_report(rc.plan.name, seed, out.log, std::move(violations));
  if (rc.real_time) out.report.resumed = -1;  // HTTP clients cannot see a move
  out.report.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return out;
}

}  // namespace exa::chaos
