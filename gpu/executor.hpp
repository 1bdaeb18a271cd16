#pragma once
// Where a device runs engine work: off CAF's scheduler, one task at a time in
// submission order, each task's end reported through a callback (which the
// device actor turns into a message to itself). Three executors:
//   - inline_executor: the task runs inside submit() on the caller's thread
//     and its completion is delivered before submit() returns. Under CAF's
//     test scheduler this keeps actor tests deterministic in virtual time.
//   - thread_executor: one worker thread per device (the CPU device's; the
//     CUDA device's host thread, which enqueues work on its stream and hands
//     completion to the stream through `finish`).
// A completion callback must be cheap and must not block: it hands the
// outcome on (a message) and returns.

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/error.hpp"

namespace exa::gpu {

/// How a task ended.
struct task_outcome {
  /// Wall time from the task's start until it completed (CUDA: until its
  /// stream had run everything the task enqueued).
  double seconds = 0;
  /// Why it failed: the task threw, the device faulted, the executor was
  /// full or closed. None: it ran.
  std::optional<error> failure;
};

class executor {
 public:
  using task = std::function<void()>;
  using completion = std::function<void(task_outcome)>;

  virtual ~executor() = default;
  /// Queues `work`; `done` is called exactly once, when it completed or
  /// failed, on whatever thread finished it. Tasks run one at a time in
  /// submission order. A full queue fails the task at once (overloaded).
  virtual void submit(task work, completion done) = 0;
  /// Tasks submitted and not completed yet.
  virtual std::size_t pending() const noexcept = 0;
};

/// Runs `work`, timing it; an exception becomes the outcome's failure (an
/// engine bug must not take the worker thread down with it).
task_outcome run_task(const executor::task& work);

/// Runs every task on the calling thread, inside submit().
class inline_executor final : public executor {
 public:
  void submit(task work, completion done) override;
  std::size_t pending() const noexcept override { return 0; }
};

/// One worker thread running tasks from a bounded queue.
class thread_executor final : public executor {
 public:
  /// How a finished task's outcome reaches its callback. The default calls
  /// `done` on the worker thread; the CUDA device defers it to its stream.
  using finisher = std::function<void(task_outcome outcome, completion done)>;

  /// `on_start` runs first on the worker thread (cudaSetDevice). Tasks left
  /// in the queue when the executor is destroyed fail with `unavailable`.
  explicit thread_executor(std::string name, std::size_t queue_max = 1024, std::function<void()> on_start = {},
                           finisher finish = {});
  ~thread_executor() override;
  thread_executor(const thread_executor&) = delete;
  thread_executor& operator=(const thread_executor&) = delete;

  void submit(task work, completion done) override;
  std::size_t pending() const noexcept override;

 private:
  struct shared;  // owned by the worker too: it may outlive this object (see the destructor)
  std::shared_ptr<shared> shared_;
  std::thread worker_;
};

/// Hands a completion to whoever submitted the task: taken synchronously
/// when it arrives while submit() is still running on the submitter's
/// thread (the inline executor), otherwise left to the asynchronous path
/// (a message). The submitter calls close() right after submit().
class completion_latch {
 public:
  /// From the completion callback: true when the outcome was taken here
  /// (submit() has not returned yet), false when the caller must send it on.
  bool offer(task_outcome& outcome);
  /// From the submitter after submit(): the outcome if it arrived during
  /// submit(); from now on offer() returns false.
  std::optional<task_outcome> close();

 private:
  std::mutex mutex_;
  bool open_ = true;
  std::optional<task_outcome> early_;
};

}  // namespace exa::gpu
