// The in-process CPU communicator: each collective against a serial
// reference (sums bitwise, in rank order), determinism under random arrival
// order, and every way a group fails: abort, a member that never arrives,
// members that disagree, bad arguments, calls after the abort.

#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>
#include <string>
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

constexpr auto generous = std::chrono::milliseconds(20000);  // never reached when correct

members_t group(int size, std::chrono::milliseconds timeout = generous) {
  auto made = gpu::make_cpu_group(size, timeout);
  REQUIRE(made.has_value());
  REQUIRE(made->size() == static_cast<std::size_t>(size));
  return std::move(*made);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// ((in[0] + in[1]) + in[2]) + ... element by element.
std::vector<float> rank_order_sum(const std::vector<std::vector<float>>& in, std::size_t offset, std::size_t count) {
  std::vector<float> out(in[0].begin() + static_cast<std::ptrdiff_t>(offset),
                         in[0].begin() + static_cast<std::ptrdiff_t>(offset + count));
  for (std::size_t m = 1; m < in.size(); ++m)
    for (std::size_t i = 0; i < count; ++i) out[i] += in[m][offset + i];
  return out;
}

std::vector<std::vector<float>> inputs(int size, std::size_t n, std::uint64_t seed) {
  std::vector<std::vector<float>> in;
  for (int r = 0; r < size; ++r) in.push_back(spread_values(seed * 131 + static_cast<std::uint64_t>(r), n));
  return in;
}

const std::vector<int> sizes = {1, 2, 3, 4, 8};
// Odd counts, one under a block, several blocks, and long enough for every
// member of 8 to reduce its own slice.
const std::vector<std::size_t> counts = {1, 3, 517, 4099, 40001};

}  // namespace

TEST_CASE("cpu group: all_reduce_sum equals the serial rank-order sum bitwise on every member",
          "[communicator][cpu]") {
  for (int size : sizes) {
    for (std::size_t count : counts) {
      auto members = group(size);
      auto in = inputs(size, count, count);
      const auto expected_sum = rank_order_sum(in, 0, count);
      auto data = in;
      std::vector<expected<void>> results(static_cast<std::size_t>(size));
      on_each_member(size, [&](int r) { results[r] = members[r]->all_reduce_sum(data[r].data(), count); });
      INFO("size " << size << " count " << count);
      for (int r = 0; r < size; ++r) {
        REQUIRE(results[r].has_value());
        CHECK(same_bits(data[r], expected_sum));
      }
      if (size >= 3 && count >= 517) {
        // The data can tell orders apart: summing in reverse rank order
        // rounds differently somewhere, so the bitwise check above has teeth.
        std::vector<std::vector<float>> reversed(in.rbegin(), in.rend());
        CHECK_FALSE(same_bits(rank_order_sum(reversed, 0, count), expected_sum));
      }
    }
  }
}

TEST_CASE("cpu group: reduce_scatter_sum gives member r the rank-order sum of chunk r",
          "[communicator][cpu]") {
  for (int size : sizes) {
    for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{1031}}) {
      auto members = group(size);
      const auto in = inputs(size, count * static_cast<std::size_t>(size), 7 + count);
      std::vector<std::vector<float>> out(static_cast<std::size_t>(size), std::vector<float>(count));
      auto in_place = in;  // NCCL's in-place form: recv = send + rank * count
      std::vector<expected<void>> results(static_cast<std::size_t>(size)), results_in_place(results.size());
      on_each_member(size, [&](int r) {
        results[r] = members[r]->reduce_scatter_sum(in[r].data(), out[r].data(), count);
        results_in_place[r] = members[r]->reduce_scatter_sum(
            in_place[r].data(), in_place[r].data() + static_cast<std::size_t>(r) * count, count);
      });
      INFO("size " << size << " count " << count);
      for (int r = 0; r < size; ++r) {
        REQUIRE(results[r].has_value());
        REQUIRE(results_in_place[r].has_value());
        const auto want = rank_order_sum(in, static_cast<std::size_t>(r) * count, count);
        CHECK(same_bits(out[r], want));
        std::vector<float> got(in_place[r].begin() + static_cast<std::ptrdiff_t>(r * count),
                               in_place[r].begin() + static_cast<std::ptrdiff_t>((r + 1) * count));
        CHECK(same_bits(got, want));
      }
    }
  }
}

