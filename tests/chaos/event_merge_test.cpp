// Event logs of several processes: written to files as they happen, read
// back (a torn last line tolerated, anything else named), and merged by
// clock-corrected time.

#include <catch2/catch.hpp>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "chaos/event_merge.hpp"
#include "chaos/invariants.hpp"

using namespace exa::chaos;

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()) + ".jsonl")).string();
}

event at(std::int64_t t, event_kind k, std::string detail = "") {
  event e;
  e.t_ns = t;
  e.kind = k;
  e.detail = std::move(detail);
  return e;
}

event offset(std::int64_t t, double ms) {
  event e = at(t, event_kind::clock_offset);
  e.node = 1;
  e.value_ms = ms;
  return e;
}

}  // namespace

TEST_CASE("an event survives its JSON line", "[chaos][events]") {
  event e;
  e.t_ns = 123456789012345;
  e.kind = event_kind::request_finished;
  e.request_id = "w\"7\"";
  e.outcome = "completed";
  e.detail = "tab\there";
  e.count = 12;
  e.index = 2;
  e.value_ms = 3.25;
  e.value2_ms = std::nan("");
  auto back = parse_event_line(to_json_line(e));
  REQUIRE(back);
  CHECK(back->t_ns == e.t_ns);
  CHECK(back->kind == e.kind);
  CHECK(back->request_id == e.request_id);
  CHECK(back->outcome == e.outcome);
  CHECK(back->detail == e.detail);
  CHECK(back->count == 12);
  CHECK(back->index == 2);
  CHECK(back->value_ms == 3.25);
  CHECK(std::isnan(back->value2_ms));  // written as null
  event r;
  r.kind = event_kind::request_tokens;
  r.request_id = "w1";
  r.tokens = {5, -1, 70000};
  auto rt = parse_event_line(to_json_line(r));
  REQUIRE(rt);
  CHECK(rt->tokens == r.tokens);
  CHECK(rt->node == -1);
  CHECK(rt->slot == -1);
}

TEST_CASE("bad event lines are refused with the field named", "[chaos][events]") {
  CHECK_FALSE(parse_event_line("not json"));
  CHECK(parse_event_line(R"({"kind":"node_state"})").error().message.find("t_ns") != std::string::npos);
  CHECK(parse_event_line(R"({"t_ns":1,"kind":"explode"})").error().message == "kind: unknown event kind \"explode\"");
  CHECK(parse_event_line(R"({"t_ns":1,"kind":"node_state","node":"two"})").error().message.find("node:") == 0);
}

TEST_CASE("a file log writes each event as it comes, stamped with the wall clock", "[chaos][events]") {
  const auto path = temp_path("event-log");
  std::filesystem::remove(path);
  const auto before = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
  {
    auto log = event_log::to_file(path);
    REQUIRE(log);
    event e = at(7, event_kind::node_state, "suspect");
    e.node = 3;
    (*log)->append(e);
    // Already on disk, before the log is closed: a SIGKILL loses nothing.
    auto read = read_event_log(path);
    REQUIRE(read);
    REQUIRE(read->events.size() == 1);
    CHECK(read->events[0].detail == "suspect");
    CHECK(read->events[0].node == 3);
    CHECK(read->events[0].t_ns >= before);  // the wall clock, not the 7 it was given
    CHECK((*log)->size() == 0);             // nothing kept in memory
    (*log)->append(at(8, event_kind::node_state, "healthy"));
  }
  {
    auto again = event_log::to_file(path);  // a restarted process appends
    REQUIRE(again);
    (*again)->append(at(9, event_kind::node_state, "confirmed"));
  }
  auto read = read_event_log(path);
  REQUIRE(read);
  REQUIRE(read->events.size() == 3);
  CHECK(read->events[2].detail == "confirmed");
  CHECK(read->events[0].t_ns <= read->events[1].t_ns);
  std::filesystem::remove(path);
  auto bad = event_log::to_file("/nonexistent-dir/x.jsonl");
  REQUIRE_FALSE(bad);
  CHECK(bad.error().message.find("/nonexistent-dir/x.jsonl") != std::string::npos);
}

