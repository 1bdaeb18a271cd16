// Chaos plans: parsing with field-named errors, the example plans, and the
// seeded fault and workload schedules.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "chaos/plan.hpp"

namespace {

using json = nlohmann::json;
using namespace exa::chaos;

json base_plan() {
  return json::parse(R"({
    "name": "unit", "seed": 7,
    "cluster": { "nodes": 4, "devices_per_node": 2, "racks": 2, "replicas": 4, "engine": "cpu",
                 "heartbeat_interval_ms": 200, "suspect_after_missed": 5, "observation_window_ms": 2000,
                 "device_check_interval_ms": 1000, "request_deadline_ms": 30000, "migration_parallelism": 2 },
    "workload": { "kind": "steady", "rate_per_s": 20, "duration_s": 60, "prompt_tokens": 16,
                  "max_tokens": 32, "temperature": 0, "prompts": 8 },
    "faults": [
      { "at_s": 10, "kind": "kill_replica", "node": 1 },
      { "at_s": 20, "kind": "kill_node", "node": 2 },
      { "at_s": 30, "kind": "partition_node", "node": 1, "duration_s": 40 },
      { "at_s": 30, "kind": "heartbeat_jitter", "node": 1, "delay_ms": 4000, "duration_s": 6 },
      { "at_s": 40, "kind": "fail_device", "node": 0, "device": 1 },
      { "at_s": 50, "kind": "hang_device", "node": 0, "device": 0, "duration_s": 10 },
      { "at_s": 60, "kind": "slow_model_load", "node": 3, "delay_ms": 5000, "duration_s": 60 },
      { "at_s": 5, "kind": "drop_messages", "node": 1, "probability": 0.5, "duration_s": 20 },
      { "at_s": 5, "kind": "delay_messages", "node": 1, "delay_ms": 300, "duration_s": 20 },
      { "at_s": 5, "kind": "duplicate_messages", "node": 1, "probability": 0.3, "duration_s": 20 },
      { "kind": "kill_replica", "rate_per_min": 6, "from_s": 0, "to_s": 60 }
    ]
  })");
}

/// A plan with only the given faults (base cluster and workload).
json plan_with_faults(json faults) {
  json j = base_plan();
  j["faults"] = std::move(faults);
  return j;
}

/// Parsing must fail with invalid_argument and a message starting "<field>:".
void require_field_error(const json& j, const std::string& field, const std::string& words = "") {
  const auto p = parse_plan(j.dump());
  INFO("expected an error naming " << field);
  REQUIRE_FALSE(p.has_value());
  INFO("got: " << p.error().message);
  CHECK(p.error().code == exa::errc::invalid_argument);
  CHECK(p.error().message.rfind(field + ": ", 0) == 0);
  if (!words.empty()) CHECK(p.error().message.find(words) != std::string::npos);
}

}  // namespace

TEST_CASE("the base plan parses with every field read", "[chaos]") {
  const auto p = parse_plan(base_plan().dump());
  REQUIRE(p.has_value());
  CHECK(p->name == "unit");
  CHECK(p->seed == 7);
  CHECK(p->cluster.nodes == 4);
  CHECK(p->cluster.racks == 2);
  CHECK(p->cluster.heartbeat_interval_ms == 200);
  CHECK(p->cluster.observation_window_ms == 2000);
  CHECK(p->cluster.device_check_interval_ms == 1000);
  CHECK(p->cluster.request_deadline_ms == 30000);
  CHECK(p->cluster.migration_parallelism == 2);
  CHECK(p->workload.rate_per_s == 20);
  CHECK(p->workload.max_tokens == 32);
  REQUIRE(p->faults.size() == 11);
  CHECK(p->faults[0].kind == fault_kind::kill_replica);
  CHECK(p->faults[0].node == 1u);
  CHECK(p->faults[3].delay_ms == 4000);
  CHECK(p->faults[4].device == 1u);
  CHECK(p->faults[7].probability == 0.5);
  CHECK(p->faults[9].kind == fault_kind::duplicate_messages);
  CHECK_FALSE(p->faults[10].at_s.has_value());
  CHECK(p->faults[10].rate_per_min == 6.0);
  CHECK(p->faults[10].to_s == 60);
}

