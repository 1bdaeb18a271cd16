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
#include "chaos/invariants.hpp"
#include "chaos/sse_client.hpp"
#include "cluster/fault_injector.hpp"
#include "common/splitmix64.hpp"
#include "engine/cpu_engine.hpp"
#include "engine/null_engine.hpp"
#include "engine/thread_pool.hpp"
#include "frontdoor.hpp"
#include "gpu/cpu_memory_pool.hpp"
#include "model/llama_model.hpp"

namespace exa::chaos {
namespace {

using json = nlohmann::json;
constexpr const char* deployment_name = "chaos";

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

// The failure-free greedy output of every greedy request, computed on the
// engine directly (or the zero-cost engine's rule).
expected<std::map<std::string, std::vector<std::int32_t>>> expected_outputs(
    const run_config& rc, const std::vector<scheduled_request>& requests) {
  auto m = model::llama_model::load(rc.model_file);
  if (!m) return std::unexpected(m.error());
  const auto& tok = (*m)->tokenizer();
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::vector<std::int32_t>> cache;
  auto pool = gpu::cpu_memory_pool::create(engine::cpu_engine::kv_block_bytes((*m)->config(), 16),
                                           ((*m)->config().context_length + 15) / 16);
  if (!pool) return std::unexpected(pool.error());
  engine::thread_pool threads(1);
  std::map<std::string, std::vector<std::int32_t>> out;
  for (const auto& r : requests) {
    if (r.temperature != 0) continue;
    auto key = std::make_pair(r.prompt, r.max_tokens);
    auto it = cache.find(key);
    if (it == cache.end()) {
      auto prompt = tok.encode(workload_prompt(rc.plan.workload, r.prompt), true);
      if (!prompt) return std::unexpected(prompt.error());
      std::vector<std::int32_t> tokens;
      if (rc.plan.cluster.engine == "null") {
        std::vector<std::int32_t> seq = *prompt;
        for (std::uint32_t i = 0; i < r.max_tokens; ++i) {
          tokens.push_back(engine::null_engine::next_token(seq, (*m)->config().vocab_size));
          seq.push_back(tokens.back());
        }
      } else {
        engine::cpu_engine eng(*m, **pool, threads);
        engine::generation_request g;
        g.prompt = *prompt;
        g.max_tokens = r.max_tokens;
        if (auto ok = eng.submit(g); !ok) return std::unexpected(ok.error());
        while (!eng.idle())
          for (const auto& t : eng.step().tokens) tokens.push_back(t.token);
      }
      it = cache.emplace(key, std::move(tokens)).first;
    }
    out[r.id] = it->second;
  }
  return out;
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

void log_accepted(event_log& log, std::int64_t t, const scheduled_request& r) {
  event e;
  e.t_ns = t;
  e.kind = event_kind::request_accepted;
  e.request_id = r.id;
  e.deployment = deployment_name;
  e.detail = r.temperature == 0 ? "greedy" : "sampled";
  e.count = r.max_tokens;
  log.append(std::move(e));
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
    case fault_kind::fail_device:
    case fault_kind::hang_device:
    case fault_kind::slow_model_load: {
      const std::string kind = f.spec.kind == fault_kind::fail_device   ? "fail"
                               : f.spec.kind == fault_kind::hang_device ? "hang"
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

bool matches(const event& fault, const event& det) {
  const std::string kind = fault.detail;
  if (kind.rfind("kill_replica", 0) == 0) return det.detail == "monitor" && det.replica == fault.replica;
  if (kind == "kill_node") return det.detail == "monitor" && det.node == fault.node && det.replica == 0;
  if (kind == "kill_rack")  // a silent rack, followed on its first node
    return det.node == fault.node && (det.detail == "heartbeat_suspect" || det.detail == "heartbeat_confirmed");
  if (kind == "hang_device") return det.node == fault.node && (det.detail == "device_check" || det.detail == "monitor");
  if (kind == "fail_device") return det.node == fault.node && (det.detail == "monitor" || det.detail == "device_check");
  if (kind == "slow_model_load") return false;
  // Channel faults: partitions, jitter, drop, delay, duplicate.
  return det.node == fault.node && (det.detail == "heartbeat_suspect" || det.detail == "heartbeat_confirmed");
}

bool disrupts(const event& fault, const event& e) {
  if (e.kind != event_kind::replica_state) return false;
  if (e.detail != "failed" && e.detail != "creating" && e.detail != "stopped") return false;
  if (fault.detail.rfind("kill_replica", 0) == 0) return e.replica == fault.replica;
  if (fault.detail == "kill_rack" && fault.count > 0)
    return e.node >= fault.node && (e.node - fault.node) % static_cast<std::int64_t>(fault.count) == 0;
  return e.node == fault.node;
}

// Faults that end replicas directly. The others (partitions, jitter, dropped
// or delayed messages, slow loads) disrupt only through the control plane's
// decisions, seconds later, so a later one of them must not take over a
// disruption that an earlier fault set in motion.
bool ends_replicas(const event& fault) {
  const std::string& k = fault.detail;
  return k.rfind("kill_", 0) == 0 || k == "fail_device" || k == "hang_device";
}

bool later_fault_explains(const std::vector<event>& log, const event& fault, const event& e) {
  for (const auto& g : log) {
    if (g.t_ns > e.t_ns) break;  // log is sorted by time
    if (g.kind != event_kind::fault_injected || !ends_replicas(g) || !disrupts(g, e)) continue;
    if (g.t_ns > fault.t_ns || (g.t_ns == fault.t_ns && g.fault_id > fault.fault_id)) return true;
  }
  return false;
}

}  // namespace

std::vector<event> attribute_faults(std::vector<event> log, std::uint32_t desired_replicas) {
  std::stable_sort(log.begin(), log.end(), [](const event& a, const event& b) { return a.t_ns < b.t_ns; });
  std::vector<event> added;
  for (const auto& f : log) {
    if (f.kind != event_kind::fault_injected) continue;
    std::int64_t detected = -1, disrupted = -1;
    for (const auto& e : log) {
      if (e.t_ns < f.t_ns) continue;
      if (detected < 0 && e.kind == event_kind::fault_detected && e.fault_id == 0 && matches(f, e)) {
        detected = e.t_ns;
        event d = e;
        d.fault_id = f.fault_id;
        added.push_back(d);
      }
      // A disruption belongs to the latest fault that explains it: a replica
      // failing after a later fault hit the same node is the later fault's.
      if (disrupted < 0 && disrupts(f, e) && !later_fault_explains(log, f, e)) disrupted = e.t_ns;
    }
    if (disrupted < 0) continue;  // nothing was lost: nothing to recover
    // The first moment after the disruption with every replica serving again.
    // Counted by slot: a slot serves when its newest epoch's replica does. A
    // replica that vanished with a lost node never reports its end, and
    // counting replicas would count it alongside its replacement.
    struct slot_state {
      std::uint64_t epoch = 0;
      std::uint64_t replica = 0;
      bool up = false;
    };
    std::map<std::pair<std::string, std::int64_t>, slot_state> live;
    for (const auto& e : log) {
      if (e.kind != event_kind::replica_state) continue;
      // Events without a slot (none in practice) count by replica id.
      std::pair<std::string, std::int64_t> key{e.deployment, e.slot};
      if (e.slot < 0) key = {std::string(), -1 - static_cast<std::int64_t>(e.replica)};
      auto& sl = live[key];
      if (e.epoch >= sl.epoch) sl = {e.epoch, e.replica, e.detail == "ready" || e.detail == "serving"};
      if (e.t_ns < disrupted) continue;
      std::uint32_t n = 0;
      for (const auto& [k, v] : live) n += v.up;
      if (n >= desired_replicas) {
        event r;
        r.t_ns = e.t_ns;
        r.kind = event_kind::fault_recovered;
        r.fault_id = f.fault_id;
        added.push_back(r);
        break;
      }
    }
  }
  log.insert(log.end(), added.begin(), added.end());
  std::stable_sort(log.begin(), log.end(), [](const event& a, const event& b) { return a.t_ns < b.t_ns; });
  return log;
}

namespace {

struct timeline {
  std::vector<scheduled_fault> faults;
  std::vector<scheduled_request> requests;
  std::int64_t settle_ns = 0;      // after the last fault ends: time to recover
  std::int64_t last_fault_end_ns = 0;
};

timeline make_timeline(const run_config& rc, std::uint64_t seed) {
  timeline t;
  t.faults = schedule(rc.plan, seed);
  t.requests = schedule_workload(rc.plan, seed);
  const auto& c = rc.plan.cluster;
  t.settle_ns = (std::int64_t{c.heartbeat_interval_ms} * c.suspect_after_missed + c.observation_window_ms + 2000) *
                1000000;
  for (const auto& f : t.faults)
    t.last_fault_end_ns = std::max(t.last_fault_end_ns, static_cast<std::int64_t>((f.at_s + f.spec.duration_s) * 1e9));
  return t;
}

// Timed faults still active: (when it ends, fault id).
using pending_clears = std::vector<std::pair<std::int64_t, std::uint64_t>>;

// Logs fault_cleared for every timed fault that has ended by `now_ns`.
void log_cleared(event_log& log, pending_clears& clears, std::int64_t now_ns) {
  for (auto it = clears.begin(); it != clears.end();) {
    if (it->first > now_ns) {
      ++it;
      continue;
    }
    event e;
    e.t_ns = now_ns;
    e.kind = event_kind::fault_cleared;
    e.fault_id = it->second;
    log.append(std::move(e));
    it = clears.erase(it);
  }
}

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

// One HTTP streaming request, logged as its client sees it.
void http_request(std::uint16_t port, const run_config& rc, const scheduled_request& r, const std::shared_ptr<event_log>& log,
                  const std::function<std::int64_t()>& now) {
  const json body = {{"model", deployment_name},      {"prompt", workload_prompt(rc.plan.workload, r.prompt)},
                     {"max_tokens", r.max_tokens},     {"temperature", r.temperature},
                     {"seed", r.seed & 0x7fffffffffffffffull}, {"stream", true},
                     {"ignore_eos", true},             {"return_token_ids", true}};
  const std::int64_t start = now();
  log_accepted(*log, start, r);
  std::int64_t first = -1;
  std::uint64_t tokens = 0;
  std::string error_code;
  bool saw_done = false;
  auto result = post_sse(
      port, "/v1/completions", body.dump(),
      [&](std::string_view data) {
        if (data == "[DONE]") {
          saw_done = true;
          return;
        }
        const auto j = json::parse(data, nullptr, false);
        if (j.is_discarded()) return;
        if (j.contains("error")) {
          error_code = j["error"].value("code", "error");
          return;
        }
        const auto& choice = j["choices"][0];
        if (!choice.contains("token_ids") || choice["token_ids"].empty()) return;
        event e;
        e.t_ns = now();
        if (first < 0) first = e.t_ns;
        e.kind = event_kind::request_tokens;
        e.request_id = r.id;
        e.index = choice.value("token_index", 0u);
        e.tokens = choice["token_ids"].get<std::vector<std::int32_t>>();
        tokens += e.tokens.size();
        log->append(std::move(e));
      },
      std::chrono::milliseconds(rc.plan.cluster.request_deadline_ms + 10000));
  event f;
  f.t_ns = now();
  f.kind = event_kind::request_finished;
  f.request_id = r.id;
  if (!result) {
    f.outcome = "error";
    f.detail = "client: " + result.error().message;
  } else if (result->status != 200) {
    f.outcome = "error";
    const auto j = json::parse(result->body, nullptr, false);
    f.detail = j.is_discarded() ? "http " + std::to_string(result->status) : j["error"].value("code", "error");
  } else if (!error_code.empty() || !saw_done) {
    f.outcome = "error";
    f.detail = error_code.empty() ? "stream ended early" : error_code;
  } else {
    f.outcome = "completed";
  }
  f.count = tokens;
  f.value_ms = first < 0 ? -1.0 : (first - start) / 1e6;
  f.value2_ms = (f.t_ns - start) / 1e6;
  log->append(std::move(f));
}

// Real time: the cluster on real threads behind the HTTP front door.
expected<void> run_real_time(const run_config& rc, actors::embedded_cluster& cluster, cluster::fault_injector& inj,
                             const std::shared_ptr<event_log>& log, const timeline& tl, std::uint64_t seed) {
  frontdoor_config fc;
  fc.http_port = 0;
  fc.rpc_port = 0;
  auto door = frontdoor::start(fc, cluster.backend());
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
      clients.emplace_back([&, r] { http_request(port, rc, r, log, now); });
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
  const std::uint64_t seed = rc.seed.value_or(rc.plan.seed);
  const timeline tl = make_timeline(rc, seed);
  auto expected_tokens = expected_outputs(rc, tl.requests);
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
