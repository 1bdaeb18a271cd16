// Chaos reports and the event log: numbers computed from a hand-made log,
// the JSON and table renderings, and byte-stable JSON lines.

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "chaos/report.hpp"

namespace {

using json = nlohmann::json;
using namespace exa::chaos;

constexpr std::int64_t ms_ns = 1'000'000;

event at(std::int64_t t_ms, event_kind k) {
  event e;
  e.t_ns = t_ms * ms_ns;
  e.kind = k;
  return e;
}
event accepted(std::int64_t t_ms, const std::string& id) {
  event e = at(t_ms, event_kind::request_accepted);
  e.request_id = id;
  e.detail = "greedy";
  return e;
}
event finished(std::int64_t t_ms, const std::string& id, const std::string& outcome, double ttft_ms) {
  event e = at(t_ms, event_kind::request_finished);
  e.request_id = id;
  e.outcome = outcome;
  if (outcome != "completed") e.detail = "unavailable";
  e.value_ms = ttft_ms;
  return e;
}
event fault(std::int64_t t_ms, event_kind k, std::uint64_t id, const std::string& detail = "") {
  event e = at(t_ms, k);
  e.fault_id = id;
  e.detail = detail;
  return e;
}

/// Six requests around three faults, starting at t = 1 s:
///  fault 1 kill_replica  2.0 s, detected 2.2 s (and 2.4 s), recovered 3.0 s;
///  fault 2 hang_device   4.0 s, never detected, cleared 5.0 s;
///  fault 3 kill_node     6.0 s, detected 6.3 s, never recovered or cleared.
///  a 1.0 s clear 10 ms | b 2.5 s fault 100 ms | c 3.5 s clear 20 ms |
///  d 4.5 s fault, error, no TTFT | e 5.5 s lost | f 6.5 s fault 200 ms.
std::vector<event> hand_made_log() {
  return {
      accepted(1000, "a"),
      finished(1100, "a", "completed", 10),
      fault(2000, event_kind::fault_injected, 1, "kill_replica"),
      fault(2200, event_kind::fault_detected, 1, "monitor"),
      fault(2400, event_kind::fault_detected, 1, "heartbeat_suspect"),
      accepted(2500, "b"),
      fault(3000, event_kind::fault_recovered, 1),
      finished(3100, "b", "completed", 100),
      accepted(3500, "c"),
      finished(3600, "c", "completed", 20),
      fault(4000, event_kind::fault_injected, 2, "hang_device"),
      accepted(4500, "d"),
      finished(4600, "d", "error", -1),
      fault(5000, event_kind::fault_cleared, 2),
      accepted(5500, "e"),
      fault(6000, event_kind::fault_injected, 3, "kill_node"),
      fault(6300, event_kind::fault_detected, 3, "heartbeat_confirmed"),
      accepted(6500, "f"),
      finished(7000, "f", "completed", 200),
  };
}

}  // namespace

TEST_CASE("percentiles are exact nearest-rank values", "[chaos]") {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  CHECK(percentile(v, 50) == 50);
  CHECK(percentile(v, 99) == 99);
  CHECK(percentile(v, 100) == 100);
  CHECK(percentile({7}, 99) == 7);
  CHECK(percentile({}, 50) == -1);
  CHECK(percentile({1, 2, 3}, 50) == 2);
  // Rank arithmetic in integers: of 1..100, p55 is rank 55 exactly (0.55 * 100
  // in doubles is 55.00000000000001, whose ceiling would pick 56).
  CHECK(percentile(v, 55) == 55);
}

TEST_CASE("the report counts requests and times faults from the log", "[chaos]") {
  const run_report r = make_report("unit", 42, hand_made_log(), {});
  CHECK(r.plan == "unit");
  CHECK(r.seed == 42);
  CHECK(r.requests == 6);
  CHECK(r.completed == 4);
  CHECK(r.errored == 1);
  CHECK(r.error_reasons == std::map<std::string, std::uint64_t>{{"unavailable", 1}});
  CHECK(r.lost == 1);
  CHECK_FALSE(r.ok());
  CHECK(r.wall_s == Approx(6.0));

  REQUIRE(r.faults.size() == 3);
  CHECK(r.faults[0].id == 1);
  CHECK(r.faults[0].kind == "kill_replica");
  CHECK(r.faults[0].injected_s == Approx(1.0));  // since the first event
  CHECK(r.faults[0].detect_ms == Approx(200));   // the first detection counts
  CHECK(r.faults[0].recover_ms == Approx(1000));
  CHECK(r.faults[1].kind == "hang_device");
  CHECK(r.faults[1].detect_ms == -1);
  CHECK(r.faults[1].recover_ms == -1);
  CHECK(r.faults[2].detect_ms == Approx(300));
  CHECK(r.faults[2].recover_ms == -1);

  // TTFT: all {10, 20, 100, 200}; during faults {100 (b), 200 (f)}; clear {10, 20}.
  CHECK(r.ttft_p50_ms == 20);
  CHECK(r.ttft_p99_ms == 200);
  CHECK(r.ttft_p50_fault_ms == 100);
  CHECK(r.ttft_p99_fault_ms == 200);
  CHECK(r.ttft_p50_clear_ms == 10);
  CHECK(r.ttft_p99_clear_ms == 20);
}

TEST_CASE("a fault window ends at recovery even when clearing comes later", "[chaos]") {
  std::vector<event> log = {
      fault(0, event_kind::fault_injected, 1, "partition_node"),
      accepted(500, "in"),
      fault(1000, event_kind::fault_recovered, 1),
      accepted(2000, "after"),
      fault(5000, event_kind::fault_cleared, 1),
      finished(5100, "in", "completed", 300),
      finished(5200, "after", "completed", 30),
  };
  const run_report r = make_report("unit", 1, log, {});
  CHECK(r.ttft_p50_fault_ms == 300);
  CHECK(r.ttft_p50_clear_ms == 30);
  CHECK(r.ok());
}

