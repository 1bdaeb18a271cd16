// Simulation scenarios, workloads and reports: scenario parsing with
// field-named errors (and the two scenario files in the tree), the Azure trace
// reader and the synthetic arrival processes, and the run summary with its
// JSON, text and HTML renderings.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "chaos/sim_report.hpp"
#include "chaos/sim_scenario.hpp"
#include "chaos/sim_workload.hpp"
#include "cluster/routing.hpp"
#include "common/splitmix64.hpp"

namespace {

using json = nlohmann::json;
using namespace exa::chaos;

/// The repository root: the plans directory is <root>/chaos/plans.
std::filesystem::path repo_root() { return std::filesystem::path(EXA_CHAOS_PLANS_DIR).parent_path().parent_path(); }

std::string scenario_path(const std::string& name) { return (repo_root() / "chaos/scenarios" / name).string(); }
std::string trace_path() { return (repo_root() / "chaos/traces/azure_llm_2023_conv.csv").string(); }

// The real trace: 19,366 rows from 18:15:46.6805900 to 19:14:08.4025270.
constexpr std::size_t trace_rows = 19366;
constexpr double trace_span_s = 3501.721937;

std::string temp_file(const std::string& name, const std::string& text) {
  std::filesystem::create_directories(EXA_TEST_TMPDIR);
  const std::string path = std::string(EXA_TEST_TMPDIR) + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

/// A small valid scenario with a synthetic workload.
json base_scenario() {
  return json::parse(R"({
    "name": "unit", "seed": 3,
    "topology": { "nodes": 4, "gpus_per_node": 8, "racks": 2, "gpu": "h100-80gb" },
    "deployments": [ { "name": "m", "model": "llama-2-13b", "precision": "int4", "replicas": 8,
                       "kv_tokens": 32768, "context_length": 16384, "max_replicas_per_node": 12,
                       "routing": "power_of_two" } ],
    "workload": { "kind": "bursty", "rate_per_s": 10, "prompt_tokens": 500, "max_tokens": 100,
                  "burst_factor": 4, "burst_period_s": 30 },
    "duration_s": 300,
    "timing": { "heartbeat_interval_ms": 1000, "suspect_after_missed": 3, "observation_window_ms": 10000,
                "migration_parallelism": 2, "request_deadline_ms": 60000 },
    "slo": { "ttft_ms": 1500, "tpot_ms": 80 },
    "faults": [ { "at_s": 10, "kind": "kill_node", "node": 1 },
                { "kind": "kill_replica", "rate_per_min": 2, "from_s": 0, "to_s": 300 },
                { "at_s": 20, "kind": "kill_rack", "rack": 1 } ],
    "compare_policies": [ "round_robin", "predictive" ],
    "sample_interval_s": 5
  })");
}

/// Parsing must fail with invalid_argument and a message starting "<field>:".
void require_field_error(const json& j, const std::string& field, const std::string& words = "") {
  const auto s = parse_scenario(j.dump());
  INFO("expected an error naming " << field);
  REQUIRE_FALSE(s.has_value());
  INFO("got: " << s.error().message);
  CHECK(s.error().code == exa::errc::invalid_argument);
  CHECK(s.error().message.rfind(field + ": ", 0) == 0);
  if (!words.empty()) CHECK(s.error().message.find(words) != std::string::npos);
}

/// base_scenario() with `pointer` (a JSON pointer) set to `value`.
json with(const std::string& pointer, json value) {
  json j = base_scenario();
  j[json::json_pointer(pointer)] = std::move(value);
  return j;
}

json without(const std::string& key) {
  json j = base_scenario();
  j.erase(key);
  return j;
}

}  // namespace

// ---------------------------------------------------------------------------
// Scenarios.

TEST_CASE("the reference scenario parses as the issue describes it", "[sim]") {
  const auto s = load_scenario(scenario_path("reference.json"));
  REQUIRE(s.has_value());
  CHECK(s->name == "reference");
  CHECK(s->topology.nodes == 256);
  CHECK(s->topology.gpus_per_node == 8);
  CHECK(s->topology.racks == 16);
  CHECK(s->topology.gpu == "h100-80gb");
  REQUIRE(s->deployments.size() == 1);
  CHECK(s->deployments[0].model == "llama-2-13b");
  CHECK(s->deployments[0].precision == "int4");
  CHECK(s->deployments[0].replicas == 3072);
  // 12 per node by spreading (3072 / 256); the limit of 16 leaves the room a
  // lost node's or rack's replicas move into.
  CHECK(s->deployments[0].max_replicas_per_node == 16u);
  CHECK(s->deployments[0].context_length == 16384u);
  CHECK(s->workload.kind == sim_workload_kind::trace);
  CHECK(s->workload.rate_multiplier == 20);
  CHECK(s->duration_s == 3600);
  CHECK(s->timing.heartbeat_interval_ms == 2000);
  CHECK(s->timing.suspect_after_missed == 5);
  CHECK(s->timing.observation_window_ms == 30000);
  CHECK(s->slo.ttft_ms == 2000);
  CHECK(s->slo.tpot_ms == 100);
  CHECK(s->compare_policies.size() == 4);
  CHECK(s->sample_interval_s == 30);
  REQUIRE(s->rack_losses.size() == 1);
  CHECK(s->rack_losses[0].first == 2700);
  const auto kills = std::count_if(s->faults.begin(), s->faults.end(),
                                   [](const fault_spec& f) { return f.kind == fault_kind::kill_node; });
  CHECK(kills >= 10);
  // Jitter past the suspicion threshold but inside the observation window:
  // suspicion without a confirmed death, so no migration.
  for (const fault_spec& f : s->faults) {
    if (f.kind != fault_kind::heartbeat_jitter) continue;
    CHECK(f.delay_ms > s->timing.heartbeat_interval_ms * s->timing.suspect_after_missed);
    CHECK(f.delay_ms < s->timing.observation_window_ms);
  }
}

