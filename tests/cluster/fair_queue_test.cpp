// The fair order of waiting requests: a flooding tenant gets no more than its
// share while another waits, weights divide the service, idleness banks no
// credit, interactive goes before batch, and the queue is bounded.

#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "cluster/fair_queue.hpp"

using namespace exa;
using namespace exa::cluster;

namespace {

// Serves n requests; how many each tenant got.
std::map<std::string, int> serve(fair_queue& q, const std::map<std::uint64_t, std::string>& owner, int n) {
  std::map<std::string, int> got;
  for (int i = 0; i < n && !q.empty(); ++i) {
    ++got[owner.at(*q.peek())];
    q.pop();
  }
  return got;
}

}  // namespace

TEST_CASE("a flooding tenant is served its share, not its backlog", "[fair_queue]") {
  fair_queue q;
  std::map<std::uint64_t, std::string> owner;
  std::uint64_t id = 0;
  // A floods with 100 requests before B's 10 arrive; all cost the same.
  for (int i = 0; i < 100; ++i) {
    REQUIRE(q.push(++id, "a", priority_class::interactive, 100));
    owner[id] = "a";
  }
  for (int i = 0; i < 10; ++i) {
    REQUIRE(q.push(++id, "b", priority_class::interactive, 100));
    owner[id] = "b";
  }
  // FIFO would serve 100 of A first; fair order alternates.
  const auto got = serve(q, owner, 20);
  CHECK(got.at("a") == 10);
  CHECK(got.at("b") == 10);
  CHECK(q.waiting("b") == 0);
  CHECK(q.waiting("a") == 90);
}

TEST_CASE("weights divide the service and the charge is in tokens", "[fair_queue]") {
  fair_queue q;
  std::map<std::uint64_t, std::string> owner;
  std::uint64_t id = 0;
  for (int i = 0; i < 300; ++i) {
    REQUIRE(q.push(++id, "heavy", priority_class::interactive, 10, 3.0));
    owner[id] = "heavy";
    REQUIRE(q.push(++id, "light", priority_class::interactive, 10, 1.0));
    owner[id] = "light";
  }
  auto got = serve(q, owner, 400);
  CHECK(got.at("heavy") == 300);
  CHECK(got.at("light") == 100);
  // Tokens, not requests: a tenant of long requests gets fewer of them.
  fair_queue t;
  owner.clear();
  for (int i = 0; i < 100; ++i) {
    REQUIRE(t.push(++id, "long", priority_class::interactive, 1000));
    owner[id] = "long";
    REQUIRE(t.push(++id, "short", priority_class::interactive, 100));
    owner[id] = "short";
  }
  got = serve(t, owner, 55);
  CHECK(got.at("long") == 5);
  CHECK(got.at("short") == 50);
}

TEST_CASE("a tenant back from idle banks no credit", "[fair_queue]") {
  fair_queue q;
  std::map<std::uint64_t, std::string> owner;
  std::uint64_t id = 0;
  for (int i = 0; i < 50; ++i) {
    REQUIRE(q.push(++id, "a", priority_class::interactive, 10));
    owner[id] = "a";
  }
  serve(q, owner, 40);  // A alone: counter 400
  CHECK(q.counter("a") == 400);
  // B arrives now: lifted to A's counter, so the two alternate from here
  // instead of B taking 40 turns in a row.
  for (int i = 0; i < 20; ++i) {
    REQUIRE(q.push(++id, "b", priority_class::interactive, 10));
    owner[id] = "b";
  }
  CHECK(q.counter("b") == 400);
  const auto got = serve(q, owner, 10);
  CHECK(got.at("a") == 5);
  CHECK(got.at("b") == 5);
}

TEST_CASE("interactive requests go before batch ones", "[fair_queue]") {
  fair_queue q;
  REQUIRE(q.push(1, "a", priority_class::batch, 10));
  REQUIRE(q.push(2, "b", priority_class::batch, 10));
  REQUIRE(q.push(3, "a", priority_class::interactive, 10));
  CHECK(*q.peek() == 3);
  q.pop();
  CHECK(*q.peek() == 2);  // b has the smaller counter now
  q.pop();
  CHECK(*q.peek() == 1);
  q.pop();
  CHECK_FALSE(q.peek());
  CHECK(to_string(priority_class::batch) == "batch");
  CHECK(parse_priority_class("interactive").value() == priority_class::interactive);
  CHECK_THAT(parse_priority_class("urgent").error().message, Catch::Contains("\"urgent\""));
}

TEST_CASE("the queue is bounded, and removed requests are not charged", "[fair_queue]") {
  fair_queue per_tenant({10, 2});
  REQUIRE(per_tenant.push(1, "flood", priority_class::interactive, 10));
  REQUIRE(per_tenant.push(2, "flood", priority_class::interactive, 10));
  CHECK_THAT(per_tenant.push(3, "flood", priority_class::interactive, 10).error().message,
             Catch::Contains("tenant 'flood' already has 2 requests waiting"));
  CHECK(per_tenant.push(4, "quiet", priority_class::interactive, 10));  // others still find room
  fair_queue q({3, 3});
  REQUIRE(q.push(1, "a", priority_class::interactive, 10));
  REQUIRE(q.push(2, "a", priority_class::interactive, 10));
  CHECK(q.push(2, "b", priority_class::interactive, 10).error().code == errc::invalid_argument);
  CHECK(q.push(9, "b", priority_class::interactive, 10, 0).error().code == errc::invalid_argument);
  REQUIRE(q.push(3, "b", priority_class::interactive, 10));
  const auto full = q.push(4, "b", priority_class::interactive, 10);
  REQUIRE_FALSE(full);
  CHECK(full.error().code == errc::overloaded);
  CHECK(q.remove(1));
  CHECK_FALSE(q.remove(1));
  CHECK(q.size() == 2);
  CHECK(q.counter("a") == 0);
  CHECK(*q.peek() == 2);
}

TEST_CASE("a tenant that may not be served now does not hold up the others", "[fair_queue]") {
  fair_queue q;
  REQUIRE(q.push(1, "flood", priority_class::interactive, 10));
  REQUIRE(q.push(2, "quiet", priority_class::interactive, 10));
  q.pop();  // flood served once: quiet is next by counter
  REQUIRE(q.push(3, "flood", priority_class::interactive, 10));
  CHECK(*q.peek() == 2);
  const auto not_quiet = [](std::string_view t) { return t != "quiet"; };
  CHECK(*q.peek_if(not_quiet) == 3);
  CHECK(q.pop(3));
  CHECK_FALSE(q.pop(3));
  CHECK(q.counter("flood") == 20);  // charged as a pop
  CHECK_FALSE(q.peek_if([](std::string_view) { return false; }));
}

TEST_CASE("a tenant's share of the places leaves headroom for the others", "[fair_queue]") {
  CHECK(tenant_slot_limit(32, 0, 4) == 32);  // alone: everything
  CHECK(tenant_slot_limit(32, 1, 4) == 28);  // one other tenant: 4 places stay free for it
  CHECK(tenant_slot_limit(32, 3, 4) == 20);
  CHECK(tenant_slot_limit(8, 3, 4) == 2);    // never below the fair share (8 / 4)
  CHECK(tenant_slot_limit(3, 1, 4) == 2);    // rounded up
  CHECK(tenant_slot_limit(0, 1, 4) == 0);
}
