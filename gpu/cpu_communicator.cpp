#include "gpu/cpu_communicator.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/assert.hpp"

namespace exa::gpu {
namespace {

enum class op : std::uint8_t { barrier, all_reduce_sum, reduce_scatter_sum, all_gather, broadcast };

const char* op_name(op kind) noexcept {
  switch (kind) {
    case op::barrier: return "barrier";
    case op::all_reduce_sum: return "all_reduce_sum";
    case op::reduce_scatter_sum: return "reduce_scatter_sum";
    case op::all_gather: return "all_gather";
    case op::broadcast: return "broadcast";
  }
  return "collective";
}

/// What one member passed to the collective in progress. Written by its member
/// before it arrives, read by every member after "all arrived" (the mutex
/// orders the two).
struct call {
  op kind = op::barrier;
  const float* send = nullptr;
  float* recv = nullptr;
  std::size_t count = 0;
  int root = 0;
};

/// The two barriers of a collective: all members arrived (their calls are
/// published), all members done with every buffer.
enum class stage : std::uint8_t { arrive, finish };

// Floats summed per block: the running sums stay in L1 while every member's
// block is added in; a constant trip count lets the compiler vectorize at -O2.
constexpr std::size_t block_floats = 512;
// A slice of all_reduce_sum is at least this long: shorter ones cost more in
// cache-line traffic between cores than they save.
constexpr std::size_t slice_floats_min = 2048;
// Slice starts are multiples of a cache line of floats, so two members never
// write the same line.
constexpr std::size_t line_floats = 16;
// A waiter polls the barrier this many times (yielding the core between polls)
// before it sleeps on the condition variable: a collective inside a forward
// step usually completes within microseconds.
constexpr int spin_polls = 200;

std::string member_list(std::uint64_t mask) {
  std::string out;
  while (mask != 0) {
    const int r = std::countr_zero(mask);
    mask &= mask - 1;
    if (!out.empty()) out += ", ";
    out += std::to_string(r);
  }
  return out;
}

std::string describe(int rank, const call& c) {
  std::string out = "member " + std::to_string(rank) + " called " + op_name(c.kind);
  if (c.kind != op::barrier) out += " with count " + std::to_string(c.count);
  if (c.kind == op::broadcast) out += " and root " + std::to_string(c.root);
  return out;
}

// acc[0..n) = rows[0][off..off+n) + rows[1][...] + ... in rank order.
template <class Source>
void sum_block(float* acc, std::size_t n, int members, Source&& source) {
  std::memcpy(acc, source(0), n * sizeof(float));
  for (int m = 1; m < members; ++m) {
    const float* src = source(m);
    if (n == block_floats) {
      for (std::size_t i = 0; i < block_floats; ++i) acc[i] += src[i];
    } else {
      for (std::size_t i = 0; i < n; ++i) acc[i] += src[i];
    }
  }
}

class cpu_group {
 public:
  cpu_group(int size, std::chrono::milliseconds timeout)
      : size_(size), timeout_(timeout), calls_(static_cast<std::size_t>(size)),
        all_(size == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << size) - 1) {}

  int size() const noexcept { return size_; }
  bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }

  void abort(const std::string& reason) {
    std::lock_guard lock(mu_);
    abort_locked(reason);
  }

  expected<void> run(int rank, const call& c) {
    if (aborted()) return std::unexpected(failure(c.kind));
    if (auto bad = validate(c)) {
      abort("member " + std::to_string(rank) + " passed an invalid " + op_name(c.kind) + ": " + *bad);
      return make_error(errc::invalid_argument, std::string(op_name(c.kind)) + ": " + *bad);
    }
    calls_[static_cast<std::size_t>(rank)] = c;
    if (auto arrived = sync(rank, c.kind, stage::arrive); !arrived) return arrived;
    if (c.kind == op::barrier) return {};
    work(rank);
    return sync(rank, c.kind, stage::finish);
  }

 private:
  std::optional<std::string> validate(const call& c) const {
    if (c.kind == op::barrier) return std::nullopt;
    // reduce_scatter_sum's send and all_gather's recv hold size() * count floats.
    if (c.count > std::numeric_limits<std::size_t>::max() / sizeof(float) / static_cast<std::size_t>(size_))
      return "count " + std::to_string(c.count) + " is too large";
    if (c.count > 0 && (c.send == nullptr || c.recv == nullptr)) return "null buffer";
    if (c.kind == op::broadcast && (c.root < 0 || c.root >= size_))
      return "root " + std::to_string(c.root) + " outside 0.." + std::to_string(size_ - 1);
    return std::nullopt;
  }