TEST_CASE("a random fault's window defaults to the whole workload", "[chaos]") {
  const auto p = parse_plan(plan_with_faults(json::parse(R"([{"kind":"kill_replica","rate_per_min":2}])")).dump());
  REQUIRE(p.has_value());
  CHECK(p->faults[0].from_s == 0);
  CHECK(p->faults[0].to_s == 60);
}

TEST_CASE("fault kinds round-trip through their names", "[chaos]") {
  for (auto k : {fault_kind::kill_replica, fault_kind::partition_node, fault_kind::duplicate_messages,
                 fault_kind::kill_process, fault_kind::netem, fault_kind::kill_gateway, fault_kind::restart_controller})
    CHECK(fault_kind_from_string(to_string(k)) == k);
  CHECK_FALSE(fault_kind_from_string("kill_everything").has_value());
}

TEST_CASE("plan documents that are not plans are rejected", "[chaos]") {
  const auto bad_json = parse_plan("{ \"name\": ");
  REQUIRE_FALSE(bad_json.has_value());
  CHECK(bad_json.error().message.rfind("plan: not valid JSON", 0) == 0);
  const auto array = parse_plan("[1, 2]");
  REQUIRE_FALSE(array.has_value());
  CHECK(array.error().message == "plan: must be a JSON object");
  CHECK_FALSE(parse_plan(std::string(max_plan_bytes + 1, ' ')).has_value());
}

TEST_CASE("top-level fields are validated by name", "[chaos]") {
  json j = base_plan();
  j["nmae"] = "typo";
  require_field_error(j, "nmae", "unknown key");
  j = base_plan();
  j.erase("name");
  require_field_error(j, "name", "required");
  j = base_plan();
  j["name"] = "has space";
  require_field_error(j, "name");
  j = base_plan();
  j["name"] = 3;
  require_field_error(j, "name", "must be a string");
  j = base_plan();
  j["seed"] = -1;
  require_field_error(j, "seed");
  j = base_plan();
  j["seed"] = "1";
  require_field_error(j, "seed", "integer");
  j = base_plan();
  j["cluster"] = 4;
  require_field_error(j, "cluster", "object");
  j = base_plan();
  j["faults"] = json::object();
  require_field_error(j, "faults", "array");
}

TEST_CASE("cluster fields are validated by name", "[chaos]") {
  struct bad {
    const char* key;
    json value;
  };
  const std::vector<bad> cases = {
      {"nodes", 0},
      {"nodes", 1025},
      {"nodes", 2.5},
      {"devices_per_node", 0},
      {"devices_per_node", 65},
      {"racks", 5},
      {"replicas", 0},
      {"engine", "gpu"},
      {"engine", 1},
      {"heartbeat_interval_ms", 0},
      {"suspect_after_missed", 0},
      {"suspect_after_missed", 101},
      {"observation_window_ms", 0},
      {"observation_window_ms", 3600001},
      {"device_check_interval_ms", 0},
      {"request_deadline_ms", 0},
      {"migration_parallelism", 0},
      {"spare_nodes", 1},
  };
  for (const bad& c : cases) {
    json j = base_plan();
    j["cluster"][c.key] = c.value;
    require_field_error(j, std::string("cluster.") + c.key);
  }
}

