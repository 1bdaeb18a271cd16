// exaserve events merge FILE...: the event logs of several processes
// (`--event-log` of controller, node and gateway) as one, ordered by
// clock-corrected time (each node's log carries its clock offset to the
// controller), as JSON lines on stdout.

#include <cstdio>
#include <string>
#include <vector>

#include "args.hpp"
#include "chaos/event_merge.hpp"
#include "cli_util.hpp"
#include "commands.hpp"

namespace exa::app {
namespace {

const std::vector<flag_spec> flags = {
    {"help", false, "show this help"},
};

}  // namespace

int cmd_events(int argc, char** argv) {
  auto a = args::parse(argc, argv, 2, flags);
  if (!a) return fail("events", a.error());
  const auto& pos = a->positional();
  if (a->has("help") || pos.size() < 2 || pos.front() != "merge") {
    std::printf("usage: exaserve events merge FILE...\n"
                "Merges the event logs of a cluster's processes (their --event-log files) by clock-corrected\n"
                "time and prints them as JSON lines. A last line cut short (a process killed mid-write) is\n"
                "left out with a warning.\n%s",
                describe_flags(flags).c_str());
    return a->has("help") ? 0 : 2;
  }
  std::vector<std::vector<chaos::event>> logs;
  for (std::size_t i = 1; i < pos.size(); ++i) {
    auto r = chaos::read_event_log(pos[i]);
    if (!r) return fail("events", r.error());
    if (r->torn_lines > 0) std::fprintf(stderr, "warning: %s: its last line is cut short; left out\n", pos[i].c_str());
    logs.push_back(std::move(r->events));
  }
  for (const auto& e : chaos::merge_logs(logs)) std::printf("%s\n", chaos::to_json_line(e).c_str());
  return 0;
}

}  // namespace exa::app
