// The hierarchical communicator over simulated nodes: its all-reduce is the
// fixed "within each node, then across nodes" order (bitwise), within a stated
// bound of the flat rank-order sum, bitwise the same from run to run; its other
// collectives are exact; a failure anywhere reaches every member.

#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "gpu/communicator.hpp"
#include "group_runner.hpp"

using namespace exa;
using exa::test::jitter;
using exa::test::on_each_member;
using exa::test::seconds_since;
using exa::test::spread_values;

namespace {

using members_t = std::vector<std::unique_ptr<gpu::communicator>>;

struct shape {
  int nodes;
  int per_node;
  int size() const { return nodes * per_node; }
};

// The shapes the issue names, and the degenerate ones (one node, one rank per node).
const std::vector<shape> shapes = {{2, 2}, {2, 4}, {4, 2}, {3, 2}, {1, 3}, {3, 1}};

members_t hierarchical(shape s, std::chrono::milliseconds timeout = std::chrono::milliseconds(20000)) {
  auto made = gpu::make_cpu_hierarchical_group(s.nodes, s.per_node, timeout);
  REQUIRE(made.has_value());
  REQUIRE(made->size() == static_cast<std::size_t>(s.size()));
  return std::move(*made);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<std::vector<float>> inputs(int size, std::size_t n, std::uint64_t seed) {
  std::vector<std::vector<float>> in;
  for (int r = 0; r < size; ++r) in.push_back(spread_values(seed * 977 + static_cast<std::uint64_t>(r), n));
  return in;
}

/// The hierarchical order: each node's members in local order, then the node
/// sums in node order. `chunk_of(m)` picks member m's values.
template <class Values>
float two_level_sum(shape s, Values&& value_of) {
  float total = 0.0f;
  for (int n = 0; n < s.nodes; ++n) {
    float node = value_of(n * s.per_node);
    for (int l = 1; l < s.per_node; ++l) node += value_of(n * s.per_node + l);
    total = n == 0 ? node : total + node;
  }
  return total;
}

}  // namespace

TEST_CASE("hierarchical all_reduce_sum: the two-level order bitwise, within the bound of the flat sum",
          "[communicator][hierarchical]") {
  constexpr double unit_roundoff = 0x1.0p-24;
  for (shape s : shapes) {
    for (std::size_t count : {std::size_t{1}, std::size_t{5}, std::size_t{1001}, std::size_t{4097}}) {
      INFO("nodes " << s.nodes << " x " << s.per_node << " count " << count);
      auto members = hierarchical(s);
      const int size = s.size();
      const auto in = inputs(size, count, count + 1);
      auto data = in;
      std::vector<expected<void>> results(static_cast<std::size_t>(size));
      on_each_member(size, [&](int r) { results[r] = members[r]->all_reduce_sum(data[r].data(), count); });
      for (int r = 0; r < size; ++r) {
        REQUIRE(results[r].has_value());
        CHECK(members[r]->rank() == r);
        CHECK(same_bits(data[r], data[0]));  // every member has the same bits
      }
      double worst = 0.0;
      for (std::size_t i = 0; i < count; ++i) {
        const float want = two_level_sum(s, [&](int m) { return in[m][i]; });
        REQUIRE(std::memcmp(&want, &data[0][i], sizeof(float)) == 0);
        float flat = in[0][i];
        double magnitude = std::fabs(in[0][i]);
        for (int m = 1; m < size; ++m) {
          flat += in[m][i];
          magnitude += std::fabs(in[m][i]);
        }
        // Both orders are within (size-1)·u·Σ|x| of the exact sum.
        const double bound = 2.0 * (size - 1) * unit_roundoff * magnitude;
        const double diff = std::fabs(static_cast<double>(data[0][i]) - flat);
        CHECK(diff <= bound);
        worst = std::max(worst, diff / std::max(bound, 1e-30));
      }
      CHECK(worst <= 1.0);
    }
  }
}

TEST_CASE("hierarchical all_reduce_sum: bitwise the same from run to run with random arrival order",
          "[communicator][hierarchical][determinism]") {
  for (shape s : {shape{2, 2}, shape{2, 4}, shape{4, 2}, shape{3, 2}}) {
    const int size = s.size();
    const std::size_t count = 3001;  // not a multiple of any ranks-per-node: padded
    const auto in = inputs(size, count, 42);
    std::vector<std::vector<float>> first;
    for (std::uint64_t run = 0; run < 8; ++run) {
      auto members = hierarchical(s);
      auto data = in;
      std::vector<int> failures(static_cast<std::size_t>(size), 0);
      on_each_member(size, [&](int r) {
        splitmix64_stream rng(run * 7919 + static_cast<std::uint64_t>(r));
        for (int step = 0; step < 3; ++step) {
          jitter(rng, 300);
          if (!members[r]->all_reduce_sum(data[r].data(), count)) ++failures[r];
          for (auto& v : data[r]) v *= 0.125f;
        }
      });
      for (int r = 0; r < size; ++r) REQUIRE(failures[r] == 0);
      for (int r = 1; r < size; ++r) CHECK(same_bits(data[r], data[0]));
      if (run == 0) first = data;
      else for (int r = 0; r < size; ++r) CHECK(same_bits(data[r], first[r]));
    }
  }
}

TEST_CASE("hierarchical reduce_scatter_sum, all_gather, broadcast and barrier are correct",
          "[communicator][hierarchical]") {
  for (shape s : shapes) {
    INFO("nodes " << s.nodes << " x " << s.per_node);
    const int size = s.size();
    const std::size_t count = 37;
    const auto total = count * static_cast<std::size_t>(size);
    const auto in = inputs(size, total, 9);
    auto members = hierarchical(s);
    std::vector<std::vector<float>> scattered(static_cast<std::size_t>(size), std::vector<float>(count));
    std::vector<std::vector<float>> gathered(static_cast<std::size_t>(size), std::vector<float>(total));
    std::vector<std::vector<float>> broadcast(in);
    const int root = size - 1;
    std::vector<int> failures(static_cast<std::size_t>(size), 0);
    std::atomic<int> arrived{0};
    std::vector<int> seen(static_cast<std::size_t>(size), 0);
    on_each_member(size, [&](int r) {
      if (!members[r]->reduce_scatter_sum(in[r].data(), scattered[r].data(), count)) ++failures[r];
      if (!members[r]->all_gather(in[r].data(), gathered[r].data(), count)) ++failures[r];
      if (!members[r]->broadcast(broadcast[r].data(), total, root)) ++failures[r];
      splitmix64_stream rng(static_cast<std::uint64_t>(r));
      jitter(rng, 500);
      arrived.fetch_add(1);
      if (!members[r]->barrier()) ++failures[r];
      seen[r] = arrived.load();
    });
    std::vector<float> all_first;
    for (int m = 0; m < size; ++m) all_first.insert(all_first.end(), in[m].begin(), in[m].begin() + count);
    for (int r = 0; r < size; ++r) {
      REQUIRE(failures[r] == 0);
      for (std::size_t i = 0; i < count; ++i) {
        const float want = two_level_sum(s, [&](int m) { return in[m][r * count + i]; });
        CHECK(std::memcmp(&want, &scattered[r][i], sizeof(float)) == 0);
      }
      CHECK(same_bits(gathered[r], all_first));
      CHECK(same_bits(broadcast[r], in[root]));
      CHECK(seen[r] == size);
    }
  }
}

TEST_CASE("hierarchical group: one member's abort reaches every member promptly",
          "[communicator][hierarchical][failure]") {
  const shape s{2, 2};
  auto members = hierarchical(s, std::chrono::milliseconds(20000));
  std::vector<std::vector<float>> data(4, std::vector<float>(64, 1.0f));
  std::vector<expected<void>> results(4);
  std::atomic<int> started{0};
  const auto start = std::chrono::steady_clock::now();
  on_each_member(4, [&](int r) {
    if (r == 0) {
      while (started.load() < 3) std::this_thread::yield();
      for (int i = 0; i < 1000; ++i) std::this_thread::yield();
      members[r]->abort("node 0 gpu 0 fault: injected");
      results[r] = members[r]->all_reduce_sum(data[r].data(), 64);
      return;
    }
    started.fetch_add(1);
    results[r] = members[r]->all_reduce_sum(data[r].data(), 64);
  });
  CHECK(seconds_since(start) < 5.0);  // the sub-groups' timeout is 20 s
  for (int r = 0; r < 4; ++r) {
    INFO("member " << r);
    REQUIRE_FALSE(results[r].has_value());
    CHECK(results[r].error().code == errc::unavailable);
    CHECK_THAT(results[r].error().message, Catch::Contains("node 0 gpu 0 fault: injected"));
    CHECK(members[r]->aborted());
  }
}

TEST_CASE("hierarchical group: a member that never arrives fails every other member within the timeouts",
          "[communicator][hierarchical][failure]") {
  const shape s{2, 2};
  auto members = hierarchical(s, std::chrono::milliseconds(200));
  std::vector<std::vector<float>> data(4, std::vector<float>(9, 1.0f));
  std::vector<expected<void>> results(4);
  const auto start = std::chrono::steady_clock::now();
  on_each_member(4, [&](int r) {
    if (r == 3) return;  // node 1, local rank 1: gone
    results[r] = members[r]->all_reduce_sum(data[r].data(), 9);
  });
  CHECK(seconds_since(start) < 5.0);
  for (int r : {0, 1, 2}) {
    INFO("member " << r);
    REQUIRE_FALSE(results[r].has_value());
    CHECK(results[r].error().code == errc::unavailable);
    CHECK_THAT(results[r].error().message, Catch::Contains("timed out after 200 ms"));
    CHECK_THAT(results[r].error().message, Catch::Contains("member(s) 1 did not arrive"));
  }
}

TEST_CASE("hierarchical group: shapes out of range are refused", "[communicator][hierarchical]") {
  for (auto [nodes, per_node] : {std::pair{0, 2}, std::pair{2, 0}, std::pair{65, 1}, std::pair{1, 65}}) {
    auto made = gpu::make_cpu_hierarchical_group(nodes, per_node, std::chrono::milliseconds(100));
    REQUIRE_FALSE(made.has_value());
    CHECK(made.error().code == errc::invalid_argument);
  }
}