  /// The reason the members' calls cannot be one collective, if any: called
  /// by the last member to arrive, before anyone touches another's buffer.
  std::optional<std::string> mismatch() const {
    const call& first = calls_[0];
    for (int r = 1; r < size_; ++r) {
      const call& c = calls_[static_cast<std::size_t>(r)];
      const bool same = c.kind == first.kind &&
                        (first.kind == op::barrier || c.count == first.count) &&
                        (first.kind != op::broadcast || c.root == first.root);
      if (!same) return "collective mismatch: " + describe(0, first) + ", " + describe(r, c);
    }
    return std::nullopt;
  }

  error failure(op kind) const {
    std::lock_guard lock(mu_);
    return error{errc::unavailable,
                 std::string(op_name(kind)) + ": tensor-parallel group aborted: " + reason_};
  }

  void abort_locked(const std::string& reason) {
    if (aborted_.load(std::memory_order_relaxed)) return;
    reason_ = reason;
    aborted_.store(true, std::memory_order_release);
    cv_.notify_all();
  }

  expected<void> sync(int rank, op kind, stage st);
  expected<void> outcome(op kind) const {
    if (ok_.load(std::memory_order_relaxed)) return {};
    return std::unexpected(failure(kind));
  }
  void work(int rank);
  void all_reduce_slice(int rank, std::size_t count);

  const int size_;
  const std::chrono::milliseconds timeout_;
  std::vector<call> calls_;
  const std::uint64_t all_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t arrived_ = 0;  // members at the current barrier, one bit each
  int sleepers_ = 0;           // waiters blocked on cv_
  std::string reason_;         // why the group aborted; set once
  // Barriers completed. A waiter leaves when it changes; ok_ (stored before it)
  // says whether the barrier completed with the group intact. A new barrier
  // cannot complete before every waiter of the last has left (each must
  // arrive), so ok_ is never overwritten under a waiter that still reads it.
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<bool> ok_{true};
  std::atomic<bool> aborted_{false};
};

expected<void> cpu_group::sync(int rank, op kind, stage st) {
  std::unique_lock lock(mu_);
  // A member that has not yet arrived when the group aborts stays out: no
  // barrier can complete after an abort, so nobody reads its buffers.
  if (st == stage::arrive && aborted_.load(std::memory_order_relaxed))
    return std::unexpected(error{errc::unavailable, std::string(op_name(kind)) +
                                                        ": tensor-parallel group aborted: " + reason_});
  const std::uint64_t gen = generation_.load(std::memory_order_relaxed);
  arrived_ |= std::uint64_t{1} << rank;
  if (arrived_ == all_) {
    arrived_ = 0;
    bool ok = !aborted_.load(std::memory_order_relaxed);
    if (ok && st == stage::arrive) {
      if (auto bad = mismatch()) {
        abort_locked(*bad);
        ok = false;
      }
    }
    ok_.store(ok, std::memory_order_relaxed);
    generation_.store(gen + 1, std::memory_order_release);
    if (sleepers_ > 0) cv_.notify_all();
    lock.unlock();
    return outcome(kind);
  }
  lock.unlock();

  // Arrival waits give up when the group aborts. Finish waits never leave
  // early: every member still working is copying into someone's buffer, which
  // takes bounded time and must end before any of those calls returns.
  const auto done = [&] {
    return generation_.load(std::memory_order_acquire) != gen ||
           (st == stage::arrive && aborted_.load(std::memory_order_acquire));
  };
  for (int poll = 0; poll < spin_polls && !done(); ++poll) std::this_thread::yield();

  lock.lock();
  ++sleepers_;
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (!done()) {
    if (cv_.wait_until(lock, deadline) != std::cv_status::timeout || done()) continue;
    if (!aborted_.load(std::memory_order_relaxed)) {
      const std::uint64_t missing = all_ & ~arrived_;
      abort_locked(std::string(op_name(kind)) + " timed out after " + std::to_string(timeout_.count()) +
                   " ms: member(s) " + member_list(missing) +
                   (st == stage::arrive ? " did not arrive" : " did not finish"));
    }
    if (st == stage::finish) cv_.wait(lock, done);
  }
  --sleepers_;
  const bool completed = generation_.load(std::memory_order_relaxed) != gen;
  lock.unlock();
  if (!completed) return std::unexpected(failure(kind));
  return outcome(kind);
}