TEST_CASE("workload fields are validated by name", "[chaos]") {
  struct bad {
    const char* key;
    json value;
  };
  const std::vector<bad> cases = {
      {"kind", "burst"},      {"rate_per_s", 0},     {"rate_per_s", -1},       {"duration_s", 0},
      {"duration_s", 86401},  {"prompt_tokens", 0},  {"prompt_tokens", 4097},  {"max_tokens", 0},
      {"max_tokens", 4097},   {"temperature", -0.1}, {"temperature", 2.1},     {"prompts", 0},
      {"prompts", 1025},      {"end_rate_per_s", 5},  // only for ramp
      {"think_time_s", 1},
  };
  for (const bad& c : cases) {
    json j = base_plan();
    j["workload"][c.key] = c.value;
    require_field_error(j, std::string("workload.") + c.key);
  }
  json ramp = base_plan();
  ramp["workload"]["kind"] = "ramp";
  ramp["workload"]["end_rate_per_s"] = 0;
  require_field_error(ramp, "workload.end_rate_per_s");
  ramp["workload"]["end_rate_per_s"] = 50;
  CHECK(parse_plan(ramp.dump()).has_value());

  json too_many = base_plan();
  too_many["workload"]["rate_per_s"] = 100000;
  too_many["workload"]["duration_s"] = 60;
  require_field_error(too_many, "workload.rate_per_s", "requests");

  json one_byte = base_plan();
  one_byte["workload"]["prompt_tokens"] = 1;
  one_byte["workload"]["prompts"] = 65;
  require_field_error(one_byte, "workload.prompts", "prompt_tokens >= 2");
  one_byte["workload"]["prompts"] = 64;
  CHECK(parse_plan(one_byte.dump()).has_value());
}

TEST_CASE("fault timing is validated by name", "[chaos]") {
  auto fault = [](const char* text) { return plan_with_faults(json::array({json::parse(text)})); };
  require_field_error(fault(R"({"kind":"kill_replica"})"), "faults[0].at_s", "exactly one");
  require_field_error(fault(R"({"kind":"kill_replica","at_s":1,"rate_per_min":1})"), "faults[0].at_s",
                      "exactly one");
  require_field_error(fault(R"({"kind":"kill_replica","at_s":-1})"), "faults[0].at_s");
  require_field_error(fault(R"({"kind":"kill_replica","at_s":61})"), "faults[0].at_s");
  require_field_error(fault(R"({"kind":"kill_replica","at_s":"10"})"), "faults[0].at_s", "number");
  require_field_error(fault(R"({"kind":"kill_replica","at_s":1,"from_s":0})"), "faults[0].from_s");
  require_field_error(fault(R"({"kind":"kill_replica","rate_per_min":0})"), "faults[0].rate_per_min");
  require_field_error(fault(R"({"kind":"kill_replica","rate_per_min":1,"from_s":30,"to_s":30})"), "faults[0].to_s");
  require_field_error(fault(R"({"kind":"kill_replica","rate_per_min":1,"from_s":0,"to_s":61})"), "faults[0].to_s");
  require_field_error(fault(R"({"kind":"kill_replica","rate_per_min":6001})"), "faults[0].rate_per_min");
  json many = fault(R"({"kind":"kill_replica","rate_per_min":6000,"from_s":0,"to_s":200})");
  many["workload"]["duration_s"] = 200;
  require_field_error(many, "faults[0].rate_per_min", "expects 20000 faults");
  many["faults"][0]["to_s"] = 100;  // 10000 expected: at the limit
  CHECK(parse_plan(many.dump()).has_value());
}