TEST_CASE("the CI scenario is the reference scaled down", "[sim]") {
  const auto ci = load_scenario(scenario_path("ci.json"));
  const auto ref = load_scenario(scenario_path("reference.json"));
  REQUIRE(ci.has_value());
  REQUIRE(ref.has_value());
  CHECK(ci->topology.nodes == 16);
  CHECK(ci->topology.racks == 4);  // a lost rack (4 nodes) leaves room for all 192 at 16 per node
  CHECK(ci->deployments[0].replicas == 192);
  CHECK(ci->duration_s == 600);
  CHECK(ci->compare_policies == std::vector<std::string>{"round_robin", "least_outstanding"});
  REQUIRE(ci->rack_losses.size() == 1);
  CHECK(ci->rack_losses[0] == std::pair<double, std::uint32_t>{400, 1});
  // Equal load per replica: multiplier / replicas is the same in both.
  CHECK(ci->workload.rate_multiplier / ci->deployments[0].replicas ==
        Approx(ref->workload.rate_multiplier / ref->deployments[0].replicas));
  // The workload loads from the trace the scenario names.
  scenario s = *ci;
  s.workload.trace = (repo_root() / s.workload.trace).string();
  const auto w = make_workload(s, s.seed);
  REQUIRE(w.has_value());
  const double expected = 1.25 * 600 / trace_span_s * trace_rows;
  CHECK(static_cast<double>(w->size()) == Approx(expected).epsilon(0.15));
}

TEST_CASE("a small scenario parses with every field read", "[sim]") {
  const auto s = parse_scenario(base_scenario().dump());
  REQUIRE(s.has_value());
  CHECK(s->seed == 3);
  CHECK(s->workload.kind == sim_workload_kind::bursty);
  CHECK(s->workload.burst_factor == 4);
  CHECK(s->workload.burst_period_s == 30);
  CHECK(s->timing.migration_parallelism == 2);
  CHECK(s->timing.request_deadline_ms == 60000);
  CHECK(s->slo.tpot_ms == 80);
  CHECK(s->deployments[0].routing == "power_of_two");
  REQUIRE(s->faults.size() == 2);
  CHECK(s->faults[1].rate_per_min == 2.0);
  CHECK(s->rack_losses == std::vector<std::pair<double, std::uint32_t>>{{20, 1}});
  // ggml precision names are accepted and stored by their canonical name.
  const auto q = parse_scenario(with("/deployments/0/precision", "q4_0").dump());
  REQUIRE(q.has_value());
  CHECK(q->deployments[0].precision == "int4");
}

TEST_CASE("scenario fields are validated by name", "[sim]") {
  require_field_error(with("/colour", "red"), "colour", "unknown key");
  require_field_error(without("name"), "name", "required");
  require_field_error(with("/name", "two words"), "name");
  require_field_error(without("deployments"), "deployments", "required");
  require_field_error(with("/deployments", json::array()), "deployments", "non-empty");
  require_field_error(with("/duration_s", 0), "duration_s");
  require_field_error(with("/duration_s", 86401), "duration_s");
  require_field_error(with("/sample_interval_s", 0), "sample_interval_s");
  require_field_error(with("/sample_interval_s", 301), "sample_interval_s");
  require_field_error(with("/slo/ttft_ms", 0), "slo.ttft_ms");
  require_field_error(with("/slo/tpot_ms", -5), "slo.tpot_ms");
  require_field_error(with("/slo/p99", 1), "slo.p99", "unknown key");
  require_field_error(with("/timing/heartbeat_interval_ms", 0), "timing.heartbeat_interval_ms");
  require_field_error(with("/timing/suspect_after_missed", 1000), "timing.suspect_after_missed");
  const auto bad_json = parse_scenario("{ \"name\": ");
  REQUIRE_FALSE(bad_json.has_value());
  CHECK(bad_json.error().message.rfind("scenario: not valid JSON", 0) == 0);
}

TEST_CASE("topology fields are validated by name", "[sim]") {
  require_field_error(with("/topology/gpu", "v100"), "topology.gpu", "h100-80gb");
  require_field_error(with("/topology/gpu", "cpu"), "topology.gpu");
  require_field_error(with("/topology/nodes", 0), "topology.nodes");
  require_field_error(with("/topology/racks", 5), "topology.racks", "empty");
  require_field_error(with("/topology/gpus_per_node", 65), "topology.gpus_per_node");
  require_field_error(with("/topology/switches", 2), "topology.switches", "unknown key");
}

TEST_CASE("a deployment's prefix slack parses, with the router's defaults when absent", "[sim][prefix]") {
  const auto plain = parse_scenario(base_scenario().dump());
  REQUIRE(plain);
  CHECK(plain->deployments[0].prefix_slack_tokens == exa::cluster::prefix_aware_config{}.load_slack_tokens);
  CHECK(plain->deployments[0].prefix_slack_ratio == exa::cluster::prefix_aware_config{}.load_slack_ratio);
  CHECK(plain->deployments[0].prefix_slack_s == exa::cluster::prefix_aware_config{}.load_slack_s);
  json j = with("/deployments/0/prefix_slack_tokens", 0);
  j["deployments"][0]["prefix_slack_ratio"] = 1.5;
  j["deployments"][0]["prefix_slack_s"] = 0;
  const auto s = parse_scenario(j.dump());
  REQUIRE(s);
  CHECK(s->deployments[0].prefix_slack_tokens == 0);
  CHECK(s->deployments[0].prefix_slack_ratio == 1.5);
  CHECK(s->deployments[0].prefix_slack_s == 0);
}

TEST_CASE("deployment fields are validated by name", "[sim]") {
  require_field_error(with("/deployments/0/model", "gpt-4"), "deployments[0].model", "llama-2-13b");
  require_field_error(with("/deployments/0/precision", "fp8"), "deployments[0].precision");
  require_field_error(with("/deployments/0/routing", "random"), "deployments[0].routing", "least_outstanding");
  require_field_error(with("/deployments/0/replicas", 0), "deployments[0].replicas");
  require_field_error(with("/deployments/0/context_length", 40000), "deployments[0].context_length", "kv_tokens");
  require_field_error(with("/deployments/0/prefix_slack_ratio", -0.5), "deployments[0].prefix_slack_ratio", "[0, 100]");
  require_field_error(with("/deployments/0/prefix_slack_ratio", "lots"), "deployments[0].prefix_slack_ratio",
                      "a number");
  require_field_error(with("/deployments/0/prefix_slack_s", 3601), "deployments[0].prefix_slack_s", "[0, 3600]");
  require_field_error(with("/deployments/0/prefix_slack_s", "0.2s"), "deployments[0].prefix_slack_s", "a number");
  require_field_error(with("/deployments/0/prefix_slack_tokens", -1), "deployments[0].prefix_slack_tokens");
  require_field_error(with("/deployments/0/prefix_slack_tokens", 1.5), "deployments[0].prefix_slack_tokens",
                      "an integer");
  require_field_error(with("/deployments/0/prefix_slack_tokens", 5000000000ull), "deployments[0].prefix_slack_tokens",
                      "4294967296");
  json two = base_scenario();
  two["deployments"].push_back(two["deployments"][0]);
  require_field_error(two, "deployments[1].name", "two deployments");
}