void cpu_group::work(int rank) {
  const call& mine = calls_[static_cast<std::size_t>(rank)];
  const std::size_t count = mine.count;
  switch (mine.kind) {
    case op::barrier: return;
    case op::all_reduce_sum: all_reduce_slice(rank, count); return;
    case op::reduce_scatter_sum: {
      alignas(64) float acc[block_floats];
      const std::size_t chunk = static_cast<std::size_t>(rank) * count;
      for (std::size_t off = 0; off < count; off += block_floats) {
        const std::size_t n = std::min(block_floats, count - off);
        sum_block(acc, n, size_, [&](int m) { return calls_[static_cast<std::size_t>(m)].send + chunk + off; });
        std::memcpy(mine.recv + off, acc, n * sizeof(float));
      }
      return;
    }
    case op::all_gather:
      for (int m = 0; m < size_; ++m) {
        const float* src = calls_[static_cast<std::size_t>(m)].send;
        float* dst = mine.recv + static_cast<std::size_t>(m) * count;
        if (src != dst && count > 0) std::memcpy(dst, src, count * sizeof(float));
      }
      return;
    case op::broadcast: {
      const float* src = calls_[static_cast<std::size_t>(mine.root)].recv;
      if (src != mine.recv && count > 0) std::memcpy(mine.recv, src, count * sizeof(float));
      return;
    }
  }
}

/// This member's slice of an all-reduce: summed over all members in rank
/// order, then written into every member's buffer. Slices are disjoint, so no
/// two members touch the same element.
void cpu_group::all_reduce_slice(int rank, std::size_t count) {
  const std::size_t slices =
      std::min<std::size_t>(static_cast<std::size_t>(size_), (count + slice_floats_min - 1) / slice_floats_min);
  const auto r = static_cast<std::size_t>(rank);
  if (r >= slices) return;
  const auto edge = [&](std::size_t s) {
    return s >= slices ? count : std::min(count, count * s / slices / line_floats * line_floats);
  };
  const std::size_t begin = edge(r), end = edge(r + 1);
  alignas(64) float acc[block_floats];
  for (std::size_t off = begin; off < end; off += block_floats) {
    const std::size_t n = std::min(block_floats, end - off);
    sum_block(acc, n, size_, [&](int m) { return calls_[static_cast<std::size_t>(m)].recv + off; });
    for (const call& c : calls_) std::memcpy(c.recv + off, acc, n * sizeof(float));
  }
}

class cpu_communicator final : public engine::communicator {
 public:
  cpu_communicator(std::shared_ptr<cpu_group> group, int rank) : group_(std::move(group)), rank_(rank) {}

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return group_->size(); }

  expected<void> all_reduce_sum(float* data, std::size_t count) override {
    return group_->run(rank_, call{op::all_reduce_sum, data, data, count, 0});
  }
  expected<void> reduce_scatter_sum(const float* send, float* recv, std::size_t count) override {
    return group_->run(rank_, call{op::reduce_scatter_sum, send, recv, count, 0});
  }
  expected<void> all_gather(const float* send, float* recv, std::size_t count) override {
    return group_->run(rank_, call{op::all_gather, send, recv, count, 0});
  }
  expected<void> broadcast(float* data, std::size_t count, int root) override {
    return group_->run(rank_, call{op::broadcast, data, data, count, root});
  }
  expected<void> barrier() override { return group_->run(rank_, call{}); }

  void abort(const std::string& reason) override { group_->abort(reason); }
  bool aborted() const noexcept override { return group_->aborted(); }

 private:
  std::shared_ptr<cpu_group> group_;
  int rank_;
};

}  // namespace

expected<std::vector<std::unique_ptr<engine::communicator>>> make_cpu_group(
    int size, std::chrono::milliseconds timeout) {
  if (size < 1 || size > cpu_group_size_max)
    return make_error(errc::invalid_argument, "communicator group size " + std::to_string(size) +
                                                  " outside 1.." + std::to_string(cpu_group_size_max));
  if (timeout.count() <= 0)
    return make_error(errc::invalid_argument, "communicator timeout must be positive, got " +
                                                  std::to_string(timeout.count()) + " ms");
  auto group = std::make_shared<cpu_group>(size, timeout);
  std::vector<std::unique_ptr<engine::communicator>> members;
  members.reserve(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) members.push_back(std::make_unique<cpu_communicator>(group, r));
  return members;
}

}  // namespace exa::gpu