TEST_CASE("cpu group: all_gather puts every member's data in rank order, also in place",
          "[communicator][cpu]") {
  for (int size : sizes) {
    for (std::size_t count : {std::size_t{1}, std::size_t{5}, std::size_t{2049}}) {
      auto members = group(size);
      const auto in = inputs(size, count, 3 + count);
      std::vector<float> want;
      for (const auto& v : in) want.insert(want.end(), v.begin(), v.end());
      const std::size_t total = count * static_cast<std::size_t>(size);
      std::vector<std::vector<float>> out(static_cast<std::size_t>(size), std::vector<float>(total));
      std::vector<std::vector<float>> in_place(static_cast<std::size_t>(size), std::vector<float>(total));
      for (int r = 0; r < size; ++r)
        std::copy(in[r].begin(), in[r].end(), in_place[r].begin() + static_cast<std::ptrdiff_t>(r * count));
      std::vector<expected<void>> results(static_cast<std::size_t>(size)), results_in_place(results.size());
      on_each_member(size, [&](int r) {
        results[r] = members[r]->all_gather(in[r].data(), out[r].data(), count);
        results_in_place[r] = members[r]->all_gather(in_place[r].data() + static_cast<std::size_t>(r) * count,
                                                     in_place[r].data(), count);
      });
      for (int r = 0; r < size; ++r) {
        REQUIRE(results[r].has_value());
        REQUIRE(results_in_place[r].has_value());
        CHECK(same_bits(out[r], want));
        CHECK(same_bits(in_place[r], want));
      }
    }
  }
}

TEST_CASE("cpu group: broadcast copies the root's data to every member", "[communicator][cpu]") {
  for (int size : sizes) {
    for (int root = 0; root < size; ++root) {
      auto members = group(size);
      auto data = inputs(size, 333, static_cast<std::uint64_t>(root) + 11);
      const auto want = data[static_cast<std::size_t>(root)];
      std::vector<expected<void>> results(static_cast<std::size_t>(size));
      on_each_member(size, [&](int r) { results[r] = members[r]->broadcast(data[r].data(), 333, root); });
      for (int r = 0; r < size; ++r) {
        REQUIRE(results[r].has_value());
        CHECK(same_bits(data[r], want));
      }
    }
  }
}

TEST_CASE("cpu group: nobody leaves a barrier before everyone arrived", "[communicator][cpu]") {
  for (int size : sizes) {
    auto members = group(size);
    constexpr int rounds = 50;
    std::vector<std::atomic<int>> arrived(rounds);
    std::vector<std::vector<int>> seen(static_cast<std::size_t>(size), std::vector<int>(rounds, -1));
    std::vector<int> failures(static_cast<std::size_t>(size), 0);
    on_each_member(size, [&](int r) {
      splitmix64_stream rng(static_cast<std::uint64_t>(r) + 1);
      for (int k = 0; k < rounds; ++k) {
        jitter(rng, 50);
        arrived[k].fetch_add(1);
        if (!members[r]->barrier()) ++failures[r];
        seen[r][k] = arrived[k].load();
      }
    });
    for (int r = 0; r < size; ++r) {
      CHECK(failures[r] == 0);
      for (int k = 0; k < rounds; ++k) CHECK(seen[r][k] == size);
    }
  }
}

TEST_CASE("cpu group: results are bitwise the same from run to run whatever order members arrive in",
          "[communicator][cpu][determinism]") {
  for (int size : {2, 3, 4, 8}) {
    const std::size_t count = 6007;
    const auto in = inputs(size, count * static_cast<std::size_t>(size), 99);
    std::vector<std::vector<float>> first;
    for (std::uint64_t run = 0; run < 12; ++run) {
      auto members = group(size);
      // A mixed sequence, so slots and generations are reused across calls.
      std::vector<std::vector<float>> reduced(static_cast<std::size_t>(size));
      std::vector<int> failures(static_cast<std::size_t>(size), 0);
      on_each_member(size, [&](int r) {
        splitmix64_stream rng(run * 1000 + static_cast<std::uint64_t>(r));
        std::vector<float> data(in[r].begin(), in[r].begin() + static_cast<std::ptrdiff_t>(count));
        std::vector<float> scattered(count), gathered(count * static_cast<std::size_t>(size));
        for (int step = 0; step < 4; ++step) {
          jitter(rng, 200);
          if (!members[r]->all_reduce_sum(data.data(), count)) ++failures[r];
          jitter(rng, 200);
          if (!members[r]->reduce_scatter_sum(in[r].data(), scattered.data(), count)) ++failures[r];
          jitter(rng, 200);
          if (!members[r]->all_gather(scattered.data(), gathered.data(), count)) ++failures[r];
          for (std::size_t i = 0; i < count; ++i) data[i] = data[i] * 0.25f + gathered[i * 3 % gathered.size()];
        }
        reduced[r] = data;
      });
      for (int r = 0; r < size; ++r) REQUIRE(failures[r] == 0);
      for (int r = 1; r < size; ++r) CHECK(same_bits(reduced[r], reduced[0]));
      if (run == 0) first = reduced;
      else for (int r = 0; r < size; ++r) CHECK(same_bits(reduced[r], first[r]));
    }
  }
}