TEST_CASE("warm pool and autoscale fields parse and are validated by name", "[sim]") {
  json j = base_scenario();
  j["deployments"][0]["warm_pool_percent"] = 20;
  j["deployments"][0]["autoscale"] = {{"min", 0}, {"max", 16}, {"metric", "ttft_p99_ms"}, {"target", 800},
                                      {"idle_to_zero_s", 60}};
  j["compare_fixed_fleet"] = true;
  const auto s = parse_scenario(j.dump());
  REQUIRE(s.has_value());
  const auto& d = s->deployments.front();
  CHECK(d.warm_pool_percent == 20);
  CHECK(d.autoscale_min == 0);
  CHECK(d.autoscale_max == 16);
  CHECK(d.autoscale_metric == "ttft_p99_ms");
  CHECK(d.autoscale_target == Approx(800));
  CHECK(d.idle_to_zero_s == 60);
  CHECK(s->compare_fixed_fleet);
  CHECK(parse_scenario(base_scenario().dump())->deployments.front().warm_pool_percent == 10);
  require_field_error(with("/deployments/0/warm_pool_percent", 60), "deployments[0].warm_pool_percent");
  require_field_error(with("/deployments/0/autoscale", json{{"min", 4}}), "deployments[0].autoscale.max", "required");
  require_field_error(with("/deployments/0/autoscale", json{{"min", 9}, {"max", 4}}), "deployments[0].autoscale.min",
                      "above max");
  require_field_error(with("/deployments/0/autoscale", json{{"max", 4}, {"metric", "qps"}}),
                      "deployments[0].autoscale.metric", "queue_depth");
  require_field_error(with("/deployments/0/autoscale", json{{"max", 4}, {"min", 1}, {"idle_to_zero_s", 5}}),
                      "deployments[0].autoscale.idle_to_zero_s", "min 0");
  require_field_error(with("/deployments/0/autoscale", json{{"max", 4}, {"speed", 1}}), "deployments[0].autoscale.speed",
                      "unknown key");
  require_field_error(with("/compare_fixed_fleet", "yes"), "compare_fixed_fleet", "true or false");
}

TEST_CASE("storage and cold-start fields parse and are validated by name", "[sim][cold_start]") {
  json j = base_scenario();
  j["storage"] = {{"store_gb_per_s", 40}, {"node_network_gb_per_s", 12.5}, {"node_disk_gb_per_s", 5},
                  {"warm_nodes", 3}};
  j["timing"]["loads_max"] = 8;
  j["timing"]["loads_per_node_max"] = 2;
  j["compare_cold_start"] = true;
  const auto s = parse_scenario(j.dump());
  REQUIRE(s.has_value());
  CHECK(s->storage.modelled);
  CHECK(s->storage.store_gb_per_s == Approx(40));
  CHECK(s->storage.node_network_gb_per_s == Approx(12.5));
  CHECK(s->storage.node_disk_gb_per_s == Approx(5));
  CHECK(s->storage.warm_nodes == 3);
  CHECK(s->compare_cold_start);
  // Spread evenly over the nodes.
  CHECK(warm_node_ids(s->storage, 4) == std::vector<std::uint32_t>{0, 1, 2});
  CHECK(warm_node_ids({true, 1, 0, 1, 64}, 256).size() == 64);
  CHECK(warm_node_ids({true, 1, 0, 1, 64}, 256)[1] == 4);
  CHECK_FALSE(parse_scenario(base_scenario().dump())->storage.modelled);
  require_field_error(with("/storage", json{{"store_gb_per_s", 0}}), "storage.store_gb_per_s");
  require_field_error(with("/storage", json{{"node_disk_gb_per_s", -1}}), "storage.node_disk_gb_per_s");
  require_field_error(with("/storage", json{{"warm_nodes", 5}}), "storage.warm_nodes");  // 4 nodes
  require_field_error(with("/storage", json{{"speed", 1}}), "storage.speed", "unknown key");
  require_field_error(with("/compare_cold_start", true), "compare_cold_start", "storage");
  json no_limits = base_scenario();
  no_limits["storage"] = json::object();
  no_limits["compare_cold_start"] = true;
  require_field_error(no_limits, "compare_cold_start", "loads_max");
  require_field_error(with("/compare_cold_start", 1), "compare_cold_start", "true or false");
}

TEST_CASE("rollouts parse with the deployment's model as defaults and are validated by name", "[sim][rollout]") {
  json j = base_scenario();
  j["rollouts"] = json::array({json{{"at_s", 200}, {"deployment", "m"}, {"precision", "fp16"}, {"steps", "10,100"},
                                    {"bake_s", 20}, {"surge", 0}, {"max_unavailable", 2}, {"min_samples", 40}},
                               json{{"at_s", 50}, {"deployment", "m"}}});
  const auto s = parse_scenario(j.dump());
  REQUIRE(s.has_value());
  REQUIRE(s->rollouts.size() == 2);
  const auto& first = s->rollouts[0];  // sorted by time
  CHECK(first.at_s == Approx(50));
  CHECK(first.model == "llama-2-13b");
  CHECK(first.precision == "int4");
  CHECK(first.context_length == std::optional<std::uint32_t>{16384});
  CHECK(first.steps.empty());
  const auto& second = s->rollouts[1];
  CHECK(second.precision == "fp16");
  CHECK(second.steps == "10,100");
  CHECK(second.bake_s == 20);
  CHECK(second.surge == 0);
  CHECK(second.max_unavailable == 2);
  CHECK(second.min_samples == 40);
  const auto one = [](json ro) {
    json x = base_scenario();
    x["rollouts"] = json::array({std::move(ro)});
    return x;
  };
  require_field_error(one(json{{"deployment", "m"}}), "rollouts[0].at_s", "required");
  require_field_error(one(json{{"at_s", 10}, {"deployment", "nope"}}), "rollouts[0].deployment", "not a deployment");
  require_field_error(one(json{{"at_s", 400}, {"deployment", "m"}}), "rollouts[0].at_s");  // past the duration
  require_field_error(one(json{{"at_s", 10}, {"deployment", "m"}, {"precision", "fp8"}}), "rollouts[0].precision");
  require_field_error(one(json{{"at_s", 10}, {"deployment", "m"}, {"model", "gpt-5"}}), "rollouts[0].model");
  require_field_error(one(json{{"at_s", 10}, {"deployment", "m"}, {"steps", "50,10"}}), "rollouts[0].steps");
  require_field_error(one(json{{"at_s", 10}, {"deployment", "m"}, {"surge", 0}, {"max_unavailable", 0}}),
                      "rollouts[0].surge", "both be 0");
  require_field_error(one(json{{"at_s", 10}, {"deployment", "m"}, {"colour", "red"}}), "rollouts[0].colour",
                      "unknown key");
  require_field_error(with("/rollouts", 3), "rollouts", "array");
}