TEST_CASE("fault targets and parameters are validated by name", "[chaos]") {
  auto fault = [](const char* text) { return plan_with_faults(json::array({json::parse(text)})); };
  require_field_error(fault(R"({"at_s":1})"), "faults[0].kind", "required");
  require_field_error(fault(R"({"at_s":1,"kind":"explode"})"), "faults[0].kind", "unknown fault kind");
  require_field_error(fault(R"({"at_s":1,"kind":"kill_node","nod":1})"), "faults[0].nod", "unknown key");
  require_field_error(fault(R"({"at_s":1,"kind":"kill_replica","node":7})"), "faults[0].node",
                      "7 is not a node of a 4-node cluster");
  require_field_error(fault(R"({"at_s":1,"kind":"kill_node"})"), "faults[0].node", "required for kill_node");
  for (const char* kind : {"partition_node", "heartbeat_jitter", "hang_device", "slow_model_load", "drop_messages",
                           "delay_messages", "duplicate_messages", "fail_device"}) {
    json j = fault(R"({"at_s":1})");
    j["faults"][0]["kind"] = kind;
    require_field_error(j, "faults[0].node", "required");
  }
  require_field_error(fault(R"({"at_s":1,"kind":"fail_device","node":0})"), "faults[0].device", "required");
  require_field_error(fault(R"({"at_s":1,"kind":"hang_device","node":0,"duration_s":1})"), "faults[0].device");
  require_field_error(fault(R"({"at_s":1,"kind":"fail_device","node":0,"device":2})"), "faults[0].device",
                      "not a device");
  require_field_error(fault(R"({"at_s":1,"kind":"kill_node","node":0,"device":0})"), "faults[0].device",
                      "does not apply");
  require_field_error(fault(R"({"at_s":1,"kind":"partition_node","node":0})"), "faults[0].duration_s", "required");
  require_field_error(fault(R"({"at_s":1,"kind":"partition_node","node":0,"duration_s":0})"),
                      "faults[0].duration_s");
  require_field_error(fault(R"({"at_s":1,"kind":"hang_device","node":0,"device":0})"), "faults[0].duration_s");
  require_field_error(fault(R"({"at_s":1,"kind":"kill_node","node":0,"duration_s":5})"), "faults[0].duration_s",
                      "does not apply");
  require_field_error(fault(R"({"at_s":1,"kind":"heartbeat_jitter","node":0,"duration_s":5})"),
                      "faults[0].delay_ms", "required");
  require_field_error(fault(R"({"at_s":1,"kind":"slow_model_load","node":0,"duration_s":5,"delay_ms":0})"),
                      "faults[0].delay_ms");
  require_field_error(fault(R"({"at_s":1,"kind":"delay_messages","node":0,"duration_s":5})"), "faults[0].delay_ms");
  require_field_error(fault(R"({"at_s":1,"kind":"drop_messages","node":0,"duration_s":5})"),
                      "faults[0].probability", "required");
  require_field_error(fault(R"({"at_s":1,"kind":"drop_messages","node":0,"duration_s":5,"probability":0})"),
                      "faults[0].probability");
  require_field_error(fault(R"({"at_s":1,"kind":"duplicate_messages","node":0,"duration_s":5,"probability":1.5})"),
                      "faults[0].probability");
  require_field_error(fault(R"({"at_s":1,"kind":"kill_replica","probability":0.5})"), "faults[0].probability",
                      "does not apply");
  // The index names the bad fault, not the first one.
  json two = plan_with_faults(json::parse(R"([{"at_s":1,"kind":"kill_replica"},{"at_s":1,"kind":"kill_node"}])"));
  require_field_error(two, "faults[1].node");
  json not_object = plan_with_faults(json::array({1}));
  require_field_error(not_object, "faults[0]", "object");
}

TEST_CASE("load_plan names the path of a missing or bad file", "[chaos]") {
  const std::string missing = std::string(EXA_TEST_TMPDIR) + "/chaos/no-such-plan.json";
  const auto p = load_plan(missing);
  REQUIRE_FALSE(p.has_value());
  CHECK(p.error().code == exa::errc::io_error);
  CHECK(p.error().message.find(missing) != std::string::npos);

  std::filesystem::create_directories(std::string(EXA_TEST_TMPDIR) + "/chaos");
  const std::string bad = std::string(EXA_TEST_TMPDIR) + "/chaos/bad-plan.json";
  std::ofstream(bad) << R"({"name":"x","cluster":{"nodes":0}})";
  const auto q = load_plan(bad);
  REQUIRE_FALSE(q.has_value());
  CHECK(q.error().code == exa::errc::invalid_argument);
  CHECK(q.error().message.rfind(bad + ": cluster.nodes: ", 0) == 0);
}

