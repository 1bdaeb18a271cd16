#include "chaos/sim_scenario.hpp"

#include <filesystem>

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <set>
#include <span>

#include "chaos/plan_json.hpp"
#include "chaos/sim_workload.hpp"
#include "cluster/autoscaler.hpp"
#include "cluster/hardware.hpp"
#include "cluster/ledger.hpp"
#include "cluster/model_shape.hpp"
#include "cluster/rollout.hpp"
#include "cluster/routing.hpp"
#include "common/assert.hpp"

namespace exa::chaos {

namespace {

using json_detail::field_errors;
using json_detail::is_object_field;
using json_detail::json;
using json_detail::object_reader;

// Bounds (habit 7). The topology bounds cover the largest clusters the
// simulator is meant for with room to spare; past them a typo is likelier
// than a real cluster.
constexpr std::uint32_t max_nodes = 16384;
constexpr std::uint32_t max_gpus_per_node = 64;
constexpr std::size_t max_deployments = 64;
constexpr std::uint32_t max_replicas = 1u << 20;
constexpr std::uint32_t max_context_length = 1u << 20;
constexpr std::uint32_t max_replicas_per_node_limit = 1024;
constexpr double max_duration_s = 86'400;
constexpr double max_rate_multiplier = 1000;
constexpr double max_rate_per_s = 100'000;
constexpr std::uint32_t max_request_tokens = 1u << 20;
constexpr double max_burst_factor = 1000;
constexpr std::size_t max_trace_path_chars = 4096;
constexpr double max_slo_ms = 3'600'000;
constexpr double max_samples = 100'000;
constexpr std::uint32_t max_heartbeat_interval_ms = 600'000;
constexpr std::uint32_t max_suspect_after_missed = 100;
constexpr std::uint32_t max_window_ms = 3'600'000;
constexpr std::uint32_t max_migration_parallelism = 1024;
constexpr std::uint32_t max_request_deadline_ms = 86'400'000;
constexpr double max_storage_gb_per_s = 1e6;  // a petabyte a second: past it, a typo
constexpr std::size_t max_rollouts = 64;

// The batch limits the memory check assumes: the simulated engine's defaults
// (engine/sim_engine.hpp), which size the activation reserve.
constexpr std::uint32_t fit_max_batch_tokens = 2048;
constexpr std::uint32_t fit_max_batch_sequences = 64;

template <class Names>
std::string name_list(const Names& names) {
  std::string out;
  for (const auto& n : names) {
    if (n == "cpu") continue;  // the simulator models GPUs only
    out += fmt::format("{}{}", out.empty() ? "" : ", ", n);
  }
  return out;
}

template <class Names>
bool is_one_of(const Names& names, std::string_view s) {
  return s != "cpu" && std::find(names.begin(), names.end(), s) != names.end();
}

void parse_topology(const object_reader& r, sim_topology& t) {
  r.known_keys({"nodes", "gpus_per_node", "racks", "gpu", "prefix_cache_block_tokens", "layer_yield"});
  r.u32("nodes", 1, max_nodes, t.nodes);
  r.u32("gpus_per_node", 1, max_gpus_per_node, t.gpus_per_node);
  r.u32("racks", 1, max_nodes, t.racks);
  r.u32("prefix_cache_block_tokens", 0, 1024, t.prefix_cache_block_tokens);
  if (!r.errors().failed() && r.has("layer_yield")) {
    const auto& v = r.at("layer_yield");
    using engine::sim_step_stop;
    if (v.is_boolean())
      t.layer_yield = v.get<bool>() ? sim_step_stop::every_step : sim_step_stop::none;
    else if (v.is_string() && v.get<std::string>() == "cpu")
      t.layer_yield = sim_step_stop::every_step;
    else if (v.is_string() && v.get<std::string>() == "cuda")
      t.layer_yield = sim_step_stop::long_steps;
    else
      r.errors().fail(r.field("layer_yield"), "must be true, false, \"cpu\" or \"cuda\" (whose engine's step stop)");
  }
  if (!r.errors().failed() && t.racks > t.nodes)
    r.errors().fail(r.field("racks"), fmt::format("{} racks for {} nodes leaves racks empty", t.racks, t.nodes));
  r.string("gpu", 32, t.gpu);
  const auto& gpus = cluster::device_preset_names();
  if (!r.errors().failed() && !is_one_of(gpus, t.gpu))
    r.errors().fail(r.field("gpu"), fmt::format("must be one of {} (got \"{}\")", name_list(gpus), t.gpu));
}

/// A necessary condition for placement, checked here so that a scenario that
/// cannot be placed fails at once, naming the field, instead of after the
/// simulator has built the cluster: the deployment alone (other deployments
/// share the nodes; placement has the last word) must fit max_replicas_per_node
/// replicas on one node and all its replicas on the cluster, by the ledger's
/// formulas at the smallest tensor-parallel degree that fits a device.
void check_fit(const object_reader& r, const sim_topology& t, const sim_deployment& d) {
  if (r.errors().failed()) return;
  const auto precision = cluster::precision_from_string(d.precision);
  auto shape = cluster::model_shape_preset(d.model, precision.value_or(cluster::precision::fp16));
  auto device = cluster::device_preset(t.gpu);
  EXA_ASSERT_MSG(precision && shape && device, "names are validated before the fit check");
  cluster::replica_config config{.kv_tokens = d.kv_tokens,
                                 .max_batch_tokens = fit_max_batch_tokens,
                                 .max_batch_sequences = fit_max_batch_sequences,
                                 .replica_overhead_bytes = device->replica_overhead_bytes};
  const auto tp = cluster::min_tensor_parallel(*shape, config, *device, t.gpus_per_node);
  if (!tp) return r.errors().fail(r.field("kv_tokens"), tp.error().message);
  if (!*tp)
    return r.errors().fail(r.field("kv_tokens"),
                           fmt::format("one replica of {} {} with {} KV tokens does not fit a node of {} {}", d.model,
                                       d.precision, d.kv_tokens, t.gpus_per_node, t.gpu));
  config.tensor_parallel = **tp;
  const auto per_device = cluster::estimate(*shape, config);
  EXA_ASSERT_MSG(per_device.has_value(), "min_tensor_parallel estimated this configuration");
  const std::uint64_t per_node =
      cluster::replicas_per_node(cluster::shards_per_device(*per_device, *device), t.gpus_per_node, **tp);
  if (d.max_replicas_per_node && *d.max_replicas_per_node > per_node)
    return r.errors().fail(
        r.field("max_replicas_per_node"),
        fmt::format("{} replicas of {} {} ({} per device, tensor parallel {}) do not fit a node of {} {}: at most {}",
                    *d.max_replicas_per_node, d.model, d.precision, cluster::format_bytes(per_device->total_bytes()),
                    **tp, t.gpus_per_node, t.gpu, per_node));
  const std::uint64_t cap = std::min<std::uint64_t>(per_node, d.max_replicas_per_node.value_or(per_node));
  if (d.replicas > cap * t.nodes)
    r.errors().fail(r.field("replicas"), fmt::format("{} replicas do not fit {} nodes at {} per node", d.replicas,
                                                     t.nodes, cap));
}

void parse_deployment(const object_reader& r, const sim_topology& t, sim_deployment& d) {
  r.known_keys({"name", "model", "precision", "replicas", "kv_tokens", "context_length", "max_replicas_per_node",
                "routing", "prefix_slack_tokens", "prefix_slack_ratio", "prefix_slack_s", "warm_pool_percent",
                "autoscale"});
  r.u32("warm_pool_percent", 0, 50, d.warm_pool_percent);
  if (is_object_field(r, "autoscale")) {
    const object_reader a(r.at("autoscale"), r.field("autoscale"), r.errors());
    a.known_keys({"min", "max", "metric", "target", "idle_to_zero_s"});
    a.require("max");
    a.u32("min", 0, max_replicas, d.autoscale_min);
    a.u32("max", 1, max_replicas, d.autoscale_max);
    a.string("metric", 32, d.autoscale_metric);
    a.number("target", 0, true, 1e9, d.autoscale_target);
    a.u32("idle_to_zero_s", 0, 604800, d.idle_to_zero_s);
    if (!r.errors().failed() && d.autoscale_min > d.autoscale_max)
      r.errors().fail(a.field("min"), fmt::format("{} is above max ({})", d.autoscale_min, d.autoscale_max));
    if (!r.errors().failed()) {
      auto m = cluster::scale_metric_from_string(d.autoscale_metric);
      if (!m) r.errors().fail(a.field("metric"), m.error().message);
      else if (*m == cluster::scale_metric::kv_utilization && d.autoscale_target > 1)
        r.errors().fail(a.field("target"), "a kv_utilization target is a fraction: at most 1");
    }
    if (!r.errors().failed() && d.idle_to_zero_s > 0 && d.autoscale_min > 0)
      r.errors().fail(a.field("idle_to_zero_s"), "needs min 0 (it scales to zero)");
  }
  r.require("name");
  r.string("name", max_plan_name_chars, d.name);
  if (!r.errors().failed() && !json_detail::valid_name(d.name))
    r.errors().fail(r.field("name"), "must be letters, digits, '.', '_' or '-'");
  r.string("model", 64, d.model);
  const auto& models = cluster::model_shape_preset_names();
  if (!r.errors().failed() && !is_one_of(models, d.model))
    r.errors().fail(r.field("model"), fmt::format("must be one of {} (got \"{}\")", name_list(models), d.model));
  r.string("precision", 16, d.precision);
  const auto precision = cluster::precision_from_string(d.precision);
  if (!r.errors().failed() && !precision)
    r.errors().fail(r.field("precision"), "must be fp32, fp16, bf16, int8 or int4 (got \"" + d.precision + "\")");
  if (precision) d.precision = std::string(cluster::to_string(*precision));
  r.u32("replicas", 1, max_replicas, d.replicas);
  r.u32("kv_tokens", 1, static_cast<std::uint32_t>(cluster::max_kv_tokens), d.kv_tokens);
  std::uint32_t v = 0;
  if (r.has("context_length")) {
    r.u32("context_length", 1, max_context_length, v);
    if (!r.errors().failed() && v > d.kv_tokens)
      r.errors().fail(r.field("context_length"),
                      fmt::format("{} is more than kv_tokens ({}): one sequence must fit the cache", v, d.kv_tokens));
    d.context_length = v;
  }
  if (r.has("max_replicas_per_node")) {
    r.u32("max_replicas_per_node", 1, max_replicas_per_node_limit, v);
    d.max_replicas_per_node = v;
  }
  r.string("routing", 32, d.routing);
  const auto policies = cluster::routing_policy_names();
  if (!r.errors().failed() && !is_one_of(policies, d.routing))
    r.errors().fail(r.field("routing"), fmt::format("must be one of {} (got \"{}\")", name_list(policies), d.routing));
  r.u64("prefix_slack_tokens", 0, cluster::prefix_slack_tokens_max, d.prefix_slack_tokens);
  r.number("prefix_slack_ratio", 0, false, cluster::prefix_slack_ratio_max, d.prefix_slack_ratio);
  r.number("prefix_slack_s", 0, false, cluster::prefix_slack_s_max, d.prefix_slack_s);
  check_fit(r, t, d);
}

void parse_deployments(const object_reader& top, scenario& s) {
  top.require("deployments");
  if (top.errors().failed()) return;
  const json& arr = top.at("deployments");
  if (!arr.is_array() || arr.empty()) return top.errors().fail("deployments", "must be a non-empty array");
  if (arr.size() > max_deployments)
    return top.errors().fail("deployments", fmt::format("more than {} deployments", max_deployments));
  std::set<std::string> names;
  for (std::size_t i = 0; i < arr.size() && !top.errors().failed(); ++i) {
    const std::string path = fmt::format("deployments[{}]", i);
    if (!arr[i].is_object()) return top.errors().fail(path, "must be an object");
    sim_deployment d;
    parse_deployment(object_reader(arr[i], path, top.errors()), s.topology, d);
    if (!top.errors().failed() && !names.insert(d.name).second)
      top.errors().fail(path + ".name", "\"" + d.name + "\" names two deployments");
    s.deployments.push_back(std::move(d));
  }
}

void parse_conversations(const object_reader& r, sim_workload_spec& w) {
  if (!is_object_field(r, "conversations")) return;
  const object_reader c(r.at("conversations"), r.field("conversations"), r.errors());
  auto& cs = w.conversations;
  c.known_keys({"apps", "system_prompt_tokens", "continue_probability", "open_max", "turns_max"});
  c.require("apps");
  c.u32("apps", 1, 1u << 16, cs.apps);
  c.u32("system_prompt_tokens", 0, max_trace_tokens, cs.system_prompt_tokens);
  c.number("continue_probability", 0, false, 1, cs.continue_probability);
  c.u32("open_max", 1, 1u << 16, cs.open_max);
  c.u32("turns_max", 1, 1024, cs.turns_max);
}

void parse_trace_workload(const object_reader& r, sim_workload_spec& w) {
  r.known_keys({"kind", "trace", "rate_multiplier", "diurnal", "conversations"});
  parse_conversations(r, w);
  r.require("trace", "required for trace workloads");
  r.string("trace", max_trace_path_chars, w.trace);
  if (!r.errors().failed() && w.trace.empty()) r.errors().fail(r.field("trace"), "must not be empty");
  r.number("rate_multiplier", 0, true, max_rate_multiplier, w.rate_multiplier);
}

void parse_synthetic_workload(const object_reader& r, double duration_s, sim_workload_spec& w) {
  if (w.kind == sim_workload_kind::poisson)
    r.known_keys({"kind", "rate_per_s", "prompt_tokens", "max_tokens", "tenants", "start_s", "diurnal"});
  else
    r.known_keys({"kind", "rate_per_s", "prompt_tokens", "max_tokens", "burst_factor", "burst_period_s", "tenants",
                  "start_s", "diurnal"});
  r.number("start_s", 0, false, duration_s, w.start_s);
  // "tenants": [{"name": "quiet", "rate_per_s": 2}, ...]: one stream each.
  if (!r.errors().failed() && r.has("tenants")) {
    const auto& list = r.at("tenants");
    if (!list.is_array() || list.empty() || list.size() > 64)
      return r.errors().fail(r.field("tenants"), "must be an array of 1 to 64 {name, rate_per_s} objects");
    double total = 0;
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (!list[i].is_object()) return r.errors().fail(r.field("tenants"), "every tenant must be an object");
      const object_reader t(list[i], r.field("tenants") + "[" + std::to_string(i) + "]", r.errors());
      t.known_keys({"name", "rate_per_s"});
      t.require("name");
      t.require("rate_per_s");
      sim_workload_spec::tenant_stream ts;
      t.string("name", 64, ts.name);
      t.number("rate_per_s", 0, true, max_rate_per_s, ts.rate_per_s);
      if (r.errors().failed()) return;
      total += ts.rate_per_s;
      w.tenants.push_back(std::move(ts));
    }
    w.rate_per_s = total;
  }
  r.number("rate_per_s", 0, true, max_rate_per_s, w.rate_per_s);
  r.u32("prompt_tokens", 1, max_request_tokens, w.prompt_tokens);
  r.u32("max_tokens", 1, max_request_tokens, w.max_tokens);
  r.number("burst_factor", 1, false, max_burst_factor, w.burst_factor);
  r.number("burst_period_s", 0, true, max_duration_s, w.burst_period_s);
  const double expected_requests = w.rate_per_s * duration_s;
  if (!r.errors().failed() && expected_requests > static_cast<double>(max_workload_rows))
    r.errors().fail(r.field("rate_per_s"), fmt::format("the workload expects {:.0f} requests, more than {}",
                                                       expected_requests, max_workload_rows));
}

void parse_diurnal(const object_reader& r, sim_workload_spec& w) {
  if (!is_object_field(r, "diurnal")) return;
  const object_reader d(r.at("diurnal"), r.field("diurnal"), r.errors());
  d.known_keys({"period_s", "trough"});
  d.require("period_s");
  d.number("period_s", 0, true, max_duration_s, w.diurnal_period_s);
  d.number("trough", 0, false, 1, w.diurnal_trough);
}

void parse_workload(const object_reader& r, double duration_s, sim_workload_spec& w) {
  parse_diurnal(r, w);
  std::string kind = r.has("trace") ? "trace" : "";
  if (kind.empty()) r.require("kind", "required: \"poisson\" or \"bursty\" (or give \"trace\")");
  r.string("kind", 16, kind);
  if (r.errors().failed()) return;
  if (kind == "trace") {
    w.kind = sim_workload_kind::trace;
    return parse_trace_workload(r, w);
  }
  if (kind != "poisson" && kind != "bursty")
    return r.errors().fail(r.field("kind"), "must be \"trace\", \"poisson\" or \"bursty\" (got \"" + kind + "\")");
  w.kind = kind == "poisson" ? sim_workload_kind::poisson : sim_workload_kind::bursty;
  parse_synthetic_workload(r, duration_s, w);
}

void parse_timing(const object_reader& r, sim_timing& t) {
  r.known_keys({"heartbeat_interval_ms", "suspect_after_missed", "observation_window_ms", "migration_parallelism",
                "request_deadline_ms", "in_flight_per_replica_max", "fair_admission", "tenant_headroom_slots",
                "loads_max", "loads_per_node_max", "autoscale_up_window_s", "autoscale_down_window_s",
                "autoscale_up_cooldown_s", "autoscale_down_cooldown_s", "consolidate"});
  r.u32("autoscale_up_window_s", 1, 3600, t.autoscale_up_window_s);
  r.u32("autoscale_down_window_s", 1, 86400, t.autoscale_down_window_s);
  r.u32("autoscale_up_cooldown_s", 0, 3600, t.autoscale_up_cooldown_s);
  r.u32("autoscale_down_cooldown_s", 0, 86400, t.autoscale_down_cooldown_s);
  r.u32("loads_max", 1, 1u << 20, t.loads_max);
  r.u32("loads_per_node_max", 1, 4096, t.loads_per_node_max);
  r.u32("tenant_headroom_slots", 0, 1u << 20, t.tenant_headroom_slots);
  r.u32("in_flight_per_replica_max", 1, 1u << 20, t.in_flight_per_replica_max);
  if (!r.errors().failed() && r.has("consolidate")) {
    if (!r.at("consolidate").is_boolean()) r.errors().fail(r.field("consolidate"), "must be true or false");
    else t.consolidate = r.at("consolidate").get<bool>();
  }
  if (!r.errors().failed() && r.has("fair_admission")) {
    const auto& v = r.at("fair_admission");
    if (!v.is_boolean())
      r.errors().fail(r.field("fair_admission"), "must be true or false");
    else
      t.fair_admission = v.get<bool>();
  }
  r.u32("heartbeat_interval_ms", 1, max_heartbeat_interval_ms, t.heartbeat_interval_ms);
  r.u32("suspect_after_missed", 1, max_suspect_after_missed, t.suspect_after_missed);
  r.u32("observation_window_ms", 1, max_window_ms, t.observation_window_ms);
  r.u32("migration_parallelism", 1, max_migration_parallelism, t.migration_parallelism);
  r.u32("request_deadline_ms", 1, max_request_deadline_ms, t.request_deadline_ms);
}

void parse_slo(const object_reader& r, sim_slo& slo) {
  r.known_keys({"ttft_ms", "tpot_ms"});
  r.number("ttft_ms", 0, true, max_slo_ms, slo.ttft_ms);
  r.number("tpot_ms", 0, true, max_slo_ms, slo.tpot_ms);
}

void parse_kill_rack(const object_reader& r, scenario& s) {
  r.known_keys({"kind", "at_s", "rack"});
  r.require("at_s", "required for kill_rack");
  r.require("rack", "required for kill_rack");
  double at_s = 0;
  r.number("at_s", 0, false, s.duration_s, at_s);
  std::uint32_t rack = 0;
  r.u32("rack", 0, std::numeric_limits<std::uint32_t>::max(), rack);
  if (r.errors().failed()) return;
  if (rack >= s.topology.racks)
    return r.errors().fail(r.field("rack"), fmt::format("{} is not a rack of a {}-rack topology", rack,
                                                        s.topology.racks));
  s.rack_losses.emplace_back(at_s, rack);
}

void parse_fault_entry(const object_reader& r, scenario& s) {
  r.require("kind");
  std::string kind;
  r.string("kind", 32, kind);
  if (r.errors().failed()) return;
  if (kind == "kill_rack") return parse_kill_rack(r, s);
  // The chaos fault parser checks targets against its cluster_spec and times
  // against its workload's duration; only those fields are read.
  cluster_spec cluster;
  cluster.nodes = s.topology.nodes;
  cluster.devices_per_node = s.topology.gpus_per_node;
  workload_spec workload;
  workload.duration_s = s.duration_s;
  fault_spec f;
  json_detail::parse_fault(r, cluster, workload, f);
  if (!r.errors().failed()) s.faults.push_back(f);
}

void parse_faults(const object_reader& top, scenario& s) {
  if (top.errors().failed() || !top.has("faults")) return;
  const json& arr = top.at("faults");
  if (!arr.is_array()) return top.errors().fail("faults", "must be an array");
  if (arr.size() > max_faults) return top.errors().fail("faults", fmt::format("more than {} faults", max_faults));
  for (std::size_t i = 0; i < arr.size() && !top.errors().failed(); ++i) {
    const std::string path = fmt::format("faults[{}]", i);
    if (!arr[i].is_object()) return top.errors().fail(path, "must be an object");
    parse_fault_entry(object_reader(arr[i], path, top.errors()), s);
  }
}

void parse_policies(const object_reader& top, scenario& s) {
  if (top.errors().failed() || !top.has("compare_policies")) return;
  const json& arr = top.at("compare_policies");
  const auto names = cluster::routing_policy_names();
  if (!arr.is_array()) return top.errors().fail("compare_policies", "must be an array");
  if (arr.size() > names.size())
    return top.errors().fail("compare_policies", fmt::format("more than the {} policies there are", names.size()));
  for (std::size_t i = 0; i < arr.size(); ++i) {
    const std::string path = fmt::format("compare_policies[{}]", i);
    const std::string got = arr[i].is_string() ? arr[i].get<std::string>() : arr[i].dump();
    if (!arr[i].is_string() || !is_one_of(names, got))
      return top.errors().fail(path, fmt::format("must be one of {} (got {})", name_list(names), arr[i].dump()));
    if (std::find(s.compare_policies.begin(), s.compare_policies.end(), got) != s.compare_policies.end())
      return top.errors().fail(path, "\"" + got + "\" is listed twice");
    s.compare_policies.push_back(got);
  }
}

void parse_storage(const object_reader& r, const sim_topology& t, sim_storage_spec& st) {
  r.known_keys({"store_gb_per_s", "node_network_gb_per_s", "node_disk_gb_per_s", "warm_nodes"});
  st.modelled = true;
  r.number("store_gb_per_s", 0, true, max_storage_gb_per_s, st.store_gb_per_s);
  r.number("node_network_gb_per_s", 0, false, max_storage_gb_per_s, st.node_network_gb_per_s);
  r.number("node_disk_gb_per_s", 0, true, max_storage_gb_per_s, st.node_disk_gb_per_s);
  r.u32("warm_nodes", 0, t.nodes, st.warm_nodes);
}

bool parse_bool(const object_reader& top, const char* key, bool& out) {
  if (top.errors().failed() || !top.has(key)) return false;
  if (!top.at(key).is_boolean()) {
    top.errors().fail(key, "must be true or false");
    return false;
  }
  out = top.at(key).get<bool>();
  return true;
}

void parse_cold_start(const object_reader& top, const json& doc, scenario& s) {
  if (is_object_field(top, "storage"))
    parse_storage(object_reader(doc.at("storage"), "storage", top.errors()), s.topology, s.storage);
  if (!parse_bool(top, "compare_cold_start", s.compare_cold_start) || !s.compare_cold_start) return;
  if (!s.storage.modelled)
    return top.errors().fail("compare_cold_start", "needs \"storage\": without it loads do not contend");
  if (s.timing.loads_max >= sim_timing{}.loads_max)
    top.errors().fail("compare_cold_start", "needs timing.loads_max (and loads_per_node_max): the staggered runs' limits");
}

void parse_rollout(const object_reader& r, const scenario& s, sim_rollout& ro) {
  r.known_keys({"at_s", "deployment", "model", "precision", "context_length", "steps", "bake_s", "surge",
                "max_unavailable", "min_samples"});
  r.require("at_s");
  r.require("deployment");
  r.number("at_s", 0, false, s.duration_s, ro.at_s);
  r.string("deployment", max_plan_name_chars, ro.deployment);
  const auto d = std::find_if(s.deployments.begin(), s.deployments.end(),
                              [&](const sim_deployment& x) { return x.name == ro.deployment; });
  if (!r.errors().failed() && d == s.deployments.end())
    return r.errors().fail(r.field("deployment"), "\"" + ro.deployment + "\" is not a deployment of the scenario");
  if (r.errors().failed()) return;
  ro.model = d->model;
  ro.precision = d->precision;
  ro.context_length = d->context_length;
  r.string("model", 64, ro.model);
  if (!r.errors().failed() && !is_one_of(cluster::model_shape_preset_names(), ro.model))
    r.errors().fail(r.field("model"), fmt::format("must be one of {} (got \"{}\")",
                                                  name_list(cluster::model_shape_preset_names()), ro.model));
  r.string("precision", 16, ro.precision);
  const auto precision = cluster::precision_from_string(ro.precision);
  if (!r.errors().failed() && !precision)
    r.errors().fail(r.field("precision"), "must be fp32, fp16, bf16, int8 or int4 (got \"" + ro.precision + "\")");
  if (precision) ro.precision = std::string(cluster::to_string(*precision));
  if (r.has("context_length")) {
    std::uint32_t v = 0;
    r.u32("context_length", 1, max_context_length, v);
    ro.context_length = v;
  }
  r.string("steps", 64, ro.steps);
  if (!r.errors().failed() && !ro.steps.empty())
    if (auto steps = cluster::parse_steps(ro.steps); !steps) r.errors().fail(r.field("steps"), steps.error().message);
  r.u32("bake_s", 1, 86400, ro.bake_s);
  r.u32("surge", 0, 1024, ro.surge);
  r.u32("max_unavailable", 0, 1024, ro.max_unavailable);
  r.u32("min_samples", 0, 1u << 20, ro.min_samples);
  if (!r.errors().failed() && ro.surge == 0 && ro.max_unavailable == 0)
    r.errors().fail(r.field("surge"), "surge and max_unavailable cannot both be 0: nothing could move");
}

void parse_rollouts(const object_reader& top, scenario& s) {
  if (top.errors().failed() || !top.has("rollouts")) return;
  const json& arr = top.at("rollouts");
  if (!arr.is_array()) return top.errors().fail("rollouts", "must be an array");
  if (arr.size() > max_rollouts) return top.errors().fail("rollouts", fmt::format("more than {} rollouts", max_rollouts));
  for (std::size_t i = 0; i < arr.size() && !top.errors().failed(); ++i) {
    const std::string path = fmt::format("rollouts[{}]", i);
    if (!arr[i].is_object()) return top.errors().fail(path, "must be an object");
    sim_rollout ro;
    parse_rollout(object_reader(arr[i], path, top.errors()), s, ro);
    s.rollouts.push_back(std::move(ro));
  }
  std::stable_sort(s.rollouts.begin(), s.rollouts.end(),
                   [](const sim_rollout& a, const sim_rollout& b) { return a.at_s < b.at_s; });
}

void parse_sections(const object_reader& top, const json& doc, scenario& s) {
  field_errors& errs = top.errors();
  top.require("topology");
  if (is_object_field(top, "topology")) parse_topology(object_reader(doc.at("topology"), "topology", errs), s.topology);
  top.number("duration_s", 0, true, max_duration_s, s.duration_s);
  parse_deployments(top, s);
  top.require("workload");
  if (is_object_field(top, "workload"))
    parse_workload(object_reader(doc.at("workload"), "workload", errs), s.duration_s, s.workload);
  if (is_object_field(top, "timing")) parse_timing(object_reader(doc.at("timing"), "timing", errs), s.timing);
  if (is_object_field(top, "slo")) parse_slo(object_reader(doc.at("slo"), "slo", errs), s.slo);
  parse_faults(top, s);
  parse_policies(top, s);
  if (!errs.failed() && top.has("compare_fixed_fleet")) {
    if (!top.at("compare_fixed_fleet").is_boolean()) errs.fail("compare_fixed_fleet", "must be true or false");
    else s.compare_fixed_fleet = top.at("compare_fixed_fleet").get<bool>();
  }
  parse_cold_start(top, doc, s);
  parse_rollouts(top, s);
  top.number("sample_interval_s", 0, true, s.duration_s, s.sample_interval_s);
  if (!errs.failed() && s.duration_s / s.sample_interval_s > max_samples)
    errs.fail("sample_interval_s", fmt::format("{} s over {} s is more than {:.0f} samples", s.sample_interval_s,
                                               s.duration_s, max_samples));
}

}  // namespace