TEST_CASE("topology.layer_yield names whose engine's step stop to model, none by default", "[sim][fairness]") {
  using exa::engine::sim_step_stop;
  CHECK(parse_scenario(base_scenario().dump())->topology.layer_yield == sim_step_stop::none);
  CHECK(parse_scenario(with("/topology/layer_yield", false).dump())->topology.layer_yield == sim_step_stop::none);
  CHECK(parse_scenario(with("/topology/layer_yield", true).dump())->topology.layer_yield == sim_step_stop::every_step);
  CHECK(parse_scenario(with("/topology/layer_yield", "cpu").dump())->topology.layer_yield == sim_step_stop::every_step);
  CHECK(parse_scenario(with("/topology/layer_yield", "cuda").dump())->topology.layer_yield ==
        sim_step_stop::long_steps);
  require_field_error(with("/topology/layer_yield", 1), "topology.layer_yield", "\"cpu\" or \"cuda\"");
  require_field_error(with("/topology/layer_yield", "tpu"), "topology.layer_yield", "\"cpu\" or \"cuda\"");
}

TEST_CASE("timing.consolidate parses as a boolean, off by default", "[sim][consolidation]") {
  CHECK_FALSE(parse_scenario(base_scenario().dump())->timing.consolidate);
  CHECK(parse_scenario(with("/timing/consolidate", true).dump())->timing.consolidate);
  require_field_error(with("/timing/consolidate", "yes"), "timing.consolidate", "true or false");
}

TEST_CASE("the cold-start scenario is the reference cluster's deploy with its store modelled", "[sim][cold_start]") {
  const auto s = load_scenario(scenario_path("cold_start.json"));
  REQUIRE(s.has_value());
  CHECK(s->topology.nodes == 256);
  CHECK(s->topology.gpus_per_node == 8);
  CHECK(s->deployments.front().replicas == 3072);
  CHECK(s->deployments.front().warm_pool_percent == 0);
  CHECK(s->storage.modelled);
  CHECK(s->storage.warm_nodes == 64);
  CHECK(s->compare_cold_start);
  CHECK(s->timing.loads_max == 32);
  CHECK(s->timing.loads_per_node_max == 4);
  CHECK(load_scenario(scenario_path("cold_start_ci.json")).has_value());
  const auto big = load_scenario(scenario_path("cold_start_70b.json"));
  REQUIRE(big.has_value());
  CHECK(big->deployments.front().model == "llama-2-70b");
  CHECK(big->deployments.front().replicas == 1024);
}

TEST_CASE("a diurnal curve thins arrivals to its trough at night and keeps them at noon", "[sim]") {
  sim_workload_spec w;
  w.diurnal_period_s = 1000;
  w.diurnal_trough = 0.2;
  CHECK(diurnal_factor(w, 0) == Approx(0.2));
  CHECK(diurnal_factor(w, 500) == Approx(1.0));
  CHECK(diurnal_factor(w, 250) == Approx(0.6));
  CHECK(diurnal_factor(w, 1500) == Approx(1.0));  // the next day
  CHECK(diurnal_factor(sim_workload_spec{}, 123) == 1);
  auto j = with("/workload", json{{"kind", "poisson"}, {"rate_per_s", 50}, {"prompt_tokens", 100}, {"max_tokens", 10},
                                  {"diurnal", {{"period_s", 1000}, {"trough", 0.2}}}});
  j["duration_s"] = 1000;
  j["faults"] = json::array();
  const auto s = parse_scenario(j.dump());
  REQUIRE(s.has_value());
  const auto a = make_workload(*s, 7);
  REQUIRE(a.has_value());
  std::size_t night = 0, noon = 0;
  for (const auto& r : *a) {
    night += r.at_s < 100 || r.at_s >= 900;
    noon += r.at_s >= 450 && r.at_s < 550;
  }
  // Expected: noon ~ 50/s × 100 s × ~0.99; night (200 s) ~ 50 × 200 × ~0.24.
  CHECK(noon == Approx(4950).epsilon(0.06));
  CHECK(night == Approx(2390).epsilon(0.1));
  CHECK(a->size() == Approx(50 * 1000 * 0.6).epsilon(0.03));  // the curve's mean is (1 + trough) / 2
  const auto b = make_workload(*s, 7);
  REQUIRE(b.has_value());
  CHECK(b->size() == a->size());  // seeded
  require_field_error(with("/workload/diurnal", json{{"trough", 0.5}}), "workload.diurnal.period_s", "required");
  require_field_error(with("/workload/diurnal", json{{"period_s", 100}, {"trough", 1.5}}), "workload.diurnal.trough");
}

TEST_CASE("deployments must fit the nodes by the ledger's formulas", "[sim]") {
  // Llama-2-13B int4 with 32768 KV tokens is about 32 GiB: two per 80 GB GPU,
  // sixteen per node of eight.
  CHECK(parse_scenario(with("/deployments/0/max_replicas_per_node", 16).dump()).has_value());
  require_field_error(with("/deployments/0/max_replicas_per_node", 17), "deployments[0].max_replicas_per_node",
                      "at most 16");
  // 4 nodes x 12 per node.
  CHECK(parse_scenario(with("/deployments/0/replicas", 48).dump()).has_value());
  require_field_error(with("/deployments/0/replicas", 49), "deployments[0].replicas", "do not fit");
  // 2^30 KV tokens (800 TiB of cache) fit no node at any tensor-parallel degree.
  json huge = with("/deployments/0/kv_tokens", 1u << 30);
  require_field_error(huge, "deployments[0].kv_tokens", "does not fit");
}

