#include "chaos/sim_driver.hpp"

#include <sys/resource.h>

#include <caf/send.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <set>

#include "actors/sim_storage_actor.hpp"
#include "chaos/driver.hpp"
#include "chaos/driver_detail.hpp"
#include "chaos/sim_workload.hpp"
#include "cluster/hardware.hpp"
#include "cluster/model_ref.hpp"
#include "cluster/placement.hpp"
#include "metrics/metrics.hpp"

namespace exa::chaos {
namespace {

using clock_type = std::chrono::steady_clock;

std::string model_ref_of(const sim_deployment& d) {
  return cluster::preset_ref(d.model, *cluster::precision_from_string(d.precision), d.context_length);
}

// How one run of a scenario differs from the others it is compared with.
struct run_mode {
  bool fixed_fleet = false;  // compare_fixed_fleet: the fixed fleet (else as deployed)
  bool cold_start = false;   // one of compare_cold_start's runs:
  bool staggered = true;     //   the scenario's load limits, or none
  bool cache_affinity = true;
};

actors::cluster_options options_for(const scenario& s, const std::string& policy, const run_mode& mode,
                                    std::shared_ptr<cluster::fault_injector> inj, std::shared_ptr<event_log> log,
                                    std::shared_ptr<std::atomic<std::uint64_t>> busy,
                                    std::shared_ptr<actors::sim_storage_stats> storage_stats) {
  const bool fixed_fleet = mode.fixed_fleet;
  actors::cluster_options o;
  o.nodes = s.topology.nodes;
  o.devices_per_node = s.topology.gpus_per_node;
  o.racks = s.topology.racks;
  o.engine = "sim";
  o.sim_gpu = s.topology.gpu;
  o.sim_prefix_block_tokens = s.topology.prefix_cache_block_tokens;
  o.sim_step_stop = s.topology.layer_yield;
  o.deterministic = true;
  o.heartbeat_interval_ms = s.timing.heartbeat_interval_ms;
  o.suspect_after_missed = s.timing.suspect_after_missed;
  o.observation_window_ms = s.timing.observation_window_ms;
  o.migration_parallelism = s.timing.migration_parallelism;
  o.loads_max = s.timing.loads_max;
  o.loads_per_node_max = s.timing.loads_per_node_max;
  o.request_deadline_ms = s.timing.request_deadline_ms;
  o.autoscale_up_window_s = s.timing.autoscale_up_window_s;
  o.autoscale_down_window_s = s.timing.autoscale_down_window_s;
  o.autoscale_up_cooldown_s = s.timing.autoscale_up_cooldown_s;
  o.autoscale_down_cooldown_s = s.timing.autoscale_down_cooldown_s;
  o.device_check_interval_ms = 30000;
  o.step_timeout_ms = 600000;  // modeled steps never hang; generous for long prefills
  o.queued_global_max = 1u << 20;
  o.queued_per_model_max = 1u << 20;
  o.in_flight_per_replica_max = s.timing.in_flight_per_replica_max;
  o.fair_across_tenants = s.timing.fair_admission;
  o.tenant_headroom_slots = s.timing.tenant_headroom_slots;
  o.max_attempts = 8;
  o.fault_injector = std::move(inj);
  o.event_log = std::move(log);
  o.device_busy_us = std::move(busy);
  if (s.storage.modelled) {
    o.sim_storage = cluster::storage_config{s.storage.store_gb_per_s * 1e9, s.storage.node_network_gb_per_s * 1e9,
                                            s.storage.node_disk_gb_per_s * 1e9};
    o.sim_warm_nodes = warm_node_ids(s.storage, s.topology.nodes);
    o.storage_stats = std::move(storage_stats);
  }
  if (mode.cold_start && !mode.staggered) {  // every load at once
    o.loads_max = sim_timing{}.loads_max;
    o.loads_per_node_max = sim_timing{}.loads_per_node_max;
  }
  o.cache_affinity = mode.cache_affinity;
  o.consolidate = s.timing.consolidate;
  for (const auto& d : s.deployments) {
    api::deploy_request r;
    r.name = d.name;
    r.model_file = model_ref_of(d);
    // An autoscaled deployment starts the run at its minimum (the night
    // before); `replicas` is the fixed fleet's size.
    r.replicas = !fixed_fleet && d.autoscale_max > 0 ? std::max<std::uint32_t>(d.autoscale_min, 1) : d.replicas;
    r.kv_tokens = d.kv_tokens;
    r.routing = policy.empty() ? d.routing : policy;
    r.prefix_slack_tokens = d.prefix_slack_tokens;
    r.prefix_slack_ratio = d.prefix_slack_ratio;
    r.prefix_slack_s = d.prefix_slack_s;
    r.max_replicas_per_node = d.max_replicas_per_node.value_or(0);
    // The fixed fleet, sized for the peak, keeps no pool: its replica-hours
    // are its `replicas`, the baseline the autoscaled run is held against.
    r.warm_pool_percent = fixed_fleet ? 0 : d.warm_pool_percent;
    if (!fixed_fleet) {
      r.autoscale_min = d.autoscale_min;
      r.autoscale_max = d.autoscale_max;
      r.autoscale_metric = d.autoscale_metric;
      r.autoscale_target = d.autoscale_target;
      r.idle_to_zero_s = d.idle_to_zero_s;
    }
    o.deployments.push_back(r);
  }
  return o;
}

// Wall time of the initial placement alone: every replica of every
// deployment onto the topology's ledgers (the controller runs this same
// function when it starts).
expected<double> measure_placement_ms(const scenario& s) {
  auto gpu = cluster::device_preset(s.topology.gpu);
  if (!gpu) return std::unexpected(gpu.error());
  std::vector<cluster::node_info> nodes;
  for (std::uint32_t n = 0; n < s.topology.nodes; ++n)
    nodes.push_back({n, n % std::max(1u, s.topology.racks), s.topology.gpus_per_node, gpu->memory_bytes});
  auto state = cluster::cluster_state::create(nodes, gpu->device_reserved_bytes);
  if (!state) return std::unexpected(state.error());
  std::vector<cluster::deployment_spec> specs;
  for (const auto& d : s.deployments) {
    auto ref = cluster::parse_model_ref(model_ref_of(d));
    if (!ref) return std::unexpected(ref.error());
    cluster::deployment_spec spec;
    spec.name = d.name;
    spec.model = *ref->preset;
    spec.replicas = d.replicas;
    spec.replica.kv_tokens = d.kv_tokens;
    spec.replica.max_batch_tokens = 512;
    spec.replica.replica_overhead_bytes = gpu->replica_overhead_bytes;
    spec.max_replicas_per_node = d.max_replicas_per_node;
    specs.push_back(std::move(spec));
  }
  const auto t0 = clock_type::now();
  auto plan = cluster::place(*state, specs);
  const double ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
  if (!plan) return std::unexpected(plan.error());
  if (!plan->unplaced.empty())
    return make_error(errc::unavailable, "the scenario's replicas do not fit: " + plan->unplaced.front().reason);
  return ms;
}

// Records one request as its client sees it, and checks its stream.
struct record_sink final : api::stream_sink {
  sim_request_record* record;
  std::function<double()> now_s;
  std::uint64_t* gaps;
  std::uint32_t received = 0;
  char* done;

