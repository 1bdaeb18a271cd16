// exaserve chaos PLAN: runs a fault plan against the embedded cluster while a
// workload runs through the real HTTP front door, checks the invariants and
// prints the report. Exit 0 only when every invariant held.

#include <spdlog/spdlog.h>

#include <cstdio>
#include <signal.h>
#include <unistd.h>

#include <atomic>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "args.hpp"
#include "chaos/driver.hpp"
#include "chaos_http_door.hpp"
#include "chaos/process_driver.hpp"
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
    {"processes", false, "run a real cluster of processes: a controller, the plan's nodes and gateways "
                         "(process-* plans)"},
    {"network", true, "--processes: auto (default: a network namespace per node where root and `ip netns` allow), "
                      "loopback, or namespaces (exit 77 when unavailable)"},
    {"work-dir", true, "--processes: where certificates, state, event logs and process output go "
                       "(default: a new directory under /tmp, removed after a run that held)"},
    {"help", false, "show this help"},
};

// Prints the report and writes the files asked for.
expected<void> write_outputs(const args& a, const chaos::run_report& report, const std::vector<chaos::event>& log) {
  std::printf("%s", chaos::to_table(report).c_str());
  if (auto path = a.get("report-json")) {
    std::ofstream f(*path);
    f << chaos::to_json(report) << "\n";
    if (!f) return make_error(errc::io_error, "cannot write " + *path);
  }
  if (auto path = a.get("event-log")) {
    std::ofstream f(*path);
    for (const auto& e : log) f << chaos::to_json_line(e) << "\n";
    if (!f) return make_error(errc::io_error, "cannot write " + *path);
  }
  return {};
}

std::atomic<bool> interrupted{false};
extern "C" void on_interrupt(int) { interrupted.store(true); }

int run_with_processes(const args& a, chaos::plan plan, const expected<std::int64_t>& seed, const std::string& model) {
  if (a.has("virtual")) return fail("chaos", {errc::invalid_argument, "--virtual and --processes exclude each other"});
  chaos::process_run_config pc;
  pc.plan = std::move(plan);
  if (a.has("seed")) pc.seed = static_cast<std::uint64_t>(*seed);
  pc.model_file = model;
  std::error_code ec;
  pc.exaserve_bin = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) return fail("chaos", {errc::io_error, "cannot find this binary (/proc/self/exe): " + ec.message()});
  const std::string network = a.get_or("network", "auto");
  if (network == "auto") pc.network = chaos::process_network::automatic;
  else if (network == "loopback") pc.network = chaos::process_network::loopback;
  else if (network == "namespaces") pc.network = chaos::process_network::namespaces;
  else return fail("chaos", {errc::invalid_argument, "--network must be auto, loopback or namespaces (got '" + network + "')"});
  if (pc.network == chaos::process_network::namespaces && !chaos::network_namespaces_available()) {
    std::fprintf(stderr, "SKIPPED: --network namespaces needs root and `ip netns` (iproute2)\n");
    return 77;
  }
  const bool own_dir = !a.has("work-dir");
  if (own_dir) {
    char tmpl[] = "/tmp/exaserve-chaos-XXXXXX";
    if (!::mkdtemp(tmpl)) return fail("chaos", {errc::io_error, "cannot create a directory under /tmp"});
    pc.work_dir = tmpl;
  } else {
    pc.work_dir = *a.get("work-dir");
  }
  spdlog::info("event=chaos_start plan={} seed={} mode=processes duration_s={} faults={} dir={}", pc.plan.name,
               pc.seed.value_or(pc.plan.seed), pc.plan.workload.duration_s, pc.plan.faults.size(), pc.work_dir);
  // SIGINT/SIGTERM end the run cleanly: processes stopped, namespaces removed.
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  pc.interrupted = &interrupted;
  auto out = chaos::run_processes(pc);
  if (!out) {
    // Keep what the processes wrote (it says why), and say where it is.
    std::fprintf(stderr, "exaserve chaos: process output and event logs kept in %s\n", pc.work_dir.c_str());
    return fail("chaos", out.error());
  }
  if (auto ok = write_outputs(a, out->report, out->log); !ok) return fail("chaos", ok.error());
  std::printf("network: %s\n", out->namespaces ? "a network namespace per node" : "loopback");
  for (const auto& s : out->skipped) std::printf("skipped: %s\n", s.c_str());
  if (own_dir && out->report.ok()) {
    std::filesystem::remove_all(pc.work_dir, ec);
  } else {
    std::printf("event logs and process output: %s\n", pc.work_dir.c_str());
  }
  return out->report.ok() ? 0 : 1;
}

}  // namespace

int cmd_chaos(int argc, char** argv) {
  auto a = args::parse(argc, argv, 2, flags);
  if (!a) return fail("chaos", a.error());
  if (a->has("help") || a->positional().size() != 1) {
    std::printf("usage: exaserve chaos PLAN [--seed N] [--report-json FILE] [--event-log FILE] "
                "[--virtual | --processes [--network auto|loopback|namespaces] [--work-dir DIR]]\n%s"
                "Plans: chaos/plans/*.json\n",
                describe_flags(flags).c_str());
    return a->has("help") ? 0 : 2;
  }
  auto plan = chaos::load_plan(a->positional().front());
  if (!plan) return fail("chaos", plan.error());
  auto seed = a->get_int("seed", 0, 0, INT64_MAX);
  if (!seed) return fail("chaos", seed.error());
  std::string model;
  if (auto m = a->get("model")) {
    model = *m;
  } else {
    auto def = default_model_path();
    if (!def) return fail("chaos", def.error());
    model = *def;
  }
  if (a->has("processes")) return run_with_processes(*a, std::move(*plan), seed, model);
  for (const char* f : {"network", "work-dir"})
    if (a->has(f)) return fail("chaos", {errc::invalid_argument, std::string("--") + f + " only applies with --processes"});
  chaos::run_config rc;
  rc.plan = std::move(*plan);
  if (a->has("seed")) rc.seed = static_cast<std::uint64_t>(*seed);
  rc.real_time = !a->has("virtual");
  rc.serve_http = chaos_http_door();
  rc.model_file = model;
  spdlog::info("event=chaos_start plan={} seed={} mode={} duration_s={} faults={}", rc.plan.name,
               rc.seed.value_or(rc.plan.seed), rc.real_time ? "real_time" : "virtual", rc.plan.workload.duration_s,
               rc.plan.faults.size());
  auto out = chaos::run_plan(rc);
  if (!out) return fail("chaos", out.error());
  if (auto ok = write_outputs(*a, out->report, out->log); !ok) return fail("chaos", ok.error());
  return out->report.ok() ? 0 : 1;
}

}  // namespace exa::app