TEST_CASE("scenario workload fields are validated by name", "[sim]") {
  require_field_error(with("/workload", json{{"kind", "uniform"}}), "workload.kind", "poisson");
  require_field_error(with("/workload", json::object()), "workload.kind", "required");
  require_field_error(with("/workload", json{{"trace", "x.csv"}, {"rate_multiplier", 0}}),
                      "workload.rate_multiplier");
  require_field_error(with("/workload", json{{"trace", "x.csv"}, {"rate_per_s", 5}}), "workload.rate_per_s",
                      "unknown key");
  require_field_error(with("/workload", json{{"kind", "trace"}}), "workload.trace", "required");
  require_field_error(with("/workload", json{{"kind", "poisson"}, {"burst_factor", 2}}), "workload.burst_factor",
                      "unknown key");
  require_field_error(with("/workload/rate_per_s", 0), "workload.rate_per_s");
  require_field_error(with("/workload/rate_per_s", 90000), "workload.rate_per_s", "requests");
  require_field_error(with("/workload/burst_factor", 0.5), "workload.burst_factor");
  require_field_error(with("/workload/prompt_tokens", 0), "workload.prompt_tokens");
}

TEST_CASE("faults are validated against the topology", "[sim]") {
  const auto fault = [](json f) { return with("/faults", json::array({std::move(f)})); };
  require_field_error(fault({{"at_s", 1}, {"kind", "kill_node"}, {"node", 4}}), "faults[0].node", "4-node");
  require_field_error(fault({{"at_s", 1}, {"kind", "fail_device"}, {"node", 0}, {"device", 8}}), "faults[0].device");
  require_field_error(fault({{"at_s", 301}, {"kind", "kill_node"}, {"node", 0}}), "faults[0].at_s");
  require_field_error(fault({{"at_s", 1}, {"kind", "melt_node"}}), "faults[0].kind", "unknown fault kind");
  require_field_error(fault({{"at_s", 1}, {"kind", "kill_rack"}, {"rack", 2}}), "faults[0].rack", "2-rack");
  require_field_error(fault({{"kind", "kill_rack"}, {"rack", 0}}), "faults[0].at_s", "required");
  require_field_error(fault({{"at_s", 1}, {"kind", "kill_rack"}}), "faults[0].rack", "required");
  require_field_error(fault({{"at_s", 1}, {"kind", "kill_rack"}, {"rack", 0}, {"node", 1}}), "faults[0].node",
                      "unknown key");
  require_field_error(with("/faults/0", 7), "faults[0]", "object");
}

TEST_CASE("compared policies are validated by name", "[sim]") {
  require_field_error(with("/compare_policies", json::array({"random"})), "compare_policies[0]", "round_robin");
  require_field_error(with("/compare_policies", json::array({"predictive", "predictive"})), "compare_policies[1]",
                      "twice");
  require_field_error(with("/compare_policies", "predictive"), "compare_policies", "array");
}

TEST_CASE("fault schedules expand processes with the seed and sort by time", "[sim]") {
  const auto s = parse_scenario(base_scenario().dump());
  REQUIRE(s.has_value());
  const auto a = schedule_faults(*s, 11);
  const auto b = schedule_faults(*s, 11);
  const auto c = schedule_faults(*s, 12);
  // kill_node at 10 and kill_rack at 20, plus about 10 random replica kills.
  REQUIRE(a.size() > 4);
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].id == i + 1);
    if (i > 0) CHECK(a[i - 1].at_s <= a[i].at_s);
    CHECK(a[i].chaos.has_value() != a[i].kill_rack.has_value());
    CHECK(a[i].at_s == b[i].at_s);
  }
  const auto racks = std::count_if(a.begin(), a.end(), [](const sim_fault& f) { return f.kill_rack.has_value(); });
  CHECK(racks == 1);
  bool differ = a.size() != c.size();
  for (std::size_t i = 0; !differ && i < a.size(); ++i) differ = a[i].at_s != c[i].at_s;
  CHECK(differ);
}

// ---------------------------------------------------------------------------
// Workloads.

TEST_CASE("the Azure trace loads row for row", "[sim]") {
  // 3501.8 s: past the last row, before the replay starts one mean gap later.
  const auto w = load_azure_trace(trace_path(), 1, 3501.8);
  REQUIRE(w.has_value());
  REQUIRE(w->size() == trace_rows);
  CHECK(w->front().at_s == 0);
  CHECK(w->front().prompt_tokens == 374);
  CHECK(w->front().max_tokens == 44);
  // 18:15:50.9951690 - 18:15:46.6805900: seven fractional digits kept.
  CHECK((*w)[1].at_s == Approx(4.314579).margin(1e-9));
  CHECK(w->back().at_s == Approx(trace_span_s).margin(1e-6));
  CHECK(w->back().prompt_tokens == 197);
  CHECK(w->back().max_tokens == 183);
  CHECK(std::is_sorted(w->begin(), w->end(), [](const auto& a, const auto& b) { return a.at_s < b.at_s; }));
}

TEST_CASE("the trace is compressed by the multiplier and replayed to the duration", "[sim]") {
  const auto one = load_azure_trace(trace_path(), 1, 3501.8);
  const auto fast = load_azure_trace(trace_path(), 20, 3600);
  REQUIRE(one.has_value());
  REQUIRE(fast.has_value());
  for (std::size_t i : {std::size_t{1}, std::size_t{1000}, trace_rows - 1})
    CHECK((*fast)[i].at_s == Approx((*one)[i].at_s / 20).margin(1e-9));
  // An hour at 20x: the ~175 s trace 20 times and a half.
  const double period_s = trace_span_s / 20 * trace_rows / (trace_rows - 1);
  const auto copies = static_cast<std::size_t>(3600 / period_s);
  CHECK(copies == 20);
  CHECK(fast->size() > copies * trace_rows);
  CHECK(fast->size() < (copies + 1) * trace_rows);
  // Copy k is copy 0 shifted by k periods, lengths and all.
  const sim_request& replayed = (*fast)[7 * trace_rows + 123];
  CHECK(replayed.at_s == Approx((*fast)[123].at_s + 7 * period_s).margin(1e-6));
  CHECK(replayed.prompt_tokens == (*fast)[123].prompt_tokens);
  CHECK(fast->back().at_s < 3600);
}

TEST_CASE("the trace is truncated to the duration", "[sim]") {
  const auto all = load_azure_trace(trace_path(), 1, 3501.8);
  const auto head = load_azure_trace(trace_path(), 1, 100);
  REQUIRE(all.has_value());
  REQUIRE(head.has_value());
  REQUIRE(!head->empty());
  CHECK(head->back().at_s < 100);
  CHECK((*all)[head->size()].at_s >= 100);
}