TEST_CASE("a torn last line is counted, a bad line elsewhere is an error naming it", "[chaos][events]") {
  const auto path = temp_path("torn");
  const std::string good = to_json_line(at(1, event_kind::fault_cleared));
  std::ofstream(path) << good << "\n" << good << "\n" << R"({"t_ns":3,"kind":"fau)";
  auto r = read_event_log(path);
  REQUIRE(r);
  CHECK(r->events.size() == 2);
  CHECK(r->torn_lines == 1);
  std::ofstream(path) << good << "\n" << "garbage\n" << good << "\n";
  auto e = read_event_log(path);
  REQUIRE_FALSE(e);
  CHECK(e.error().message == path + ":2: not a JSON object");
  std::ofstream(path) << good << "\n" << good << "\n" << good << "\n";
  auto capped = read_event_log(path, 2);
  REQUIRE_FALSE(capped);
  CHECK(capped.error().message.find("more than 2 events") != std::string::npos);
  std::filesystem::remove(path);
  CHECK_FALSE(read_event_log(path));
}

TEST_CASE("merged logs are ordered by clock-corrected time", "[chaos][events]") {
  // The controller's log, on its own clock.
  std::vector<event> controller{at(1000, event_kind::node_state, "c1"), at(3000, event_kind::node_state, "c2"),
                                at(5000, event_kind::node_state, "c3")};
  // A node whose clock runs 0.0015 ms (1500 ns) ahead: its event at 2600 is
  // 1100 on the controller's clock, after c1 and before c2. Its first event
  // comes before it knew its offset, and is corrected with the first one.
  std::vector<event> node{at(2000, event_kind::replica_state, "n0"), offset(2500, 0.0015),
                          at(2600, event_kind::replica_state, "n1"),
                          // The estimate moves: later events use the newer offset.
                          offset(6000, 0.0005), at(6000, event_kind::replica_state, "n2")};
  const auto merged = merge_logs({controller, node});
  std::vector<std::string> order;
  for (const auto& e : merged)
    if (e.kind != event_kind::clock_offset) order.push_back(e.detail);
  CHECK(order == std::vector<std::string>{"n0", "c1", "n1", "c2", "c3", "n2"});
  for (std::size_t i = 1; i < merged.size(); ++i) CHECK(merged[i - 1].t_ns <= merged[i].t_ns);
  CHECK(merged[0].t_ns == 500);  // 2000 - 1500: times are corrected
  // Without the offsets the node's n1 would land after c2.
  std::vector<event> raw_node{at(2000, event_kind::replica_state, "n0"), at(2600, event_kind::replica_state, "n1")};
  const auto uncorrected = merge_logs({controller, raw_node});
  CHECK(uncorrected[1].detail == "n0");
  CHECK(uncorrected[2].detail == "n1");
  // Equal times keep the order of the logs as given.
  const auto tie = merge_logs({{at(5, event_kind::node_state, "a")}, {at(5, event_kind::node_state, "b")}});
  CHECK(tie[0].detail == "a");
  CHECK(tie[1].detail == "b");
}

TEST_CASE("replicas_up counts what the logs say is ready or serving", "[chaos][events]") {
  auto state = [](std::int64_t t, std::uint64_t replica, std::int64_t node, const char* s) {
    event e = at(t, event_kind::replica_state, s);
    e.deployment = "d";
    e.replica = replica;
    e.slot = static_cast<std::int64_t>(replica);
    e.epoch = 1;
    e.node = node;
    return e;
  };
  std::vector<event> log{state(1, 1, 0, "ready"), state(2, 2, 1, "serving"), state(3, 3, 1, "loading")};
  CHECK(replicas_up(log)["d"] == 2);
  event killed = at(4, event_kind::fault_injected, "kill_process");
  killed.node = 1;
  log.push_back(killed);  // node 1's process is gone: its replicas with it
  CHECK(replicas_up(log)["d"] == 1);
  log.push_back(state(5, 3, 2, "ready"));
  CHECK(replicas_up(log)["d"] == 2);
}