TEST_CASE("every example plan parses and is named after its file", "[chaos]") {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(EXA_CHAOS_PLANS_DIR)) {
    if (entry.path().extension() != ".json") continue;
    const auto p = load_plan(entry.path().string());
    INFO(entry.path());
    if (!p) FAIL(p.error().message);
    CHECK(p->name == entry.path().stem().string());
    CHECK_FALSE(p->description.empty());
    CHECK_FALSE(schedule(*p).empty());
    CHECK_FALSE(schedule_workload(*p).empty());
    // process-* plans run with --processes, the others inside one process.
    const bool processes = p->name.rfind("process-", 0) == 0;
    const auto mode = check_plan_mode(*p, processes);
    if (!mode) FAIL(mode.error().message);
    CHECK_FALSE(check_plan_mode(*p, !processes).has_value());
    names.insert(p->name);
  }
  for (const char* expected : {"replica-kill", "node-kill", "partition", "jitter", "crash-loop", "device-faults",
                               "all-replicas-lost", "soak", "ci", "default-timings", "process-ci", "process-partition"})
    CHECK(names.count(expected) == 1);
}

// ---------------------------------------------------------------------------
// Fault schedules.

namespace {

plan parsed(const json& j) {
  auto p = parse_plan(j.dump());
  INFO((p ? std::string("ok") : p.error().message));
  REQUIRE(p.has_value());
  return *p;
}

std::vector<double> times_of(const std::vector<scheduled_fault>& s) {
  std::vector<double> t;
  for (const auto& f : s) t.push_back(f.at_s);
  return t;
}

}  // namespace