TEST_CASE("trace timestamps cross days, months and leap days", "[sim]") {
  const std::string path = temp_file("sim_trace_dates.csv",
                                     "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                     "2024-02-28 23:59:59.5,10,0\n"
                                     "2024-02-29 00:00:00.25,20,2\n"
                                     "2024-03-01 00:00:00,30,3\n\n");
  const auto w = load_azure_trace(path, 1, 86401);
  REQUIRE(w.has_value());
  REQUIRE(w->size() >= 3);
  CHECK((*w)[1].at_s == Approx(0.75).margin(1e-12));
  CHECK((*w)[2].at_s == Approx(86400.5).margin(1e-9));
  CHECK((*w)[0].max_tokens == 1);  // zero generated tokens kept as one
}

TEST_CASE("corrupt trace lines are named by line and column", "[sim]") {
  const std::string header = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n";
  const std::string good = "2023-11-16 18:15:46.6805900,374,44\r\n";
  const auto error_of = [&](const std::string& name, const std::string& text) {
    const auto w = load_azure_trace(temp_file(name, text), 1, 60);
    REQUIRE_FALSE(w.has_value());
    return w.error();
  };
  auto e = error_of("sim_bad_time.csv", header + good + "2023-11-16 25:00:00.0,1,1\r\n");
  CHECK(e.code == exa::errc::corrupt_data);
  CHECK(e.message.find("sim_bad_time.csv:3: column 1 (TIMESTAMP)") != std::string::npos);
  e = error_of("sim_bad_tokens.csv", header + good + good + "2023-11-16 18:15:47.0,12,abc\r\n");
  CHECK(e.message.find(":4: column 3 (GeneratedTokens)") != std::string::npos);
  e = error_of("sim_bad_columns.csv", header + "2023-11-16 18:15:47.0,12\r\n");
  CHECK(e.message.find(":2: expected 3 columns") != std::string::npos);
  e = error_of("sim_bad_order.csv", header + good + "2023-11-16 18:15:40.0,1,1\r\n");
  CHECK(e.message.find(":3: column 1 (TIMESTAMP): earlier") != std::string::npos);
  e = error_of("sim_bad_header.csv", "time,prompt,output\n" + good);
  CHECK(e.message.find(":1: the header must be") != std::string::npos);
  e = error_of("sim_no_rows.csv", header);
  CHECK(e.message.find("no rows") != std::string::npos);
  e = error_of("sim_bad_fraction.csv", header + "2023-11-16 18:15:46.1234567890,1,1\n");
  CHECK(e.message.find(":2: column 1") != std::string::npos);
  const auto missing = load_azure_trace(std::string(EXA_TEST_TMPDIR) + "/no-such-trace.csv", 1, 60);
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.error().code == exa::errc::io_error);
}

