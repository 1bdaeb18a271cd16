#include "actors/embedded_cluster.hpp"

#include <caf/actor_registry.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_actor.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <thread>

#include "actors/chaos_hooks.hpp"
#include "actors/cluster_metrics.hpp"
#include "actors/cluster_supervisor.hpp"
#include "actors/gateway_bridge.hpp"
#include "actors/messages.hpp"
#include "actors/sim_storage_actor.hpp"
#include "cluster/hardware.hpp"
#include "cluster/membership.hpp"
#include "cluster/model_ref.hpp"
#include "engine/sim_engine.hpp"
#include "gpu/device_select.hpp"

namespace exa::actors {
namespace {

class system_config : public caf::actor_system_config {
 public:
  explicit system_config(const cluster_options& o) {
    register_message_types(*this);
    set("logger.verbosity", caf::atom("quiet"));
    set("logger.console", caf::atom("none"));
    if (o.deterministic) {
      set("scheduler.policy", caf::atom("testing"));
    } else {
      const auto cores = std::max(2u, std::thread::hardware_concurrency());
      set("scheduler.max-threads", static_cast<std::size_t>(o.scheduler_threads ? o.scheduler_threads : cores));
    }
  }
};

// The model file of each deployment, as a warm node's cache holds it: by
// the cache's name for it (model::store_name), with the preset's bytes.
std::vector<cluster::cached_file> sim_warm_files(const cluster_options& o) {
  std::vector<cluster::cached_file> out;
  if (o.sim_warm_nodes.empty()) return out;
  for (const auto& d : o.deployments) {
    const std::string& file = d.model_file.empty() ? o.default_model_file : d.model_file;
    auto ref = cluster::parse_model_ref(file);
    auto f = cluster::cache_entry_for(file, d.model_sha256, ref && ref->is_preset() ? ref->preset->weight_bytes : 0);
    if (std::find(out.begin(), out.end(), f) == out.end()) out.push_back(std::move(f));
  }
  return out;
}

// The simulated storage, when modelled: warm nodes hold every deployment's
// file (by the cache's name for it, which replicas load it by).
expected<caf::actor> spawn_sim_storage(caf::actor_system& sys, const cluster_options& o) {
  auto model = cluster::storage_model::create(*o.sim_storage);
  if (!model) return make_error(errc::invalid_argument, "sim_storage: " + model.error().message);
  std::vector<std::pair<cluster::node_id, std::string>> warm;
  for (const auto n : o.sim_warm_nodes) {
    if (n >= o.nodes)
      return make_error(errc::invalid_argument, "sim_warm_nodes: node " + std::to_string(n) + " is not one of the " +
                                                    std::to_string(o.nodes) + " nodes");
    for (const auto& f : sim_warm_files(o)) warm.emplace_back(n, f.name);
  }
  return sys.spawn(sim_storage_actor, std::move(*model), std::move(warm), o.storage_stats);
}

}  // namespace

expected<cluster_plan> make_cluster_plan(const cluster_options& o, std::shared_ptr<cluster_metrics> metrics) {
  cluster_plan plan;
  std::optional<engine::sim_device> sim;
  std::uint64_t memory_bytes = o.device_memory_bytes;
  if (o.engine == "sim") {
    auto gpu = cluster::device_preset(o.sim_gpu);
    if (!gpu) return std::unexpected(gpu.error());
    sim = engine::sim_device{gpu->memory_bandwidth_bytes_per_s, gpu->fp16_flops_per_s, gpu->int8_ops_per_s};
    // With the storage modelled, loads take what the storage actor says.
    if (o.sim_storage) sim->load_bytes_per_s = std::numeric_limits<double>::infinity();
    memory_bytes = gpu->memory_bytes;
    plan.controller.device_reserved_bytes = gpu->device_reserved_bytes;
    plan.controller.replica_overhead_bytes = gpu->replica_overhead_bytes;
  }
  plan.metrics = metrics;
  plan.controller.metrics = metrics;
  const chaos_hooks hooks{o.fault_injector, o.event_log, o.device_busy_us};
  plan.health.heartbeat_interval_ms = o.heartbeat_interval_ms;
  plan.health.suspect_after_missed = o.suspect_after_missed;
  plan.health.observation_window_ms = o.observation_window_ms;
  plan.health.hooks = hooks;
  plan.health.metrics = metrics;
  plan.health.wall_clock_from_actor_clock = o.deterministic;
  plan.router.max_attempts = o.max_attempts;
  for (const auto& d : o.deployments) plan.router.starting.push_back(d.name);
  plan.router.hooks = hooks;
  plan.router.request_deadline_ms = o.request_deadline_ms;
  plan.router.chat_template = o.chat_template;
  plan.router.admission.queued_per_model_max = o.queued_per_model_max;
  plan.router.admission.queued_global_max = o.queued_global_max;
  plan.router.admission.in_flight_per_replica_max = o.in_flight_per_replica_max;
  plan.router.fair_across_tenants = o.fair_across_tenants;
  plan.router.tenant_headroom_slots = o.tenant_headroom_slots;
  plan.router.table.default_policy = o.default_routing;
  plan.router.region = o.gateway_region;
  plan.router_is_hub = o.routers_subscribe;
  auto& c = plan.controller;
  c.engine = o.engine;
  c.default_kv_tokens = o.default_kv_tokens;
  c.default_model_file = o.default_model_file;
  c.default_routing = o.default_routing;
  c.desired = std::make_shared<desired_state>();
  c.hooks = hooks;
  c.migration_parallelism = o.migration_parallelism;
  c.drain_deadline_ms = o.drain_deadline_ms;
  c.degraded_replace_after_ms = o.degraded_replace_after_ms;
  c.rollout_bake_s = o.rollout_bake_s;
  c.rollout_policy.min_samples = o.rollout_min_samples;
  c.rollout_policy.latency_ratio = o.rollout_latency_percent / 100.0;
  c.rollout_policy.latency_slack_ms = o.rollout_latency_slack_ms;
  c.rollout_policy.error_rate_slack = o.rollout_error_points / 100.0;
  c.rollout_tick_ms = o.rollout_tick_ms;
  c.rollout_start_timeout_ms = o.rollout_start_timeout_ms;
  c.rollout_drop_grace_ms = o.rollout_drop_grace_ms;
  c.autoscale.up_window_ms = o.autoscale_up_window_s * 1000;
  c.autoscale.down_window_ms = o.autoscale_down_window_s * 1000;
  c.autoscale.up_cooldown_ms = o.autoscale_up_cooldown_s * 1000;
  c.autoscale.down_cooldown_ms = o.autoscale_down_cooldown_s * 1000;
  c.autoscale.tolerance = o.autoscale_tolerance_percent / 100.0;
  c.autoscale.max_down_percent = o.autoscale_max_down_percent;
  c.autoscale_tick_ms = o.autoscale_tick_ms;
  plan.router.load_report_ms = o.autoscale_tick_ms;
  c.loads.cluster_max = o.loads_max;
  c.loads.per_node_max = o.loads_per_node_max;
  c.cache_affinity = o.cache_affinity;
  c.consolidate = o.consolidate;
  const auto warm_files = sim_warm_files(o);
  for (const auto& d : o.deployments) c.desired->deployments[d.name] = d;
  for (std::uint32_t n = 0; n < o.nodes; ++n) {
    const cluster::rack_id rack = o.racks ? n % o.racks : 0;
    c.nodes.push_back({n, rack, o.devices_per_node, memory_bytes});
    if (o.regions) c.node_regions[n] = "r" + std::to_string(n % o.regions);
    plan.health.nodes.push_back(n);
    node_config nc;
    nc.id = n;
    nc.rack = rack;
    if (o.regions) nc.region = "r" + std::to_string(n % o.regions);
    nc.devices = o.devices_per_node;
    nc.device.memory_bytes = memory_bytes;
    nc.device.sim = sim;
    nc.device.sim_prefix_block_tokens = o.sim_prefix_block_tokens;
    nc.device.sim_step_stop = o.sim_step_stop;
    nc.device.page_bytes = o.kv_page_bytes;
    nc.device.threads = o.device_threads;
    nc.device.measure_wall_time = !o.deterministic;
    nc.device.model_step_time = o.deterministic && o.model_step_time;
    nc.device.inline_executor = o.deterministic;
    nc.heartbeat_interval_ms = o.heartbeat_interval_ms;
    nc.metrics = metrics;
    nc.hooks = hooks;
    nc.wall_clock_from_actor_clock = o.deterministic;
    nc.device_check_interval_ms = o.device_check_interval_ms;
    nc.device_check_timeout_ms = o.device_check_timeout_ms;
    nc.replica_step_timeout_ms = o.deterministic ? 0 : o.step_timeout_ms;  // virtual time: see replica_actor
    nc.replica_step_stop = o.step_stop;
    nc.lease_ms = cluster::node_lease_ms(o.heartbeat_interval_ms, o.suspect_after_missed, o.observation_window_ms);
    nc.model_cache_bytes = o.model_cache_bytes;
    nc.model_store = o.model_store;
    // Each node its own cache directory: a node's cache deletes what it evicts.
    nc.model_cache_dir = o.model_cache_dir.empty() ? "" : o.model_cache_dir + "/node-" + std::to_string(n);
    if (std::find(o.sim_warm_nodes.begin(), o.sim_warm_nodes.end(), n) != o.sim_warm_nodes.end())
      nc.simulated_cache = warm_files;
    nc.degradation.step_latency_max = std::chrono::milliseconds(o.degraded_step_ms);
    nc.degradation.error_rate_max = o.degraded_error_percent / 100.0;
    plan.nodes.push_back(nc);
  }
  return plan;
}

// The nodes' devices: CPU devices are opened by each device actor (fresh
// on a restart, as ever); GPUs are opened here, once, so that `cuda` fails
// at start with the runtime's reason and the ledger gets what each card
// really reserved.
expected<void> open_cluster_devices(const cluster_options& o, cluster_plan& plan) {
  auto request = gpu::parse_kind_request(o.device_kind);
  if (!request) return make_error(errc::invalid_argument, "device_kind: " + request.error().message);
  if (o.engine == "sim" || *request == gpu::kind_request::cpu) return {};
  const std::uint32_t count = o.nodes * o.devices_per_node;
  auto choice = gpu::resolve_device_kind(*request, count);
  if (!choice) return std::unexpected(choice.error());
  if (choice->kind == gpu::device_kind::cpu) return {};  // auto fell back (and said why)
  auto opened = gpu::open_devices(choice->kind, count, device_options_of(plan.nodes.front().device));
  if (!opened) return std::unexpected(opened.error());
  for (std::size_t n = 0; n < plan.nodes.size(); ++n) {
    auto& nc = plan.nodes[n];
    nc.device_kind = choice->kind;
    nc.opened_devices.assign(opened->begin() + n * o.devices_per_node, opened->begin() + (n + 1) * o.devices_per_node);
    nc.device.memory_bytes = gpu::min_memory_budget(nc.opened_devices);
    plan.controller.nodes[n].device_memory_bytes = nc.device.memory_bytes;
  }
  return {};
}

struct embedded_cluster::impl {
  explicit impl(const cluster_options& o) : config(o), system(config) {}
  system_config config;
  caf::actor_system system;
  std::shared_ptr<cluster_metrics> metrics;
  std::shared_ptr<api::gateway_backend> backend;
  caf::actor root;
  bool deterministic = false;
  bool stopped = false;
  caf::actor sim_storage;  // simulation with the storage modelled
};

embedded_cluster::embedded_cluster(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

embedded_cluster::~embedded_cluster() { stop(); }

expected<std::unique_ptr<embedded_cluster>> embedded_cluster::start(cluster_options options) {
  if (options.nodes == 0 || options.devices_per_node == 0)
    return make_error(errc::invalid_argument, "a cluster needs at least one node with one device");
  if (!options.model_store.empty() && options.model_cache_dir.empty())
    return make_error(errc::invalid_argument,
                      "model_store needs model_cache_dir: the node-local directory fetched models are copied to");
  auto p = std::make_unique<impl>(options);
  p->deterministic = options.deterministic;
  p->metrics = cluster_metrics::create();
  p->backend = make_gateway_bridge(p->system, p->metrics);
  auto plan = make_cluster_plan(options, p->metrics);
  if (!plan) return std::unexpected(plan.error());
  if (options.sim_storage && options.engine == "sim") {
    auto storage = spawn_sim_storage(p->system, options);
    if (!storage) return std::unexpected(storage.error());
    p->sim_storage = *storage;
    for (auto& nc : plan->nodes) nc.hooks.sim_storage = p->sim_storage;  // their replicas load through it
    plan->controller.hooks.sim_storage = p->sim_storage;                  // it hears of finished fetches
  }
  if (auto ok = open_cluster_devices(options, *plan); !ok) return std::unexpected(ok.error());
  const auto device_kind = gpu::to_string(plan->nodes.front().device_kind);
  p->root = p->system.spawn(cluster_supervisor, std::move(*plan));
  if (!options.deterministic) {
    // The front doors may send the first request right after start(): wait
    // until the router and controller are registered (a few milliseconds).
    auto& reg = p->system.registry();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!(reg.get(router_atom::value) && reg.get(controller_atom::value))) {
      if (std::chrono::steady_clock::now() > deadline)
        return make_error(errc::internal, "the cluster's router and controller did not start within 10 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  spdlog::info("event=embedded_cluster_start nodes={} devices_per_node={} device_kind={} engine={} deterministic={}",
               options.nodes, options.devices_per_node, device_kind,
               options.engine, options.deterministic);
  return std::unique_ptr<embedded_cluster>(new embedded_cluster(std::move(p)));
}

std::shared_ptr<api::gateway_backend> embedded_cluster::backend() const { return impl_->backend; }
std::shared_ptr<metrics::registry> embedded_cluster::metrics() const { return impl_->metrics->registry; }
caf::actor_system& embedded_cluster::system() { return impl_->system; }

caf::scheduler::test_coordinator* embedded_cluster::test_scheduler() {
  if (!impl_->deterministic) return nullptr;
  return &dynamic_cast<caf::scheduler::test_coordinator&>(impl_->system.scheduler());
}

void embedded_cluster::stop() {
  if (!impl_ || impl_->stopped) return;
  impl_->stopped = true;
  caf::anon_send_exit(impl_->root, caf::exit_reason::user_shutdown);
  if (impl_->sim_storage) caf::anon_send_exit(impl_->sim_storage, caf::exit_reason::user_shutdown);
  if (auto* sched = test_scheduler()) {
    // Virtual time: run everything that is left, firing timers, until quiet.
    for (int i = 0; i < 1000 && (sched->run() > 0 || sched->trigger_timeouts() > 0); ++i) {
    }
  }
  impl_->root = nullptr;
  spdlog::info("event=embedded_cluster_stop");
}

}  // namespace exa::actors
