// Cost of one routing decision at the reference scale: 3072 replicas, either
// one model of 3072 or 8 models of 384, for every policy. Between decisions
// one replica's load report is applied, as the router sees in production
// (reports stream in while requests are routed); `update_only` measures that
// report alone so it can be subtracted.
//
//   build/bin/routing_bench --benchmark_min_time=0.2

#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "cluster/routing.hpp"

using namespace exa::cluster;

namespace {

constexpr std::uint32_t replicas_total = 3072;
constexpr std::size_t script_length = 4096;  // pre-drawn inputs, so the RNG is not measured

struct rig {
  replica_table table;
  std::vector<std::string> models;
  std::vector<load_report> reports;
  std::vector<replica_id> report_targets;
  std::vector<request_cost> costs;
};

rig make_rig(const std::string& policy, std::uint32_t model_count) {
  replica_table_config config;
  config.default_policy = policy;
  config.seed = 7;
  rig r{*replica_table::create(config), {}, {}, {}, {}};
  rng_state rng(12345);
  for (std::uint32_t m = 0; m < model_count; ++m) r.models.push_back("model-" + std::to_string(m));
  const std::uint32_t per_model = replicas_total / model_count;
  for (replica_id id = 1; id <= replicas_total; ++id) {
    const auto m = static_cast<std::uint32_t>((id - 1) / per_model);
    routing_candidate c;
    c.id = id;
    c.slot = {r.models[m], static_cast<std::uint32_t>((id - 1) % per_model)};
    c.epoch = 1;
    c.model = r.models[m];
    c.version = "v1";
    c.state = replica_state::serving;
    c.outstanding_requests = rng.below(32);
    c.outstanding_tokens = rng.below(20000);
    c.decode_tokens_per_s = 500 + rng.below(1000);
    c.prefill_tokens_per_s = 5000 + rng.below(10000);
    if (!r.table.upsert(std::move(c))) std::abort();
  }
  for (std::size_t i = 0; i < script_length; ++i) {
    r.report_targets.push_back(1 + rng.below(replicas_total));
    r.reports.push_back(load_report{rng.below(32), rng.below(20000), 500.0 + rng.below(1000),
                                    5000.0 + rng.below(10000), queue_capacity_unbounded});
    r.costs.push_back(request_cost{16 + rng.below(2000), 16 + rng.below(1000)});
  }
  // The first decision reindexes each pool; do it outside the timed loop.
  for (const auto& model : r.models) {
    if (!r.table.route(model, "v1", r.costs[0])) std::abort();
  }
  return r;
}

void route_with_update(benchmark::State& state, std::string policy, std::uint32_t model_count) {
  rig r = make_rig(policy, model_count);
  std::size_t i = 0;
  for (auto _ : state) {
    const std::size_t k = i++ % script_length;
    if (!r.table.update_load(r.report_targets[k], r.reports[k])) state.SkipWithError("update failed");
    auto chosen = r.table.route(r.models[k % model_count], "v1", r.costs[k]);
    benchmark::DoNotOptimize(chosen);
  }
  state.SetItemsProcessed(state.iterations());
}

void route_only(benchmark::State& state, std::string policy, std::uint32_t model_count) {
  rig r = make_rig(policy, model_count);
  std::size_t i = 0;
  for (auto _ : state) {
    const std::size_t k = i++ % script_length;
    auto chosen = r.table.route(r.models[k % model_count], "v1", r.costs[k]);
    benchmark::DoNotOptimize(chosen);
  }
  state.SetItemsProcessed(state.iterations());
}

void update_only(benchmark::State& state, std::uint32_t model_count) {
  rig r = make_rig("least_outstanding", model_count);
  std::size_t i = 0;
  for (auto _ : state) {
    const std::size_t k = i++ % script_length;
    auto done = r.table.update_load(r.report_targets[k], r.reports[k]);
    benchmark::DoNotOptimize(done);
  }
  state.SetItemsProcessed(state.iterations());
}

const bool registered = [] {
  for (const std::uint32_t models : {1u, 8u}) {
    const std::string shape = std::to_string(models) + "x" + std::to_string(replicas_total / models);
    for (const auto name : routing_policy_names()) {
      const std::string policy(name);
      benchmark::RegisterBenchmark(("route+update/" + policy + "/" + shape).c_str(), route_with_update,
                                   policy, models);
      benchmark::RegisterBenchmark(("route/" + policy + "/" + shape).c_str(), route_only, policy, models);
    }
    benchmark::RegisterBenchmark(("update_only/" + shape).c_str(), update_only, models);
  }
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