TEST_CASE("trace sizes and replays are bounded", "[sim]") {
  // A sparse file one byte over the limit: refused before it is read.
  const std::string big = temp_file("sim_big.csv", "");
  std::filesystem::resize_file(big, max_trace_bytes + 1);
  const auto w = load_azure_trace(big, 1, 60);
  std::filesystem::remove(big);
  REQUIRE_FALSE(w.has_value());
  CHECK(w.error().code == exa::errc::invalid_argument);
  CHECK(w.error().message.find("more than the limit") != std::string::npos);
  // Two rows a second apart, replayed for a day at 1000x: 86 million requests.
  const std::string tiny = temp_file("sim_tiny.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                                     "2023-11-16 18:00:00,1,1\n2023-11-16 18:00:01,1,1\n");
  const auto replay = load_azure_trace(tiny, 1000, 86400);
  REQUIRE_FALSE(replay.has_value());
  CHECK(replay.error().message.find("more than 10000000 requests") != std::string::npos);
  CHECK_FALSE(load_azure_trace(tiny, 0, 60).has_value());
  CHECK_FALSE(load_azure_trace(tiny, 1, -1).has_value());
}

TEST_CASE("Poisson arrivals keep their rate and jittered lengths", "[sim]") {
  sim_workload_spec spec;
  spec.kind = sim_workload_kind::poisson;
  spec.rate_per_s = 50;
  spec.prompt_tokens = 1000;
  spec.max_tokens = 200;
  const double duration_s = 1000, mean = spec.rate_per_s * duration_s;
  const auto w = synthetic_workload(spec, duration_s, 5);
  CHECK(std::abs(static_cast<double>(w.size()) - mean) <= 4 * std::sqrt(mean));
  double prompt_sum = 0;
  for (const sim_request& r : w) {
    CHECK(r.prompt_tokens >= 750);
    CHECK(r.prompt_tokens <= 1250);
    CHECK(r.max_tokens >= 150);
    CHECK(r.max_tokens <= 250);
    CHECK(r.at_s < duration_s);
    prompt_sum += r.prompt_tokens;
  }
  // Uniform on ±25%: standard deviation 250/sqrt(3) per request.
  const double sd_mean = 250 / std::sqrt(3.0) / std::sqrt(static_cast<double>(w.size()));
  CHECK(std::abs(prompt_sum / static_cast<double>(w.size()) - 1000) <= 4 * sd_mean);
  CHECK(std::is_sorted(w.begin(), w.end(), [](const auto& a, const auto& b) { return a.at_s < b.at_s; }));
  const auto again = synthetic_workload(spec, duration_s, 5);
  const auto other = synthetic_workload(spec, duration_s, 6);
  REQUIRE(again.size() == w.size());
  CHECK(again.back().at_s == w.back().at_s);
  CHECK((other.size() != w.size() || other.back().at_s != w.back().at_s));
}

TEST_CASE("bursty arrivals keep the mean rate and burst at the factor", "[sim]") {
  sim_workload_spec spec;
  spec.kind = sim_workload_kind::bursty;
  spec.rate_per_s = 50;
  spec.burst_factor = 5;
  spec.burst_period_s = 60;
  const double duration_s = 1200;  // 20 whole periods
  const auto w = synthetic_workload(spec, duration_s, 9);
  const double mean = spec.rate_per_s * duration_s;
  CHECK(std::abs(static_cast<double>(w.size()) - mean) <= 4 * std::sqrt(mean));
  // The first sixth of each period at 250/s, the rest at 10/s.
  double burst = 0;
  for (const sim_request& r : w)
    if (std::fmod(r.at_s, 60) < 10) ++burst;
  const double burst_mean = 250.0 * 10 * 20, trough_mean = 10.0 * 50 * 20;
  CHECK(std::abs(burst - burst_mean) <= 4 * std::sqrt(burst_mean));
  const double trough = static_cast<double>(w.size()) - burst;
  CHECK(std::abs(trough - trough_mean) <= 4 * std::sqrt(trough_mean));
}

// ---------------------------------------------------------------------------
// Reports.

namespace {

sim_request_record record(double arrival, double ttft, double finish, std::uint32_t generated, bool ok = true) {
  sim_request_record r;
  r.arrival_s = arrival;
  r.ttft_s = ttft;
  r.finish_s = finish;
  r.generated_tokens = generated;
  r.max_tokens = generated;
  r.prompt_tokens = 100;
  r.completed = ok;
  if (!ok) r.error = "unavailable";
  return r;
}

sim_sample sample(double t, std::uint32_t queued, double util) {
  sim_sample s;
  s.t_s = t;
  s.arrivals = 10;
  s.in_flight = 4 + queued;
  s.queued = queued;
  s.replicas_by_state = {{"ready", 10}, {"loading", queued}};
  s.device_utilization = util;
  s.ttft_p50_s = t > 5 ? 0.4 : -1;
  s.ttft_p99_s = t > 5 ? 1.2 : -1;
  return s;
}

/// Five requests: two meet the SLO (2000 ms / 100 ms), one misses TTFT, one
/// misses TPOT, one fails.
sim_run hand_made_run(const std::string& policy) {
  sim_run run;
  run.policy = policy;
  run.requests = {
      record(0, 0.5, 2.5, 21),   // tpot (2.5 - 0.5) / 20 = 100 ms: met (<=)
      record(1, 3.0, 5.0, 11),   // ttft 3000 ms: missed
      record(2, 0.2, 2.2, 1),    // one token: no tpot, met
      record(3, 1.0, 5.5, 11),   // tpot 1.5 / 10 = 150 ms: missed
      record(4, -1, 10, 0, false),
  };
  run.samples = {sample(5, 2, 0.5), sample(10, 4, 0.7), sample(15, 0, 0.3)};
  run.faults = {{.id = 1, .kind = "kill_node", .at_s = 6, .detect_s = 10.5, .recover_s = 41.3},
                {.id = 2, .kind = "kill_rack", .at_s = 9, .detect_s = -1, .recover_s = -1}};
  run.placement_ms = 12.5;
  run.wall_s = 1.25;
  return run;
}

sim_report hand_made_report() {
  sim_report r;
  r.scenario = "unit";
  r.seed = 42;
  r.duration_s = 10;
  r.slo_ttft_ms = 2000;
  r.slo_tpot_ms = 100;
  r.runs = {hand_made_run("round_robin"), hand_made_run("least_outstanding")};
  // The TTFT miss meets the SLO under this policy: ttft 1000 ms, tpot 100 ms.
  r.runs[1].requests[1].ttft_s = 1.0;
  r.runs[1].requests[1].finish_s = 3.0;
  return r;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("summaries take exact percentiles, SLO attainment and goodput", "[sim]") {
  const sim_summary s = summarize(hand_made_run("x"), 2000, 100, 10);
  CHECK(s.requests == 5);
  CHECK(s.completed == 4);
  CHECK(s.errored == 1);
  // TTFT of the completed: 200, 500, 1000, 3000 ms (nearest rank).
  CHECK(s.ttft_p50_ms == Approx(500));
  CHECK(s.ttft_p90_ms == Approx(3000));
  CHECK(s.ttft_p99_ms == Approx(3000));
  // TPOT: 100, 100, 150 ms.
  CHECK(s.tpot_p50_ms == Approx(100));
  CHECK(s.tpot_p99_ms == Approx(150));
  // End to end: 0.2, 2.5, 2.5, 4 s.
  CHECK(s.e2e_p50_s == Approx(2.5));
  CHECK(s.e2e_p99_s == Approx(4));
  CHECK(s.slo_attainment == Approx(0.4));
  CHECK(s.goodput_tokens_per_s == Approx(2.2));      // (21 + 1) / 10
  CHECK(s.throughput_tokens_per_s == Approx(4.4));   // 44 / 10
  CHECK(s.mean_device_utilization == Approx(0.5));
  CHECK(s.mean_queued == Approx(2));
  CHECK(s.max_queued == Approx(4));
  // Replicas holding devices: 12, 14 and 10 over 5 s each = 180 replica-seconds.
  CHECK(s.replica_hours == Approx(180.0 / 3600));
  CHECK(s.peak_replicas == Approx(14));
}

TEST_CASE("nearest-rank percentiles pick a sample, not an interpolation", "[sim]") {
  sim_run run;
  for (int i = 1; i <= 100; ++i) run.requests.push_back(record(0, i / 1000.0, 1, 1));
  const sim_summary s = summarize(run, 2000, 100, 10);
  CHECK(s.ttft_p50_ms == Approx(50));
  CHECK(s.ttft_p90_ms == Approx(90));
  CHECK(s.ttft_p99_ms == Approx(99));
  const sim_summary empty = summarize(sim_run{}, 2000, 100, 10);
  CHECK(empty.ttft_p50_ms == -1);
  CHECK(empty.slo_attainment == 0);
}

TEST_CASE("the JSON report has the documented keys and is byte-identical", "[sim]") {
  const std::string a = to_json(hand_made_report());
  const std::string b = to_json(hand_made_report());
  CHECK(a == b);
  sim_report changed = hand_made_report();
  changed.runs[0].requests[0].ttft_s = 0.6;
  CHECK(to_json(changed) != a);
  const json j = json::parse(a);
  for (const char* key : {"scenario", "seed", "duration_s", "lost", "completed", "placement_ms", "wall_s",
                          "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "policies", "faults"})
    CHECK(j.contains(key));
  CHECK(j["seed"] == 42);
  CHECK(j["completed"] == 4);
  CHECK(j["wall_s"] == 2.5);  // summed over runs
  REQUIRE(j["policies"].size() == 2);
  const json& p = j["policies"][1];
  CHECK(p["policy"] == "least_outstanding");
  for (const char* key : {"lost", "completed", "errored", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms",
                          "slo_attainment", "goodput_tokens_per_s"})
    CHECK(p.contains(key));
  CHECK(p["slo_attainment"] == 0.6);
  CHECK(p["errors"]["unavailable"] == 1);
  REQUIRE(j["faults"].size() == 2);
  CHECK(j["faults"][0]["detect_ms"] == 10500.0);
  CHECK(j["faults"][0]["recover_ms"] == 41300.0);
  CHECK(j["faults"][1]["detect_ms"] == -1.0);
}

TEST_CASE("the text report has a row per policy and a fault table", "[sim]") {
  const std::string t = to_text(hand_made_report());
  CHECK(t.find("round_robin") != std::string::npos);
  CHECK(t.find("least_outstanding") != std::string::npos);
  CHECK(t.find("kill_rack") != std::string::npos);
  CHECK(t.find("10.5/41.3") != std::string::npos);  // kill_node detected and recovered
  CHECK(t == to_text(hand_made_report()));
}

TEST_CASE("the prefix table and JSON give each policy's hit rate and its caches' turnover", "[sim][prefix]") {
  sim_report r = hand_made_report();
  CHECK(to_text(r).find("prefix cache") == std::string::npos);  // no policy found a prefix: no table
  // least_outstanding: 4 completed requests of 100 prompt tokens, 30 of them
  // cached; its caches dropped 12 blocks, and 56 missed tokens had been cached.
  r.runs[1].requests[0].cached_tokens = 30;
  r.runs[1].prefix_evicted_blocks = 12;
  r.runs[1].prefix_evicted_miss_tokens = 56;
  const sim_summary s = summarize(r.runs[1], r.slo_ttft_ms, r.slo_tpot_ms, r.duration_s);
  CHECK(s.prefix_evicted_blocks == 12);
  CHECK(s.prefix_evicted_miss_tokens == 56);
  const std::string t = to_text(r);
  const auto table = t.find("prefix cache");
  REQUIRE(table != std::string::npos);
  CHECK(t.find("evicted blocks", table) != std::string::npos);
  const auto row = t.find("least_outstanding", table);
  REQUIRE(row != std::string::npos);
  // policy, prompt tokens, cached, hit %, evicted blocks, evicted misses.
  std::istringstream fields(t.substr(row, t.find('\n', row) - row));
  std::string policy, hit;
  std::uint64_t prompt = 0, cached = 0, evicted = 0, misses = 0;
  fields >> policy >> prompt >> cached >> hit >> evicted >> misses;
  CHECK(prompt == 400);
  CHECK(cached == 30);
  CHECK(hit == "7.5");
  CHECK(evicted == 12);
  CHECK(misses == 56);
  const json j = json::parse(to_json(r));
  CHECK(j["policies"][1]["prefix_evicted_blocks"] == 12);
  CHECK(j["policies"][1]["prefix_evicted_miss_tokens"] == 56);
  CHECK(j["policies"][0]["prefix_evicted_blocks"] == 0);
}

TEST_CASE("the HTML report is self-contained with balanced SVG charts", "[sim]") {
  const std::string h = to_html(hand_made_report());
  CHECK(h == to_html(hand_made_report()));
  CHECK(h.rfind("<!DOCTYPE html>", 0) == 0);
  // Load, latency, and one replica chart per policy.
  CHECK(count(h, "<svg") == 4);
  CHECK(count(h, "</svg>") == 4);
  CHECK(count(h, "<figure>") == count(h, "</figure>"));
  CHECK(count(h, "<table>") == count(h, "</table>"));
  CHECK(count(h, "<html") == 1);
  CHECK(count(h, "</html>") == 1);
  CHECK(count(h, "<polyline") > 0);
  CHECK(h.find("<script") == std::string::npos);
  CHECK(h.find("src=") == std::string::npos);
  CHECK(h.find("href=") == std::string::npos);
  CHECK(h.find("least_outstanding in flight") != std::string::npos);  // legend entry
  CHECK(h.find(">loading<") != std::string::npos);                    // a replica state series
  CHECK(h.find("TTFT (ms)") != std::string::npos);                    // an axis label
  sim_report escaped = hand_made_report();
  escaped.scenario = "a<b>";
  CHECK(to_html(escaped).find("a&lt;b&gt;") != std::string::npos);
}

TEST_CASE("conversations from a trace keep every row's arrival and sizes, and grow turn by turn", "[sim][prefix]") {
  std::vector<exa::chaos::sim_request> rows;
  exa::splitmix64_stream rng(7);
  for (int i = 0; i < 2000; ++i)
    rows.push_back({.at_s = i * 0.1, .prompt_tokens = 1 + rng.below(4000), .max_tokens = 1 + rng.below(300),
                    .tenant = {}, .segments = {}});
  exa::chaos::conversation_spec spec;
  spec.apps = 4;
  spec.system_prompt_tokens = 512;
  auto a = rows;
  auto b = rows;
  exa::chaos::make_conversations(a, spec, 1);
  exa::chaos::make_conversations(b, spec, 1);
  std::size_t continued = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("row " << i);
    CHECK(a[i].at_s == rows[i].at_s);
    CHECK(a[i].prompt_tokens == rows[i].prompt_tokens);
    CHECK(a[i].max_tokens == rows[i].max_tokens);
    std::uint64_t sum = 0;
    for (const auto& s : a[i].segments) sum += s.tokens;
    CHECK(sum == a[i].prompt_tokens);
    REQUIRE(a[i].segments.size() == b[i].segments.size());  // seeded: the same
    continued += a[i].segments.size() > 2;
  }
  CHECK(continued > 200);
  // A continued turn's prompt starts with an earlier turn's prompt, whole.
  const auto vocab = 32000u;
  std::size_t checked = 0;
  for (std::size_t i = 0; i < a.size() && checked < 20; ++i) {
    if (a[i].segments.size() <= 2) continue;
    const std::vector<exa::chaos::token_segment> earlier(a[i].segments.begin(), a[i].segments.end() - 2);
    const auto ids = exa::chaos::segment_prompt_ids(a[i].segments, vocab);
    const auto prefix = exa::chaos::segment_prompt_ids(earlier, vocab);
    REQUIRE(std::equal(prefix.begin(), prefix.end(), ids.begin()));
    bool found = false;
    for (std::size_t j = 0; j < i && !found; ++j) found = exa::chaos::segment_prompt_ids(a[j].segments, vocab) == prefix;
    CHECK(found);
    ++checked;
  }
  CHECK(checked == 20);
  // Two new conversations of one application share its system prompt.
  const auto first = exa::chaos::segment_prompt_ids({{(1ull << 62) | 2, 512}}, vocab);
  CHECK(first.size() == 512);
  for (const auto t : first) CHECK((t >= 3 && t < 32000));
}
