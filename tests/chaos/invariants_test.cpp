// Invariant checks over hand-made event logs: a clean run passes, and each
// kind of violation is caught and named.

#include <catch2/catch.hpp>

#include "chaos/invariants.hpp"

namespace {

using namespace exa::chaos;

/// Builds a log with a running clock (1 ms per event unless told otherwise).
class log_builder {
 public:
  log_builder& at_ms(std::int64_t t_ms) {
    t_ns_ = t_ms * 1'000'000;
    return *this;
  }
  log_builder& accepted(const std::string& id, bool greedy = true, std::uint64_t max_tokens = 8) {
    event e = next(event_kind::request_accepted);
    e.request_id = id;
    e.deployment = "tiny";
    e.detail = greedy ? "greedy" : "sampled";
    e.count = max_tokens;
    return push(std::move(e));
  }
  log_builder& tokens(const std::string& id, std::uint64_t index, std::vector<std::int32_t> t) {
    event e = next(event_kind::request_tokens);
    e.request_id = id;
    e.index = index;
    e.tokens = std::move(t);
    return push(std::move(e));
  }
  log_builder& finished(const std::string& id, const std::string& outcome, std::uint64_t count,
                        const std::string& code = "") {
    event e = next(event_kind::request_finished);
    e.request_id = id;
    e.outcome = outcome;
    e.detail = code;
    e.count = count;
    e.value_ms = 5;
    e.value2_ms = 20;
    return push(std::move(e));
  }
  log_builder& replica(std::uint64_t id, std::int64_t slot, std::uint64_t epoch, std::int64_t node,
                       const std::string& state) {
    event e = next(event_kind::replica_state);
    e.replica = id;
    e.deployment = "tiny";
    e.slot = slot;
    e.epoch = epoch;
    e.node = node;
    e.detail = state;
    return push(std::move(e));
  }
  log_builder& fault(std::uint64_t fault_id, const std::string& kind, std::int64_t node = -1,
                     std::uint64_t replica = 0) {
    event e = next(event_kind::fault_injected);
    e.fault_id = fault_id;
    e.detail = kind;
    e.node = node;
    e.replica = replica;
    return push(std::move(e));
  }
  log_builder& node_state(std::int64_t node, const std::string& state) {
    event e = next(event_kind::node_state);
    e.node = node;
    e.detail = state;
    return push(std::move(e));
  }
  /// Two replicas (slots 0 and 1, epoch 1, nodes 0 and 1) ready, then serving.
  log_builder& two_serving() {
    return replica(1, 0, 1, 0, "loading").replica(1, 0, 1, 0, "ready").replica(2, 1, 1, 1, "ready")
        .replica(1, 0, 1, 0, "serving").replica(2, 1, 1, 1, "serving");
  }
  std::vector<event> log() const { return log_; }

 private:
  event next(event_kind k) {
    event e;
    e.t_ns = t_ns_;
    e.kind = k;
    t_ns_ += 1'000'000;
    return e;
  }
  log_builder& push(event e) {
    log_.push_back(std::move(e));
    return *this;
  }
  std::int64_t t_ns_ = 0;
  std::vector<event> log_;
};

invariant_inputs inputs_for(std::map<std::string, std::vector<std::int32_t>> expected, std::uint32_t desired = 2) {
  invariant_inputs in;
  in.expected_tokens = std::move(expected);
  in.desired_replicas["tiny"] = desired;
  return in;
}

std::string describe(const std::vector<violation>& v) {
  std::string s;
  for (const auto& x : v) s += x.invariant + ": " + x.detail + "\n";
  return s;
}

/// Exactly one violation, of the given invariant, whose detail contains every word.
void require_one(const std::vector<violation>& v, const std::string& invariant,
                 std::initializer_list<std::string> words) {
  INFO(describe(v));
  REQUIRE(v.size() == 1);
  CHECK(v[0].invariant == invariant);
  for (const auto& w : words) CHECK(v[0].detail.find(w) != std::string::npos);
}

/// A clean run: two replicas, one killed and replaced under a newer epoch, a
/// greedy request resumed across the kill, and a sampled request.
log_builder clean_run() {
  log_builder b;
  b.two_serving()
      .accepted("w0")
      .accepted("w1", /*greedy=*/false)
      .tokens("w0", 0, {1, 2, 3})
      .tokens("w1", 0, {9})
      .fault(1, "kill_replica", 0, 1)  // replica 1 dies without a word
      .replica(3, 0, 2, 2, "loading")
      .replica(3, 0, 2, 2, "ready")
      .replica(3, 0, 2, 2, "serving")
      .tokens("w0", 3, {4, 5})  // resumed on replica 3
      .tokens("w1", 1, {8, 7})
      .finished("w0", "completed", 5)
      .finished("w1", "error", 3, "unavailable");
  return b;
}

}  // namespace

