// Replica lifecycle: the transition table checked exhaustively against an
// independent list of allowed moves, error messages that name both states,
// and the bounded history of the lifecycle recorder.

#include <catch2/catch.hpp>

#include <set>
#include <utility>

#include "cluster/lifecycle.hpp"

using namespace exa;
using namespace exa::cluster;
using rs = replica_state;

namespace {

// Written out from the architecture page, independently of the table in lifecycle.cpp.
const std::set<std::pair<rs, rs>>& allowed() {
  static const std::set<std::pair<rs, rs>> moves = {
      {rs::creating, rs::loading}, {rs::loading, rs::warming},   {rs::warming, rs::ready},
      {rs::ready, rs::serving},    {rs::serving, rs::ready},     {rs::ready, rs::draining},
      {rs::serving, rs::draining}, {rs::draining, rs::stopped},  {rs::ready, rs::degraded},
      {rs::serving, rs::degraded}, {rs::degraded, rs::ready},    {rs::degraded, rs::serving},
      {rs::degraded, rs::draining}, {rs::creating, rs::failed},  {rs::loading, rs::failed},
      {rs::warming, rs::failed},   {rs::ready, rs::failed},      {rs::serving, rs::failed},
      {rs::draining, rs::failed},  {rs::degraded, rs::failed},
      {rs::warming, rs::standby},  {rs::ready, rs::standby},    {rs::standby, rs::ready},
      {rs::standby, rs::draining}, {rs::standby, rs::failed},   {rs::serving, rs::standby},
      {rs::standby, rs::serving},
  };
  return moves;
}

}  // namespace

TEST_CASE("every pair of states is allowed or refused as the diagram says", "[lifecycle]") {
  int valid = 0;
  for (const rs from : all_replica_states) {
    for (const rs to : all_replica_states) {
      const bool expect = allowed().contains({from, to});
      INFO(to_string(from) << " -> " << to_string(to));
      CHECK(is_valid_transition(from, to) == expect);
      const auto result = transition(from, to);
      CHECK(result.has_value() == expect);
      if (expect) {
        CHECK(*result == to);
        ++valid;
      } else {
        CHECK(result.error().code == errc::invalid_argument);
      }
    }
  }
  CHECK(valid == 27);
}

TEST_CASE("an invalid transition names both states", "[lifecycle]") {
  const auto skipped = transition(rs::creating, rs::ready);
  REQUIRE_FALSE(skipped);
  CHECK(skipped.error().message == "invalid replica state transition creating -> ready");
  const auto revived = transition(rs::failed, rs::ready);
  REQUIRE_FALSE(revived);
  CHECK(revived.error().message.find("failed -> ready") != std::string::npos);
  CHECK(revived.error().message.find("terminal") != std::string::npos);
}

TEST_CASE("only ready and serving accept requests and only stopped and failed are terminal",
          "[lifecycle]") {
  for (const rs s : all_replica_states) {
    INFO(to_string(s));
    CHECK(accepts_requests(s) == (s == rs::ready || s == rs::serving));
    CHECK(serves_requests(s) == (s == rs::ready || s == rs::serving || s == rs::degraded));
    CHECK(is_terminal(s) == (s == rs::stopped || s == rs::failed));
    // Terminal means no way out; every live state can fail.
    bool has_successor = false;
    for (const rs to : all_replica_states) has_successor = has_successor || is_valid_transition(s, to);
    CHECK(has_successor == !is_terminal(s));
    CHECK(is_valid_transition(s, rs::failed) == !is_terminal(s));
    CHECK_FALSE(is_valid_transition(s, s));
  }
}

TEST_CASE("state names are distinct and stable", "[lifecycle]") {
  std::set<std::string_view> names;
  for (const rs s : all_replica_states) names.insert(to_string(s));
  CHECK(names.size() == replica_state_count);
  CHECK(to_string(rs::degraded) == "degraded");
  CHECK(to_string(rs::serving) == "serving");
}

TEST_CASE("lifecycle walks the happy path and records each move with its time", "[lifecycle]") {
  lifecycle life(100);
  CHECK(life.state() == rs::creating);
  CHECK(life.entered_at_ns() == 100);
  for (const auto& [to, at] : std::initializer_list<std::pair<rs, std::uint64_t>>{
           {rs::loading, 110}, {rs::warming, 120}, {rs::ready, 130}, {rs::serving, 140},
           {rs::degraded, 150}, {rs::serving, 160}, {rs::draining, 170}, {rs::stopped, 180}}) {
    REQUIRE(life.advance(to, at));
  }
  CHECK(life.state() == rs::stopped);
  CHECK(life.entered_at_ns() == 180);
  const auto history = life.history();
  REQUIRE(history.size() == 8);
  CHECK(history.front() == state_change{rs::creating, rs::loading, 110});
  CHECK(history[4] == state_change{rs::serving, rs::degraded, 150});
  CHECK(history.back() == state_change{rs::draining, rs::stopped, 180});
}

TEST_CASE("lifecycle refuses bad moves and backwards time without changing", "[lifecycle]") {
  lifecycle life(0);
  REQUIRE(life.advance(rs::loading, 10));
  const auto skip = life.advance(rs::serving, 20);
  REQUIRE_FALSE(skip);
  CHECK(skip.error().code == errc::invalid_argument);
  const auto backwards = life.advance(rs::warming, 5);
  REQUIRE_FALSE(backwards);
  CHECK(backwards.error().message.find("backwards") != std::string::npos);
  CHECK(life.state() == rs::loading);
  CHECK(life.transitions_total() == 1);
  REQUIRE(life.advance(rs::failed, 30));
  CHECK_FALSE(life.advance(rs::loading, 40));
  CHECK(life.state() == rs::failed);
}

TEST_CASE("lifecycle history keeps only the last 32 moves, oldest first", "[lifecycle]") {
  lifecycle life(0);
  REQUIRE(life.advance(rs::loading, 1));
  REQUIRE(life.advance(rs::warming, 2));
  REQUIRE(life.advance(rs::ready, 3));
  // 100 ready <-> serving flips: far more than the history holds.
  std::uint64_t t = 3;
  for (int i = 0; i < 100; ++i) REQUIRE(life.advance(i % 2 == 0 ? rs::serving : rs::ready, ++t));
  CHECK(life.transitions_total() == 103);
  const auto history = life.history();
  REQUIRE(history.size() == lifecycle::history_max);
  CHECK(history.back().at_ns == t);
  CHECK(history.front().at_ns == t - lifecycle::history_max + 1);
  for (std::size_t i = 1; i < history.size(); ++i) {
    CHECK(history[i].from == history[i - 1].to);
    CHECK(history[i].at_ns == history[i - 1].at_ns + 1);
  }
}
