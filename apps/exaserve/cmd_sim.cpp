// exaserve sim SCENARIO: rehearses a cluster (up to the 256-node, 3072-replica
// reference) in virtual time with the real control-plane actors and simulated
// devices. Exit status 1 when any request was lost or any stream broken.

#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "args.hpp"
#include "chaos/sim_driver.hpp"
#include "cli_util.hpp"
#include "commands.hpp"

namespace exa::app {
namespace {

const std::vector<flag_spec> flags = {
    {"seed", true, "seed (default: the scenario's)"},
    {"rate-multiplier", true, "trace arrivals compressed by this factor (default: the scenario's)"},
    {"duration-s", true, "simulated seconds of workload (default: the scenario's)"},
    {"report-json", true, "write the JSON report here"},
    {"plot", true, "write a self-contained HTML page with SVG plots here"},
    {"consolidate", false, "autoscaled deployments pack nodes, so scale-downs empty whole ones (timing.consolidate)"},
    {"help", false, "show this help"},
};

// A bare name means chaos/scenarios/NAME.json.
std::string scenario_path(const std::string& arg) {
  if (arg.find('/') != std::string::npos || arg.ends_with(".json")) return arg;
  return "chaos/scenarios/" + arg + ".json";
}

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  return static_cast<bool>(f);
}

}  // namespace

int cmd_sim(int argc, char** argv) {
  auto a = args::parse(argc, argv, 2, flags);
  if (!a) return fail("sim", a.error());
  if (a->has("help") || a->positional().size() != 1) {
    std::printf("usage: exaserve sim SCENARIO [--seed N] [--rate-multiplier X] [--duration-s S] "
                "[--report-json FILE] [--plot FILE] [--consolidate]\n%sScenarios: chaos/scenarios/*.json (reference, "
                "ci, diurnal, cold_start, rollout, prefix, prefix_many)\n",
                describe_flags(flags).c_str());
    return a->has("help") ? 0 : 2;
  }
  auto sc = chaos::load_scenario(scenario_path(a->positional().front()));
  if (!sc) return fail("sim", sc.error());
  chaos::sim_config c;
  c.scenario = std::move(*sc);
  auto seed = a->get_int("seed", 0, 0, INT64_MAX);
  auto rate = a->get_double("rate-multiplier", 1.0, 1e-6, 1e6);
  auto duration = a->get_double("duration-s", 1.0, 1e-3, 86400);
  if (!seed) return fail("sim", seed.error());
  if (!rate) return fail("sim", rate.error());
  if (!duration) return fail("sim", duration.error());
  if (a->has("seed")) c.seed = static_cast<std::uint64_t>(*seed);
  if (a->has("rate-multiplier")) c.rate_multiplier = *rate;
  if (a->has("duration-s")) c.duration_s = *duration;
  if (a->has("consolidate")) c.scenario.timing.consolidate = true;
  auto report = chaos::run_simulation(c);
  if (!report) return fail("sim", report.error());
  std::printf("%s", chaos::to_text(*report).c_str());
  if (auto p = a->get("report-json"); p && !write_file(*p, chaos::to_json(*report) + "\n"))
    return fail("sim", {errc::io_error, "cannot write " + *p});
  if (auto p = a->get("plot"); p && !write_file(*p, chaos::to_html(*report)))
    return fail("sim", {errc::io_error, "cannot write " + *p});
  std::uint64_t bad = 0;
  for (const auto& r : report->runs) bad += r.lost + r.stream_violations;
  return bad == 0 ? 0 : 1;
}

}  // namespace exa::app