TEST_CASE("a clean log keeps every invariant", "[chaos]") {
  const auto v = check_invariants(clean_run().log(), inputs_for({{"w0", {1, 2, 3, 4, 5}}}));
  INFO(describe(v));
  CHECK(v.empty());
}

TEST_CASE("a request accepted and never finished is lost", "[chaos]") {
  const auto v = check_invariants(clean_run().accepted("w7").tokens("w7", 0, {1, 2}).log(),
                                  inputs_for({{"w0", {1, 2, 3, 4, 5}}}));
  require_one(v, "lost_request", {"w7", "2 tokens"});
}

TEST_CASE("a missing token index is a gap", "[chaos]") {
  log_builder b;
  b.two_serving().accepted("w0").tokens("w0", 0, {1, 2}).tokens("w0", 4, {5}).finished("w0", "error", 5, "internal");
  require_one(check_invariants(b.log(), inputs_for({})), "token_gap", {"w0", "2..3"});
}

TEST_CASE("a completed request that streamed fewer tokens than it generated has a gap", "[chaos]") {
  log_builder b;
  b.two_serving().accepted("w0", false).tokens("w0", 0, {1, 2}).finished("w0", "completed", 3);
  require_one(check_invariants(b.log(), inputs_for({})), "token_gap", {"w0", "3 tokens generated but 2 streamed"});
}

TEST_CASE("a re-sent token index is a duplicate, same token or not", "[chaos]") {
  SECTION("same token") {
    log_builder b;
    b.two_serving().accepted("w0").tokens("w0", 0, {1, 2, 3}).tokens("w0", 2, {3, 4}).finished("w0", "completed", 4);
    require_one(check_invariants(b.log(), inputs_for({{"w0", {1, 2, 3, 4}}})), "duplicate_token",
                {"w0", "indices 2..2", "was 3, now 3"});
  }
  SECTION("different token") {
    log_builder b;
    b.two_serving().accepted("w0").tokens("w0", 0, {1, 2, 3}).tokens("w0", 1, {7, 8}).finished("w0", "completed", 3);
    require_one(check_invariants(b.log(), inputs_for({})), "duplicate_token", {"w0", "indices 1..2", "was 2, now 7"});
  }
}

TEST_CASE("a completed greedy request must match the failure-free output", "[chaos]") {
  log_builder b;
  b.two_serving()
      .accepted("w0")
      .accepted("w1", /*greedy=*/false)
      .tokens("w0", 0, {1, 2, 9})
      .tokens("w1", 0, {4})
      .finished("w0", "completed", 3)
      .finished("w1", "completed", 1);
  // w1 is sampled: not compared even though its entry differs.
  const auto v = check_invariants(b.log(), inputs_for({{"w0", {1, 2, 3}}, {"w1", {5}}}));
  require_one(v, "output_mismatch", {"w0", "token 2 is 9, expected 3"});

  log_builder shorter;
  shorter.two_serving().accepted("w0").tokens("w0", 0, {1, 2}).finished("w0", "completed", 2);
  require_one(check_invariants(shorter.log(), inputs_for({{"w0", {1, 2, 3}}})), "output_mismatch",
              {"token 2 is end, expected 3"});
}