TEST_CASE("schedule sorts faults by time and numbers them from 1", "[chaos]") {
  const plan p = parsed(plan_with_faults(json::parse(R"([
      {"at_s": 30, "kind": "kill_node", "node": 0},
      {"at_s": 10, "kind": "kill_replica"},
      {"at_s": 30, "kind": "kill_replica", "node": 3},
      {"at_s": 5, "kind": "fail_device", "node": 1, "device": 1}])")));
  const auto s = schedule(p);
  REQUIRE(s.size() == 4);
  CHECK(times_of(s) == std::vector<double>{5, 10, 30, 30});
  CHECK(s[0].spec.kind == fault_kind::fail_device);
  CHECK_FALSE(s[1].spec.node.has_value());  // the driver picks the target
  CHECK(s[2].spec.kind == fault_kind::kill_node);  // a tie keeps plan order
  CHECK(s[3].spec.kind == fault_kind::kill_replica);
  for (std::size_t i = 0; i < s.size(); ++i) CHECK(s[i].id == i + 1);
}

TEST_CASE("random faults are deterministic per seed and differ across seeds", "[chaos]") {
  const plan p = parsed(plan_with_faults(json::parse(R"([
      {"kind": "kill_replica", "rate_per_min": 30, "from_s": 10, "to_s": 50},
      {"at_s": 20, "kind": "kill_node", "node": 1}])")));
  const auto a = schedule(p);
  const auto b = schedule(p);
  const auto c = schedule(p, 8);
  CHECK(times_of(a) == times_of(b));
  CHECK(times_of(a) != times_of(c));
  CHECK(times_of(schedule(p, 7)) == times_of(a));  // the plan's own seed
  for (const auto& s : {a, c}) {
    std::size_t fixed = 0;
    for (const auto& f : s) {
      CHECK(f.at_s >= 10);
      CHECK(f.at_s < 50);
      if (f.spec.kind == fault_kind::kill_node) {
        ++fixed;
        CHECK(f.at_s == 20);
      }
    }
    CHECK(fixed == 1);
    CHECK(std::is_sorted(s.begin(), s.end(), [](const auto& x, const auto& y) { return x.at_s < y.at_s; }));
  }
}

TEST_CASE("random faults follow their rate", "[chaos]") {
  json j = plan_with_faults(json::parse(R"([{"kind": "kill_replica", "rate_per_min": 60}])"));
  j["workload"]["duration_s"] = 10000;
  j["workload"]["rate_per_s"] = 1;
  // 60 per minute for 10000 s: 10000 expected, sigma 100; within 4 sigma.
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    const auto s = schedule(parsed(j), seed);
    INFO("seed " << seed << ": " << s.size() << " faults");
    CHECK(std::abs(static_cast<double>(s.size()) - 10000) <= 400);
  }
}

// ---------------------------------------------------------------------------
// Workloads.

TEST_CASE("workload requests are numbered, cycle prompts and copy the spec", "[chaos]") {
  json j = base_plan();
  j["workload"]["temperature"] = 0.7;
  const plan p = parsed(j);
  const auto w = schedule_workload(p);
  REQUIRE(w.size() > 100);
  std::set<std::uint64_t> seeds;
  for (std::size_t i = 0; i < w.size(); ++i) {
    CHECK(w[i].id == "w" + std::to_string(i));
    CHECK(w[i].prompt == i % 8);
    CHECK(w[i].max_tokens == 32);
    CHECK(w[i].temperature == Approx(0.7f));
    CHECK(w[i].at_s >= 0);
    CHECK(w[i].at_s < 60);
    if (i > 0) CHECK(w[i].at_s >= w[i - 1].at_s);
    seeds.insert(w[i].seed);
  }
  CHECK(seeds.size() == w.size());
}

TEST_CASE("workloads are deterministic per seed and differ across seeds", "[chaos]") {
  const plan p = parsed(base_plan());
  auto times = [](const std::vector<scheduled_request>& w) {
    std::vector<double> t;
    for (const auto& r : w) t.push_back(r.at_s);
    return t;
  };
  CHECK(times(schedule_workload(p)) == times(schedule_workload(p)));
  CHECK(times(schedule_workload(p)) != times(schedule_workload(p, 99)));
  CHECK(schedule_workload(p)[0].seed != schedule_workload(p, 99)[0].seed);
}

TEST_CASE("a steady workload follows its rate", "[chaos]") {
  json j = base_plan();
  j["workload"]["rate_per_s"] = 10;
  j["workload"]["duration_s"] = 10000;
  // 100000 expected, sigma 316; within 4 sigma.
  const auto w = schedule_workload(parsed(j));
  INFO(w.size() << " requests");
  CHECK(std::abs(static_cast<double>(w.size()) - 100000) <= 4 * std::sqrt(100000.0));
}

TEST_CASE("a ramp workload's rate rises", "[chaos]") {
  json j = base_plan();
  j["workload"]["kind"] = "ramp";
  j["workload"]["rate_per_s"] = 1;
  j["workload"]["end_rate_per_s"] = 100;
  j["workload"]["duration_s"] = 1000;
  const auto w = schedule_workload(parsed(j));
  std::size_t first_quarter = 0, last_quarter = 0;
  for (const auto& r : w) {
    if (r.at_s < 250) ++first_quarter;
    if (r.at_s >= 750) ++last_quarter;
  }
  INFO(first_quarter << " then " << last_quarter);
  // Expected 3344 then 21781 (integrals of the linear rate).
  CHECK(last_quarter > 5 * first_quarter);
  CHECK(std::abs(static_cast<double>(w.size()) - 50500) <= 4 * std::sqrt(50500.0));
}

TEST_CASE("workload prompts are deterministic, sized, printable and distinct", "[chaos]") {
  for (std::uint32_t tokens : {2u, 3u, 16u, 200u}) {
    workload_spec w;
    w.prompt_tokens = tokens;
    w.prompts = 1024;
    std::set<std::string> seen;
    for (std::uint32_t i = 0; i < w.prompts; ++i) {
      const std::string s = workload_prompt(w, i);
      REQUIRE(s.size() == tokens);
      CHECK(std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7f; }));
      CHECK(s == workload_prompt(w, i));
      seen.insert(s);
    }
    CHECK(seen.size() == w.prompts);
  }
  workload_spec one;
  one.prompt_tokens = 1;
  std::set<std::string> seen;
  for (std::uint32_t i = 0; i < 64; ++i) seen.insert(workload_prompt(one, i));
  CHECK(seen.size() == 64);
}

