#include "engine/thread_pool.hpp"

#include <algorithm>
#include <chrono>

#include "common/assert.hpp"

namespace exa::engine {
namespace {

// How long an idle worker polls before it blocks. Long enough to bridge the
// gap between consecutive parallel sections of one step, short enough not to
// burn a core between steps.
constexpr auto spin_budget = std::chrono::microseconds(200);

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

thread_pool::thread_pool(std::size_t threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  workers_.reserve(threads - 1);
  for (std::size_t i = 0; i + 1 < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

thread_pool::~thread_pool() {
  {
    std::lock_guard lock(mutex_);
    stopping_.store(true);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void thread_pool::run_chunks() {
  for (;;) {
    const std::size_t begin = next_.fetch_add(job_chunk_, std::memory_order_relaxed);
    if (begin >= job_n_) return;
    (*job_)(begin, std::min(job_n_, begin + job_chunk_));
  }
}

void thread_pool::worker_loop() {
  std::uint64_t seen = 0;
  for (;;) {
    // Spin first, then sleep until a new generation (or shutdown) arrives.
    const auto spin_until = std::chrono::steady_clock::now() + spin_budget;
    std::uint32_t polls = 0;
    while (generation_.load(std::memory_order_acquire) == seen && !stopping_.load()) {
      cpu_relax();
      if ((++polls & 63u) == 0 && std::chrono::steady_clock::now() > spin_until) {
        std::unique_lock lock(mutex_);
        ++sleepers_;
        wake_.wait(lock, [&] {
          return stopping_.load() || generation_.load(std::memory_order_acquire) != seen;
        });
        --sleepers_;
        break;
      }
    }
    if (stopping_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    run_chunks();
    if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard lock(mutex_);
      done_.notify_one();
    }
  }
}

void thread_pool::parallel_for(std::size_t n, std::size_t grain,
                               const std::function<void(std::size_t, std::size_t)>& fn,
                               std::size_t chunks_per_thread) {
  if (n == 0) return;
  grain = std::max<std::size_t>(grain, 1);
  // A few chunks per thread balance uneven work without much contention.
  const std::size_t target_chunks = size() * std::max<std::size_t>(chunks_per_thread, 1);
  const std::size_t chunk = std::max(grain, (n + target_chunks - 1) / target_chunks);
  if (workers_.empty() || n <= chunk) {
    fn(0, n);
    return;
  }
  EXA_ASSERT_MSG(active_.load() == 0, "thread_pool::parallel_for is not reentrant");
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  next_.store(0, std::memory_order_relaxed);
  active_.store(workers_.size(), std::memory_order_relaxed);
  {
    std::lock_guard lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);
    if (sleepers_ > 0) wake_.notify_all();
  }
  run_chunks();
  // Workers finish their last chunk within microseconds; poll, then block.
  for (std::uint32_t polls = 0; active_.load(std::memory_order_acquire) != 0; ++polls) {
    if (polls < 4096) {
      cpu_relax();
      continue;
    }
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return active_.load(std::memory_order_acquire) == 0; });
  }
  job_ = nullptr;
}

}  // namespace exa::engine