TEST_CASE("two replicas of one slot ready or serving at once are caught", "[chaos]") {
  SECTION("replacement ready before the old one stopped") {
    log_builder b;
    b.two_serving().replica(3, 0, 2, 2, "ready").replica(1, 0, 1, 0, "stopped");
    require_one(check_invariants(b.log(), inputs_for({})), "two_serving_replicas",
                {"slot 0", "replica 3 (epoch 2)", "replica 1 (epoch 1)", "#5"});
  }
  SECTION("old one stopped first: fine") {
    log_builder b;
    b.two_serving().replica(1, 0, 1, 0, "draining").replica(3, 0, 2, 2, "ready").replica(3, 0, 2, 2, "serving");
    const auto v = check_invariants(b.log(), inputs_for({}));
    INFO(describe(v));
    CHECK(v.empty());
  }
  SECTION("the old one's node was killed: fine") {
    log_builder b;
    b.two_serving().fault(1, "kill_node", 0).replica(3, 0, 2, 2, "serving");
    CHECK(check_invariants(b.log(), inputs_for({})).empty());
  }
  SECTION("the old one's node went down: fine") {
    log_builder b;
    b.two_serving().node_state(0, "down").replica(3, 0, 2, 2, "serving");
    CHECK(check_invariants(b.log(), inputs_for({})).empty());
  }
  SECTION("the old one's node is only suspect: still serving") {
    log_builder b;
    b.two_serving().node_state(0, "suspect").replica(3, 0, 2, 2, "serving");
    require_one(check_invariants(b.log(), inputs_for({})), "two_serving_replicas", {"replica 1"});
  }
}

TEST_CASE("a stale epoch serving after a newer one is caught", "[chaos]") {
  log_builder b;
  b.two_serving()
      .replica(1, 0, 1, 0, "stopped")
      .replica(3, 0, 2, 2, "serving")
      .fault(1, "kill_replica", 2, 3)
      .replica(1, 0, 1, 0, "serving");  // the fenced replica comes back
  require_one(check_invariants(b.log(), inputs_for({})), "two_serving_replicas",
              {"replica 1 of stale epoch 1", "after epoch 2"});
}

TEST_CASE("a deployment short of its desired replicas at the end did not recover", "[chaos]") {
  log_builder b;
  b.two_serving().fault(1, "kill_replica", 1, 2);
  require_one(check_invariants(b.log(), inputs_for({}, 2)), "not_recovered", {"tiny", "1 of 2"});
  log_builder failed;
  failed.two_serving().replica(2, 1, 1, 1, "failed");
  require_one(check_invariants(failed.log(), inputs_for({}, 2)), "not_recovered", {"1 of 2"});
  invariant_inputs other = inputs_for({}, 2);
  other.desired_replicas["absent"] = 1;
  log_builder ok;
  ok.two_serving();
  require_one(check_invariants(ok.log(), other), "not_recovered", {"absent", "0 of 1"});
}

TEST_CASE("time going backwards is caught", "[chaos]") {
  log_builder b;
  b.two_serving().at_ms(100).node_state(1, "healthy").at_ms(50).node_state(1, "suspect");
  require_one(check_invariants(b.log(), inputs_for({})), "unordered_events", {"#6", "#5", "50.000", "100.000"});
}

TEST_CASE("malformed request streams are named", "[chaos]") {
  log_builder twice;
  twice.two_serving().accepted("w0", false).tokens("w0", 0, {1}).finished("w0", "completed", 1).finished(
      "w0", "error", 1, "internal");
  require_one(check_invariants(twice.log(), inputs_for({})), "finished_twice", {"w0"});

  log_builder no_code;
  no_code.two_serving().accepted("w0").finished("w0", "error", 0);
  require_one(check_invariants(no_code.log(), inputs_for({})), "bad_outcome", {"w0", "no error code"});

  log_builder never_accepted;
  never_accepted.two_serving().finished("w9", "cancelled", 0, "cancelled");
  require_one(check_invariants(never_accepted.log(), inputs_for({})), "unaccepted_request", {"w9"});

  log_builder late;
  late.two_serving().accepted("w0", false).tokens("w0", 0, {1}).finished("w0", "completed", 1).tokens("w0", 1, {2});
  require_one(check_invariants(late.log(), inputs_for({})), "tokens_after_finish", {"w0"});
}

TEST_CASE("violations of one kind are capped with a count of the rest", "[chaos]") {
  log_builder b;
  b.two_serving();
  for (int i = 0; i < 60; ++i) b.accepted("w" + std::to_string(i));
  const auto v = check_invariants(b.log(), inputs_for({}));
  REQUIRE(v.size() == max_violations_per_invariant + 1);
  CHECK(v.back().invariant == "lost_request");
  CHECK(v.back().detail == "10 more lost_request violations not listed");
}
