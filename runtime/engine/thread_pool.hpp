#pragma once
// A fixed pool of worker threads for data-parallel engine work. The calling
// thread takes part, so a pool of N threads has N - 1 workers. Work is split
// into contiguous ranges by index; the split never changes the arithmetic of
// any single output element, so results do not depend on the thread count.
//
// A decode step issues a few hundred short parallel sections, so waking
// workers through a condition variable alone would dominate small models:
// workers spin briefly on an atomic generation counter before they sleep.

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace exa::engine {

class thread_pool {
 public:
  /// `threads` == 0 means every core (std::thread::hardware_concurrency()).
  explicit thread_pool(std::size_t threads = 0);
  ~thread_pool();
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  std::size_t size() const noexcept { return workers_.size() + 1; }

  /// Calls fn(begin, end) on disjoint ranges covering [0, n), in chunks of at
  /// least `grain` indices, about `chunks_per_thread` of them per thread
  /// (threads take the next chunk as they finish one, so more chunks even out
  /// uneven work and uneven cores at the cost of more hand-offs), and returns
  /// when all are done. Not reentrant.
  void parallel_for(std::size_t n, std::size_t grain,
                    const std::function<void(std::size_t, std::size_t)>& fn, std::size_t chunks_per_thread = 4);

 private:
  void worker_loop();
  void run_chunks();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::atomic<std::uint64_t> generation_{0};  // bumped once per parallel_for
  std::atomic<std::size_t> active_{0};        // workers still inside the job
  std::atomic<bool> stopping_{false};
  std::size_t sleepers_ = 0;  // guarded by mutex_

  // The current job; written before generation_ is bumped (release).
  const std::function<void(std::size_t, std::size_t)>* job_ = nullptr;
  std::size_t job_n_ = 0;
  std::size_t job_chunk_ = 1;
  std::atomic<std::size_t> next_{0};
};

}  // namespace exa::engine
