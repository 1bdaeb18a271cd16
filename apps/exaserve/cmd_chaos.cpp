// exaserve chaos PLAN: runs a fault plan against the embedded cluster while a
// workload runs through the real HTTP front door, checks the invariants and
// prints the report. Exit 0 only when every invariant held.

#include <spdlog/spdlog.h>

#include <cstdio>
#include <fstream>

#include "args.hpp"
#include "chaos/driver.hpp"
#include "cli_util.hpp"
#include "commands.hpp"

namespace exa::app {
namespace {

const std::vector<flag_spec> flags = {
    {"seed", true, "seed (default: the plan's)"},
    {"report-json", true, "write the JSON report here"},
    {"event-log", true, "write the run's event log (JSON lines) here"},
    {"model", true, "GGUF model every deployment serves (default: the generated tiny model)"},
    {"virtual", false, "run in virtual time on the deterministic scheduler (fast; same seed, same log)"},
    {"help", false, "show this help"},
};

}  // namespace

int cmd_chaos(int argc, char** argv) {
  auto a = args::parse(argc, argv, 2, flags);
  if (!a) return fail("chaos", a.error());
  if (a->has("help") || a->positional().size() != 1) {
    std::printf("usage: exaserve chaos PLAN [--seed N] [--report-json FILE] [--event-log FILE] [--virtual]\n%s"
                "Plans: chaos/plans/*.json\n",
                describe_flags(flags).c_str());
    return a->has("help") ? 0 : 2;
  }
  auto plan = chaos::load_plan(a->positional().front());
  if (!plan) return fail("chaos", plan.error());
  chaos::run_config rc;
  rc.plan = std::move(*plan);
  auto seed = a->get_int("seed", 0, 0, INT64_MAX);
  if (!seed) return fail("chaos", seed.error());
  if (a->has("seed")) rc.seed = static_cast<std::uint64_t>(*seed);
  rc.real_time = !a->has("virtual");
  if (auto m = a->get("model")) {
    rc.model_file = *m;
  } else {
    auto def = default_model_path();
    if (!def) return fail("chaos", def.error());
    rc.model_file = *def;
  }
  spdlog::info("event=chaos_start plan={} seed={} mode={} duration_s={} faults={}", rc.plan.name,
               rc.seed.value_or(rc.plan.seed), rc.real_time ? "real_time" : "virtual", rc.plan.workload.duration_s,
               rc.plan.faults.size());
  auto out = chaos::run_plan(rc);
  if (!out) return fail("chaos", out.error());
  std::printf("%s", chaos::to_table(out->report).c_str());
  if (auto path = a->get("report-json")) {
    std::ofstream f(*path);
    f << chaos::to_json(out->report) << "\n";
    if (!f) return fail("chaos", {errc::io_error, "cannot write " + *path});
  }
  if (auto path = a->get("event-log")) {
    std::ofstream f(*path);
    for (const auto& e : out->log) f << chaos::to_json_line(e) << "\n";
    if (!f) return fail("chaos", {errc::io_error, "cannot write " + *path});
  }
  return out->report.ok() ? 0 : 1;
}

}  // namespace exa::app