TEST_CASE("cpu group: abort from one member wakes every waiter with the reason at once",
          "[communicator][cpu][failure]") {
  constexpr int size = 4;
  auto members = group(size, std::chrono::milliseconds(20000));
  std::vector<std::vector<float>> data(size, std::vector<float>(100, 1.0f));
  std::vector<expected<void>> results(size);
  std::atomic<int> started{0};
  const auto start = std::chrono::steady_clock::now();
  on_each_member(size, [&](int r) {
    if (r == 3) {
      // The others are in (or about to enter) the collective; either way they
      // must fail, by waking up or at the door.
      while (started.load() < 3) std::this_thread::yield();
      for (int i = 0; i < 1000; ++i) std::this_thread::yield();
      members[r]->abort("device 3 fault: injected");
      results[r] = members[r]->all_reduce_sum(data[r].data(), 100);
      return;
    }
    started.fetch_add(1);
    results[r] = members[r]->all_reduce_sum(data[r].data(), 100);
  });
  CHECK(seconds_since(start) < 5.0);  // the group's timeout is 20 s
  for (int r = 0; r < size; ++r) {
    REQUIRE_FALSE(results[r].has_value());
    CHECK(results[r].error().code == errc::unavailable);
    CHECK_THAT(results[r].error().message, Catch::Contains("device 3 fault: injected"));
    CHECK(members[r]->aborted());
  }
  // Later calls fail at the door, with the first reason.
  members[0]->abort("a second reason");
  const auto later = std::chrono::steady_clock::now();
  auto again = members[1]->barrier();
  auto gather = members[2]->all_gather(data[2].data(), data[3].data(), 10);
  CHECK(seconds_since(later) < 1.0);
  REQUIRE_FALSE(again.has_value());
  REQUIRE_FALSE(gather.has_value());
  CHECK(again.error().code == errc::unavailable);
  CHECK_THAT(again.error().message, Catch::Contains("device 3 fault"));
  CHECK_THAT(gather.error().message, Catch::Contains("device 3 fault"));
}

TEST_CASE("cpu group: a member that never arrives times the group out, named in the reason",
          "[communicator][cpu][failure]") {
  constexpr int size = 4;
  auto members = group(size, std::chrono::milliseconds(200));
  std::vector<std::vector<float>> data(size, std::vector<float>(10, 1.0f));
  std::vector<expected<void>> results(size);
  const auto start = std::chrono::steady_clock::now();
  on_each_member(size, [&](int r) {
    if (r == 2) return;  // the member whose process died
    results[r] = members[r]->all_reduce_sum(data[r].data(), 10);
  });
  const double elapsed = seconds_since(start);
  CHECK(elapsed >= 0.2);
  CHECK(elapsed < 5.0);
  for (int r : {0, 1, 3}) {
    REQUIRE_FALSE(results[r].has_value());
    CHECK(results[r].error().code == errc::unavailable);
    CHECK_THAT(results[r].error().message, Catch::Contains("all_reduce_sum timed out after 200 ms"));
    CHECK_THAT(results[r].error().message, Catch::Contains("member(s) 2 did not arrive"));
  }
  CHECK(members[2]->aborted());
  auto late = members[2]->all_reduce_sum(data[2].data(), 10);
  REQUIRE_FALSE(late.has_value());
  CHECK_THAT(late.error().message, Catch::Contains("member(s) 2 did not arrive"));
}