expected<scenario> parse_scenario(const std::string& json_text) {
  auto parsed = json_detail::parse_json_object(json_text, max_plan_bytes, "scenario");
  if (!parsed) return std::unexpected(parsed.error());
  const json& doc = *parsed;

  scenario s;
  field_errors errs;
  const object_reader top(doc, "", errs);
  top.known_keys({"name", "description", "seed", "topology", "deployments", "workload", "duration_s", "timing", "slo",
                  "faults", "compare_policies", "compare_fixed_fleet", "storage", "compare_cold_start",
                  "rollouts", "sample_interval_s"});
  top.require("name");
  top.string("name", max_plan_name_chars, s.name);
  if (!errs.failed() && !json_detail::valid_name(s.name)) errs.fail("name", "must be letters, digits, '.', '_' or '-'");
  top.string("description", max_plan_description_chars, s.description);
  top.u64("seed", 0, std::numeric_limits<std::uint64_t>::max(), s.seed);
  parse_sections(top, doc, s);
  if (errs.failed()) return std::unexpected(errs.first());
  return s;
}

expected<scenario> load_scenario(const std::string& path) {
  auto text = json_detail::read_text_file(path, max_plan_bytes, "scenario");
  if (!text) return std::unexpected(text.error());
  auto parsed = parse_scenario(*text);
  if (!parsed) return make_error(parsed.error().code, path + ": " + parsed.error().message);
  // A relative trace path that is not found from the working directory is
  // looked up from the scenario's directory upward, so the shipped scenarios
  // ("chaos/traces/...") work from anywhere in or outside the source tree.
  namespace fs = std::filesystem;
  auto& trace = parsed->workload.trace;
  if (parsed->workload.kind == sim_workload_kind::trace && fs::path(trace).is_relative()) {
    std::error_code ec;
    if (!fs::exists(trace, ec)) {
      for (fs::path dir = fs::absolute(path, ec).parent_path(); !dir.empty(); dir = dir.parent_path()) {
        if (fs::exists(dir / trace, ec)) {
          trace = (dir / trace).string();
          break;
        }
        if (dir == dir.parent_path()) break;
      }
    }
  }
  return parsed;
}