  void on_chunk(const api::token_chunk& c) override {
    if (c.tokens.empty()) return;
    if (c.first_index != received) ++*gaps;  // a gap or a duplicate
    received += static_cast<std::uint32_t>(c.tokens.size());
    if (record->ttft_s < 0) record->ttft_s = now_s() - record->arrival_s;
  }
  void on_done(const api::generate_result& r) override {
    record->finish_s = now_s();
    record->generated_tokens = received;
    record->completed = r.reason == api::finish_reason::stop || r.reason == api::finish_reason::length;
    if (r.err) record->error = std::string(to_string(r.err->code));
    record->cached_tokens = r.usage.cached_tokens;
    record->replica = r.replica;
    if (r.usage.completion_tokens != received) ++*gaps;
    *done = 1;
  }
};

std::uint64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<std::uint64_t>(u.ru_maxrss) * 1024;
}

struct run_inputs {
  const scenario& s;
  const std::vector<sim_request>& workload;
  const std::vector<sim_fault>& faults;
  std::uint64_t seed;
  double duration_s;
  double drain_s;
};

struct sampler {
  std::map<std::uint64_t, std::string> replica_state;  // from the event log
  std::map<std::uint64_t, std::int64_t> replica_node;
  std::size_t cursor = 0;
  std::uint64_t last_busy_us = 0;
  double last_t = 0;
};

sim_sample take_sample(double t, sampler& smp, const event_log& log, std::uint64_t busy_us, std::uint32_t devices,
                       std::uint32_t nodes, const std::vector<sim_request_record>& records,
                       const std::vector<char>& done, std::size_t sent, std::uint32_t arrivals) {
  sim_sample out;
  out.t_s = t;
  out.arrivals = arrivals;
  log.visit_since(smp.cursor, [&](const event& e) {
    if (e.kind != event_kind::replica_state) return;
    smp.replica_state[e.replica] = e.detail;
    smp.replica_node[e.replica] = e.node;
  });
  std::set<std::int64_t> in_use;  // nodes where a replica holds a device
  for (const auto& [id, st] : smp.replica_state) {
    ++out.replicas_by_state[st];
    if (st != "stopped" && st != "failed") in_use.insert(smp.replica_node[id]);
  }
  out.idle_nodes = nodes - static_cast<std::uint32_t>(std::min<std::size_t>(in_use.size(), nodes));
  std::vector<double> ttfts;
  for (std::size_t i = 0; i < sent; ++i) {
    if (!done[i]) {
      ++out.in_flight;
      if (records[i].ttft_s < 0) ++out.queued;
    }
    const double first = records[i].arrival_s + records[i].ttft_s;
    if (records[i].ttft_s >= 0 && first > smp.last_t && first <= t) ttfts.push_back(records[i].ttft_s);
  }
  std::sort(ttfts.begin(), ttfts.end());
  if (!ttfts.empty()) {
    out.ttft_p50_s = ttfts[(ttfts.size() - 1) / 2];
    out.ttft_p99_s = ttfts[std::min(ttfts.size() - 1, static_cast<std::size_t>(0.99 * ttfts.size()))];
  }
  const double span = t - smp.last_t;
  if (span > 0) out.device_utilization = (busy_us - smp.last_busy_us) / 1e6 / (span * devices);
  smp.last_busy_us = busy_us;
  smp.last_t = t;
  return out;
}

std::vector<std::int32_t> prompt_ids(std::size_t index, std::uint32_t length, std::uint32_t vocab) {
  std::vector<std::int32_t> ids(length);
  for (std::uint32_t j = 0; j < length; ++j)
    ids[j] = static_cast<std::int32_t>(3 + (index * 31 + j * 7) % (vocab - 3));
  return ids;
}

// A rack loss (its switch or power): the rack's nodes fall silent for the rest
// of the run and the replicas on them are gone, with their streams. Nothing
// tells the control plane that the nodes are lost: it must suspect them from
// missed heartbeats, confirm after the window and move their slots. (Killing
// the node actors instead would be seen at once by their monitors, which
// models a crashed process on a live host, not a lost rack.)
void inject_rack_loss(detail::cluster_access& ca, cluster::fault_injector& inj, event_log& log, const scenario& s,
                      const sim_fault& f) {
  event e;
  e.kind = event_kind::fault_injected;
  e.fault_id = f.id;
  e.detail = "kill_rack";
  e.count = std::max(1u, s.topology.racks);
  e.t_ns = ca.now_ns();
  bool first = true;
  for (std::uint32_t n = 0; n < s.topology.nodes; ++n) {
    if (n % std::max(1u, s.topology.racks) != *f.kill_rack) continue;
    if (first) e.node = n;  // detection and recovery are followed on the rack's first node
    first = false;
    inj.arm(n, cluster::channel_fault::partition, std::numeric_limits<std::int64_t>::max());
    if (auto node = ca.node(n)) caf::anon_send(node, actors::inject_fault{"power_off", 0, 0, 0});
  }
  spdlog::warn("event=sim_rack_lost rack={} at_s={:.1f}", *f.kill_rack, f.at_s);
  log.append(e);
}

// Replicas the deployments ask for at start: serving ones and the warm
// pool's floor(N x P / 100) standbys.
std::uint32_t replicas_wanted(const actors::cluster_options& o) {
  std::uint32_t n = 0;
  for (const auto& d : o.deployments) n += d.replicas + d.replicas * d.warm_pool_percent / 100;
  return n;
}

// When the first, half and all of the wanted replicas had been loaded and
// warm (ready, serving or standing by) at least once, from the event log.
void note_ready_times(const std::vector<event>& events, std::int64_t t0_ns, sim_cold_start& c) {
  std::set<std::uint64_t> seen;
  const std::uint32_t half = (c.replicas_wanted + 1) / 2;
  for (const event& e : events) {
    if (e.kind != event_kind::replica_state) continue;
    if (e.detail != "ready" && e.detail != "serving" && e.detail != "standby") continue;
    if (!seen.insert(e.replica).second) continue;
    const double at = static_cast<double>(e.t_ns - t0_ns) / 1e9;
    const auto n = static_cast<std::uint32_t>(seen.size());
    if (n == 1) c.first_ready_s = at;
    if (n == half) c.half_ready_s = at;
    if (n == c.replicas_wanted) c.all_ready_s = at;
  }
  c.replicas_ready = static_cast<std::uint32_t>(std::min<std::size_t>(seen.size(), c.replicas_wanted));
}

// A scenario's rollout, as `exaserve-cli rollout` starts one; a refusal is
// recorded, not fatal (the report says why).
void start_rollout(api::gateway_backend& backend, const scenario& s, const sim_rollout& ro, double now_s,
                   std::vector<sim_rollout_record>& records) {
  api::rollout_request req;
  req.what = api::rollout_request::op::start;
  req.name = ro.deployment;
  req.model_file = cluster::preset_ref(ro.model, *cluster::precision_from_string(ro.precision), ro.context_length);
  req.steps = ro.steps;
  req.bake_s = ro.bake_s;
  req.surge = ro.surge;
  req.max_unavailable = ro.max_unavailable;
  req.min_samples = ro.min_samples;
  auto& rec = records.emplace_back();
  rec.deployment = ro.deployment;
  rec.model = req.model_file;
  rec.at_s = now_s;
  const std::size_t index = records.size() - 1;
  // The answer comes when the scheduler runs next; `records` outlives it.
  backend.rollout(req, [&records, index](expected<api::rollout_result> r) {
    if (!r) records[index].error = to_string(r.error());
  });
  spdlog::info("event=sim_rollout_start scenario={} deployment={} model={} at_s={:.1f}", s.name, ro.deployment,
               req.model_file, now_s);
}

// Each rollout's verdict from the controller's transitions in the event
// log: the first "started" after it was asked for, its steps, and the
// first verdict after that.
void note_rollouts(const std::vector<event>& events, std::int64_t t0_ns, std::vector<sim_rollout_record>& records) {
  for (auto& ro : records) {
    if (!ro.error.empty()) continue;
    bool started = false;
    for (const event& e : events) {
      if (e.kind != event_kind::rollout || e.deployment != ro.deployment) continue;
      const double at = static_cast<double>(e.t_ns - t0_ns) / 1e9;
      if (at + 1e-9 < ro.at_s) continue;
      if (!started) {
        started = e.detail == "started";
        continue;
      }
      if (e.detail == "step") ++ro.steps;
      if (e.detail == "complete" || e.detail == "rolled_back" || e.detail == "aborted") {
        ro.verdict = e.detail;
        ro.finished_s = at;
        ro.status = e.outcome;
        break;
      }
    }
    if (started && ro.verdict.empty()) ro.verdict = "in_progress";
  }
}

// The prefix caches' turnover over the run: the replicas' counters, which
// they export with each load report (an idle replica reports at once), summed
// over every deployment.
void note_prefix_turnover(const metrics::registry& registry, sim_run& run) {
  const metrics::registry_snapshot snap = registry.snapshot();
  const auto total = [&](std::string_view name) {
    double sum = 0;
    for (const auto& f : snap.families)
      if (f.name == name)
        for (const auto& series : f.series) sum += series.value;
    return static_cast<std::uint64_t>(sum);
  };
  run.prefix_evicted_blocks = total("exaserve_prefix_cache_evicted_blocks_total");
  run.prefix_evicted_miss_tokens = total("exaserve_prefix_cache_evicted_miss_tokens_total");
}

expected<sim_run> run_once(const run_inputs& in, const std::string& policy, const run_mode& mode) {
  const scenario& s = in.s;
  sim_run run;
  run.policy = policy.empty() ? s.deployments.front().routing : policy;
  if (s.compare_fixed_fleet) run.policy += mode.fixed_fleet ? "+fixed" : "+autoscaled";
  if (mode.cold_start) run.policy += std::string(mode.staggered ? "+staggered" : "+unstaggered") +
                                     (mode.cache_affinity ? "+affinity" : "");
  auto placement = measure_placement_ms(s);
  if (!placement) return std::unexpected(placement.error());
  run.placement_ms = *placement;
  auto inj = std::make_shared<cluster::fault_injector>(in.seed);
  auto log = std::make_shared<event_log>();
  auto busy = std::make_shared<std::atomic<std::uint64_t>>(0);
  auto storage = std::make_shared<actors::sim_storage_stats>();
  const auto wall0 = clock_type::now();
  auto options = options_for(s, policy, mode, inj, log, busy, storage);
  run.cold_start.modelled = s.storage.modelled;
  run.cold_start.staggered = !mode.cold_start || mode.staggered;
  run.cold_start.cache_affinity = mode.cache_affinity;
  run.cold_start.warm_nodes = static_cast<std::uint32_t>(options.sim_warm_nodes.size());
  run.cold_start.replicas_wanted = replicas_wanted(options);
  auto cluster = actors::embedded_cluster::start(std::move(options));
  if (!cluster) return std::unexpected(cluster.error());
  auto* sched = (*cluster)->test_scheduler();
  auto& clk = sched->clock();
  detail::cluster_access ca{**cluster, true};
  const std::int64_t t0 = ca.now_ns();
  const auto now_s = [&] { return (ca.now_ns() - t0) / 1e9; };
  const std::uint32_t vocab = cluster::parse_model_ref(model_ref_of(s.deployments.front()))->preset->vocab_size;
  const std::uint32_t devices = s.topology.nodes * s.topology.gpus_per_node;

  run.requests.resize(in.workload.size());
  std::vector<char> done(in.workload.size(), 0);
  std::vector<std::shared_ptr<record_sink>> sinks(in.workload.size());
  std::uint64_t gaps = 0;
  std::size_t sent = 0, next_fault = 0, finished_seen = 0, next_rollout = 0;
  std::uint32_t arrivals_in_interval = 0;
  double next_sample = s.sample_interval_s;
  sampler smp;
  auto backend = (*cluster)->backend();
  const double end_s = in.duration_s + in.drain_s;
  for (;;) {
    sched->run();
    const double t = now_s();
    while (finished_seen < sent && done[finished_seen]) ++finished_seen;
    const bool all_done = sent == in.workload.size() &&
                          std::all_of(done.begin() + static_cast<std::ptrdiff_t>(finished_seen), done.end(), [](char d) { return d; });
    if ((t >= in.duration_s && all_done) || t >= end_s) break;
    double next_ext = std::min(next_sample, end_s);
    if (sent < in.workload.size()) next_ext = std::min(next_ext, in.workload[sent].at_s);
    if (next_fault < in.faults.size()) next_ext = std::min(next_ext, in.faults[next_fault].at_s);
    if (next_rollout < s.rollouts.size()) next_ext = std::min(next_ext, s.rollouts[next_rollout].at_s);
    const double next_timer = clk.schedule().empty()
                                  ? std::numeric_limits<double>::infinity()
                                  : (std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         clk.schedule().begin()->first.time_since_epoch()).count() - t0) / 1e9;
    if (next_timer <= next_ext) {
      clk.trigger_timeout();
      continue;
    }
    if (next_ext > t) sched->advance_time(std::chrono::nanoseconds(static_cast<std::int64_t>((next_ext - t) * 1e9) + 1));
    const double now = now_s();
    while (sent < in.workload.size() && in.workload[sent].at_s <= now) {
      const auto& w = in.workload[sent];
      auto& rec = run.requests[sent];
      rec.arrival_s = now;
      rec.prompt_tokens = w.prompt_tokens;
      rec.max_tokens = w.max_tokens;
      rec.tenant = w.tenant;
      auto sink = std::make_shared<record_sink>();
      sink->record = &rec;
      sink->now_s = now_s;
      sink->gaps = &gaps;
      sink->done = &done[sent];
      sinks[sent] = sink;
      api::generate_request g;
      g.request_id = "s" + std::to_string(sent);
      g.model = s.deployments.front().name;
      g.prompt_ids = w.segments.empty() ? prompt_ids(sent, w.prompt_tokens, vocab) : segment_prompt_ids(w.segments, vocab);
      g.max_tokens = w.max_tokens;
      g.ignore_eos = true;
      g.tenant = w.tenant;
      backend->generate(std::move(g), sink);
      ++sent;
      ++arrivals_in_interval;
    }
    while (next_rollout < s.rollouts.size() && s.rollouts[next_rollout].at_s <= now)
      start_rollout(*backend, s, s.rollouts[next_rollout++], now, run.rollouts);
    while (next_fault < in.faults.size() && in.faults[next_fault].at_s <= now) {
      const auto& f = in.faults[next_fault++];
      if (f.kill_rack) {
        inject_rack_loss(ca, *inj, *log, s, f);
      } else if (f.chaos) {
        detail::inject(ca, *inj, *log, scheduled_fault{f.id, f.at_s, *f.chaos}, in.seed);
      }
    }
    if (now >= next_sample) {
      run.samples.push_back(take_sample(now, smp, *log, busy->load(), devices, s.topology.nodes, run.requests, done, sent,
                                        arrivals_in_interval));
      arrivals_in_interval = 0;
      next_sample += s.sample_interval_s;
      spdlog::info("event=sim_progress policy={} sim_s={:.0f} sent={} in_flight={}", run.policy, now, sent,
                   run.samples.back().in_flight);
    }
  }
  run.samples.push_back(take_sample(now_s(), smp, *log, busy->load(), devices, s.topology.nodes, run.requests, done,
                                    sent, arrivals_in_interval));
  for (std::size_t i = 0; i < sent; ++i) run.lost += !done[i];
  run.requests.resize(sent);
  note_rollouts(log->events(), t0, run.rollouts);
  for (auto& ro : run.rollouts) {  // one still going: its status line now, as `exaserve-cli rollout status` prints it
    if (!ro.error.empty() || ro.verdict != "in_progress") continue;
    api::rollout_request q;
    q.what = api::rollout_request::op::status;
    q.name = ro.deployment;
    backend->rollout(q, [&ro](expected<api::rollout_result> r) { ro.status = r ? r->status : to_string(r.error()); });
    sched->run();
  }
  note_prefix_turnover(*(*cluster)->metrics(), run);
  (*cluster)->stop();
  run.wall_s = std::chrono::duration<double>(clock_type::now() - wall0).count();
  run.peak_rss_bytes = peak_rss_bytes();
  std::uint32_t desired = 0;
  for (const auto& d : s.deployments) desired += d.replicas;
  const auto attributed = attribute_faults(log->events(), desired);
  std::map<std::uint64_t, sim_fault_record> faults;
  for (const auto& e : attributed) {
    if (e.fault_id == 0) continue;
    auto& f = faults[e.fault_id];
    f.id = e.fault_id;
    const double at = (e.t_ns - t0) / 1e9;
    if (e.kind == event_kind::fault_injected) {
      f.kind = e.detail;
      f.at_s = at;
    } else if (e.kind == event_kind::fault_detected && f.detect_s < 0) {
      f.detect_s = at - f.at_s;
    } else if (e.kind == event_kind::fault_recovered && f.recover_s < 0) {
      f.recover_s = at - f.at_s;
    }
  }
  for (auto& [id, f] : faults) run.faults.push_back(f);
  if (run.cold_start.modelled) {
    auto& c = run.cold_start;
    note_ready_times(log->events(), t0, c);
    c.store_limit_bytes_per_s = s.storage.store_gb_per_s * 1e9;
    c.peak_store_bytes_per_s = storage->peak_store_bytes_per_s;
    c.store_bytes = storage->store_bytes;
    c.fetches = storage->fetches;
    c.loads = storage->loads;
    c.loads_from_cache = storage->loads_from_cache;
  }
  if (gaps > 0) spdlog::error("event=sim_stream_violations count={}", gaps);
  run.stream_violations = gaps;
  return run;
}

}  // namespace