TEST_CASE("cpu group: members that disagree abort the group instead of reading out of bounds",
          "[communicator][cpu][failure]") {
  SECTION("different counts") {
    constexpr int size = 3;
    auto members = group(size);
    std::vector<std::vector<float>> data(size, std::vector<float>(7, 1.0f));
    std::vector<expected<void>> results(size);
    on_each_member(size, [&](int r) { results[r] = members[r]->all_reduce_sum(data[r].data(), r == 1 ? 5 : 7); });
    for (int r = 0; r < size; ++r) {
      REQUIRE_FALSE(results[r].has_value());
      CHECK(results[r].error().code == errc::unavailable);
      CHECK_THAT(results[r].error().message, Catch::Contains("collective mismatch"));
      CHECK_THAT(results[r].error().message, Catch::Contains("member 1 called all_reduce_sum with count 5"));
      CHECK(data[r] == std::vector<float>(7, 1.0f));  // nothing was written
    }
  }
  SECTION("different collectives") {
    constexpr int size = 3;
    auto members = group(size);
    std::vector<std::vector<float>> data(size, std::vector<float>(7, 1.0f));
    std::vector<expected<void>> results(size);
    on_each_member(size, [&](int r) {
      results[r] = r == 2 ? members[r]->barrier() : members[r]->all_reduce_sum(data[r].data(), 7);
    });
    for (int r = 0; r < size; ++r) {
      REQUIRE_FALSE(results[r].has_value());
      CHECK_THAT(results[r].error().message, Catch::Contains("member 2 called barrier"));
    }
  }
  SECTION("different broadcast roots") {
    constexpr int size = 2;
    auto members = group(size);
    std::vector<std::vector<float>> data(size, std::vector<float>(3, 1.0f));
    std::vector<expected<void>> results(size);
    on_each_member(size, [&](int r) { results[r] = members[r]->broadcast(data[r].data(), 3, r); });
    for (int r = 0; r < size; ++r) {
      REQUIRE_FALSE(results[r].has_value());
      CHECK_THAT(results[r].error().message, Catch::Contains("root 1"));
    }
  }
}

TEST_CASE("cpu group: an invalid argument fails its caller and aborts the others", "[communicator][cpu][failure]") {
  constexpr int size = 3;
  auto members = group(size);
  std::vector<std::vector<float>> data(size, std::vector<float>(4, 1.0f));
  std::vector<expected<void>> results(size);
  on_each_member(size, [&](int r) { results[r] = members[r]->broadcast(data[r].data(), 4, r == 0 ? 3 : 0); });
  REQUIRE_FALSE(results[0].has_value());
  CHECK(results[0].error().code == errc::invalid_argument);
  CHECK_THAT(results[0].error().message, Catch::Contains("root 3 outside 0..2"));
  for (int r : {1, 2}) {
    REQUIRE_FALSE(results[r].has_value());
    CHECK(results[r].error().code == errc::unavailable);
    CHECK_THAT(results[r].error().message, Catch::Contains("member 0 passed an invalid broadcast"));
  }
}

TEST_CASE("cpu group: sizes and timeouts out of range are refused", "[communicator][cpu]") {
  for (int size : {0, -1, 65}) {
    auto made = gpu::make_cpu_group(size, std::chrono::milliseconds(100));
    REQUIRE_FALSE(made.has_value());
    CHECK(made.error().code == errc::invalid_argument);
    CHECK_THAT(made.error().message, Catch::Contains("outside 1..64"));
  }
  auto no_timeout = gpu::make_cpu_group(2, std::chrono::milliseconds(0));
  REQUIRE_FALSE(no_timeout.has_value());
  CHECK(no_timeout.error().code == errc::invalid_argument);
  auto biggest = gpu::make_cpu_group(64, std::chrono::milliseconds(100));
  REQUIRE(biggest.has_value());
  CHECK((*biggest)[63]->rank() == 63);
  CHECK((*biggest)[63]->size() == 64);
}

TEST_CASE("cpu group: a group of 64 completes an all-reduce (every arrival bit used)", "[communicator][cpu]") {
  auto members = group(64);
  auto in = inputs(64, 129, 5);
  const auto want = rank_order_sum(in, 0, 129);
  std::vector<int> failures(64, 0);
  on_each_member(64, [&](int r) {
    if (!members[r]->all_reduce_sum(in[r].data(), 129)) ++failures[r];
  });
  for (int r = 0; r < 64; ++r) {
    CHECK(failures[r] == 0);
    CHECK(same_bits(in[r], want));
  }
}

TEST_CASE("cpu group: empty collectives still meet (null buffers allowed with count 0)", "[communicator][cpu]") {
  auto members = group(3);
  std::vector<int> failures(3, 0);
  on_each_member(3, [&](int r) {
    for (int k = 0; k < 10; ++k) {
      if (!members[r]->all_reduce_sum(nullptr, 0)) ++failures[r];
      if (!members[r]->reduce_scatter_sum(nullptr, nullptr, 0)) ++failures[r];
      if (!members[r]->all_gather(nullptr, nullptr, 0)) ++failures[r];
      if (!members[r]->broadcast(nullptr, 0, 2)) ++failures[r];
    }
  });
  for (int r = 0; r < 3; ++r) CHECK(failures[r] == 0);
  auto one_missing_buffer = gpu::make_cpu_group(1, generous);
  REQUIRE(one_missing_buffer.has_value());
  auto bad = (*one_missing_buffer)[0]->all_reduce_sum(nullptr, 4);
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().code == errc::invalid_argument);
  CHECK_THAT(bad.error().message, Catch::Contains("null buffer"));
}