std::vector<std::uint32_t> warm_node_ids(const sim_storage_spec& storage, std::uint32_t nodes) {
  std::vector<std::uint32_t> out;
  const std::uint32_t warm = std::min(storage.warm_nodes, nodes);
  for (std::uint32_t i = 0; i < warm; ++i)
    out.push_back(static_cast<std::uint32_t>(std::uint64_t{i} * nodes / warm));
  return out;
}

std::vector<sim_fault> schedule_faults(const scenario& s, std::uint64_t seed) {
  // The chaos scheduler expands random processes; a plan carries the faults
  // and the run length it needs, so both harnesses draw the same times.
  plan p;
  p.seed = seed;
  p.workload.duration_s = s.duration_s;
  p.faults = s.faults;
  std::vector<sim_fault> out;
  for (const scheduled_fault& f : schedule(p, seed)) {
    sim_fault& x = out.emplace_back();
    x.chaos = f.spec;
    x.at_s = f.at_s;
  }
  for (const auto& [at_s, rack] : s.rack_losses) {
    sim_fault& x = out.emplace_back();
    x.kill_rack = rack;
    x.at_s = at_s;
  }
  // Stable: at equal times chaos faults come first, then rack losses in order.
  std::stable_sort(out.begin(), out.end(), [](const sim_fault& a, const sim_fault& b) { return a.at_s < b.at_s; });
  for (std::size_t i = 0; i < out.size(); ++i) out[i].id = i + 1;
  return out;
}

}  // namespace exa::chaos