TEST_CASE("groups without TTFT samples report -1", "[chaos]") {
  const run_report r = make_report("empty", 1, {}, {});
  CHECK(r.ttft_p50_ms == -1);
  CHECK(r.ttft_p99_fault_ms == -1);
  CHECK(r.requests == 0);
  CHECK(r.wall_s == 0);
  CHECK(r.ok());
}

TEST_CASE("the JSON report has the documented keys and values", "[chaos]") {
  const run_report r =
      make_report("unit", 42, hand_made_log(), {{"lost_request", "request e accepted at #14 never finished"}});
  const json j = json::parse(to_json(r));
  for (const char* key : {"plan", "seed", "requests", "completed", "errored", "lost", "ttft_p50_ms", "ttft_p99_ms",
                          "ttft_p50_fault_ms", "ttft_p99_fault_ms", "ttft_p50_clear_ms", "ttft_p99_clear_ms",
                          "wall_s", "ok", "error_reasons", "faults", "violations"}) {
    INFO(key);
    CHECK(j.contains(key));
  }
  CHECK(j["plan"] == "unit");
  CHECK(j["seed"] == 42);
  CHECK(j["lost"] == 1);
  CHECK(j["ok"] == false);
  CHECK(j["ttft_p99_fault_ms"] == 200.0);
  CHECK(j["error_reasons"]["unavailable"] == 1);
  REQUIRE(j["faults"].size() == 3);
  for (const char* key : {"id", "kind", "injected_s", "detect_ms", "recover_ms"}) CHECK(j["faults"][0].contains(key));
  CHECK(j["faults"][0]["detect_ms"] == 200.0);
  CHECK(j["faults"][1]["recover_ms"] == -1.0);
  REQUIRE(j["violations"].size() == 1);
  CHECK(j["violations"][0]["invariant"] == "lost_request");
  CHECK(j["violations"][0]["detail"] == "request e accepted at #14 never finished");
  CHECK(to_json(r) == to_json(make_report("unit", 42, hand_made_log(), r.violations)));
}

TEST_CASE("the table lists every fault and the verdict", "[chaos]") {
  const run_report bad = make_report("unit", 42, hand_made_log(), {{"token_gap", "request b: indices 3..4"}});
  const std::string t = to_table(bad);
  INFO(t);
  CHECK(t.find("FAILED") != std::string::npos);
  CHECK(t.find("kill_replica") != std::string::npos);
  CHECK(t.find("hang_device") != std::string::npos);
  CHECK(t.find("kill_node") != std::string::npos);
  CHECK(t.find("request b: indices 3..4") != std::string::npos);
  CHECK(t.find("all invariants held") == std::string::npos);
  CHECK(t.find("errors by reason:\n         1  unavailable\n") != std::string::npos);

  std::vector<event> clean = hand_made_log();
  clean.push_back(finished(8000, "e", "completed", 15));
  const std::string ok = to_table(make_report("unit", 42, clean, {}));
  INFO(ok);
  CHECK(ok.find("OK") != std::string::npos);
  CHECK(ok.find("all invariants held") != std::string::npos);
  // One line per fault, each the same width.
  std::istringstream lines(ok);
  std::string line;
  std::size_t width = 0, rows = 0;
  while (std::getline(lines, line)) {
    if (line.find("kill_") == std::string::npos && line.find("hang_") == std::string::npos) continue;
    if (width == 0) width = line.size();
    CHECK(line.size() == width);
    ++rows;
  }
  CHECK(rows == 3);
}

TEST_CASE("event JSON lines have a fixed field order and number format", "[chaos]") {
  event f = at(1, event_kind::request_finished);
  f.t_ns = 1'500'000;
  f.request_id = "w1";
  f.outcome = "completed";
  f.count = 3;
  f.value_ms = 12.5;
  f.value2_ms = 40;
  CHECK(to_json_line(f) ==
        R"({"t_ns":1500000,"kind":"request_finished","request_id":"w1","outcome":"completed","count":3,)"
        R"("value_ms":12.500,"value2_ms":40.000})");

  event t = at(2, event_kind::request_tokens);
  t.request_id = "w\"2";
  t.tokens = {5, -1, 7};
  CHECK(to_json_line(t) == R"({"t_ns":2000000,"kind":"request_tokens","request_id":"w\"2","index":0,"tokens":[5,-1,7]})");

  event r = at(3, event_kind::replica_state);
  r.replica = 4;
  r.deployment = "tiny";
  r.slot = 0;
  r.epoch = 2;
  r.node = 0;
  r.detail = "serving";
  CHECK(to_json_line(r) ==
        R"({"t_ns":3000000,"kind":"replica_state","deployment":"tiny","replica":4,"slot":0,"epoch":2,"node":0,)"
        R"("detail":"serving"})");

  for (const event& e : {f, t, r}) {
    const json j = json::parse(to_json_line(e));
    CHECK(j["kind"] == std::string(to_string(e.kind)));
  }
}

TEST_CASE("the event log keeps appends from many threads", "[chaos]") {
  event_log log;
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&log, k] {
      for (int i = 0; i < 500; ++i) {
        event e = at(i, event_kind::node_state);
        e.node = k;
        e.detail = "healthy";
        log.append(std::move(e));
      }
    });
  for (auto& th : threads) th.join();
  CHECK(log.size() == 2000);
  CHECK(log.events().size() == 2000);
  const std::string jsonl = log.to_jsonl();
  CHECK(std::count(jsonl.begin(), jsonl.end(), '\n') == 2000);
}