expected<sim_report> run_simulation(const sim_config& config) {
  scenario s = config.scenario;
  if (config.rate_multiplier) s.workload.rate_multiplier = *config.rate_multiplier;
  if (config.duration_s) s.duration_s = *config.duration_s;
  if (s.deployments.empty()) return make_error(errc::invalid_argument, "scenario has no deployment");
  const std::uint64_t seed = config.seed.value_or(s.seed);
  auto workload = make_workload(s, seed);
  if (!workload) return std::unexpected(workload.error());
  const auto faults = schedule_faults(s, seed);
  sim_report report;
  report.scenario = s.name;
  report.seed = seed;
  report.duration_s = s.duration_s;
  report.slo_ttft_ms = s.slo.ttft_ms;
  report.slo_tpot_ms = s.slo.tpot_ms;
  const run_inputs in{s, *workload, faults, seed, s.duration_s, config.drain_s};
  std::vector<std::string> policies = s.compare_policies;
  if (policies.empty()) policies.push_back("");
  std::vector<run_mode> modes;
  for (const bool fixed : {false, true}) {
    if (fixed && !s.compare_fixed_fleet) continue;
    if (!s.compare_cold_start) {
      modes.push_back({fixed});
      continue;
    }
    for (const bool staggered : {false, true})
      for (const bool affinity : {false, true}) modes.push_back({fixed, true, staggered, affinity});
  }
  for (const auto& p : policies) {
    for (const auto& mode : modes) {
      spdlog::info("event=sim_run_start scenario={} policy={} fleet={} requests={} faults={}", s.name,
                   p.empty() ? "default" : p, mode.fixed_fleet ? "fixed" : "as deployed", workload->size(),
                   faults.size());
      auto run = run_once(in, p, mode);
      if (!run) return std::unexpected(run.error());
      report.runs.push_back(std::move(*run));
    }
  }
  return report;
}

}  // namespace exa::chaos