// ---------------------------------------------------------------------------
// Process-mode plans.

TEST_CASE("process faults are validated by name", "[chaos]") {
  auto fault = [](const char* text) {
    json j = plan_with_faults(json::array({json::parse(text)}));
    j["cluster"]["gateways"] = 2;
    return j;
  };
  for (const char* kind : {"kill_process", "stop_process", "cont_process", "partition_host"}) {
    json j = fault(R"({"at_s":1})");
    j["faults"][0]["kind"] = kind;
    require_field_error(j, "faults[0].node", "required");
  }
  require_field_error(fault(R"({"at_s":1,"kind":"partition_host","node":0})"), "faults[0].duration_s", "required");
  require_field_error(fault(R"({"at_s":1,"kind":"kill_process","node":0,"duration_s":2})"), "faults[0].duration_s",
                      "does not apply");
  require_field_error(fault(R"({"at_s":1,"kind":"netem","node":0,"duration_s":2})"), "faults[0].kind",
                      "netem needs delay_ms, probability");
  require_field_error(fault(R"({"at_s":1,"kind":"kill_gateway"})"), "faults[0].gateway", "required");
  require_field_error(fault(R"({"at_s":1,"kind":"kill_gateway","gateway":2})"), "faults[0].gateway",
                      "2 is not a gateway of a cluster with 2");
  require_field_error(fault(R"({"at_s":1,"kind":"kill_gateway","node":0,"gateway":0})"), "faults[0].node",
                      "does not apply");
  require_field_error(fault(R"({"at_s":1,"kind":"kill_process","node":0,"gateway":0})"), "faults[0].gateway",
                      "only applies to kill_gateway");
  // stop_process may name how long; netem takes either parameter.
  const auto stop = parse_plan(fault(R"({"at_s":1,"kind":"stop_process","node":1,"duration_s":3})").dump());
  REQUIRE(stop);
  CHECK(stop->faults[0].duration_s == 3);
  const auto delay = parse_plan(fault(R"({"at_s":1,"kind":"netem","node":1,"duration_s":3,"delay_ms":50})").dump());
  REQUIRE(delay);
  CHECK(delay->faults[0].delay_ms == 50);
  CHECK(delay->faults[0].probability == 0);  // no loss unless asked
  const auto gw = parse_plan(fault(R"({"at_s":1,"kind":"kill_gateway","gateway":1})").dump());
  REQUIRE(gw);
  CHECK(gw->faults[0].gateway == 1u);
  CHECK(gw->cluster.gateways == 2);
}

TEST_CASE("a plan's faults must suit how it runs", "[chaos]") {
  const auto in_process = parse_plan(plan_with_faults(json::parse(R"([{"at_s":1,"kind":"kill_replica"}])")).dump());
  REQUIRE(in_process);
  CHECK(check_plan_mode(*in_process, false).has_value());
  const auto e = check_plan_mode(*in_process, true);
  REQUIRE_FALSE(e.has_value());
  CHECK(e.error().message.find("faults[0]: kill_replica acts on actors inside one process") == 0);
  const auto procs = parse_plan(plan_with_faults(json::parse(R"([{"at_s":1,"kind":"kill_process","node":1}])")).dump());
  REQUIRE(procs);
  CHECK(check_plan_mode(*procs, true).has_value());
  const auto f = check_plan_mode(*procs, false);
  REQUIRE_FALSE(f.has_value());
  CHECK(f.error().message == "faults[0]: kill_process acts on real processes: run the plan with --processes");
  // kill_controller suits both.
  const auto both = parse_plan(plan_with_faults(json::parse(R"([{"at_s":1,"kind":"kill_controller"}])")).dump());
  REQUIRE(both);
  CHECK(check_plan_mode(*both, true).has_value());
  CHECK(check_plan_mode(*both, false).has_value());
}
