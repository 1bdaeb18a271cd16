#include "gpu/executor.hpp"

#include <pthread.h>

#include <chrono>
#include <exception>

#include "common/assert.hpp"

namespace exa::gpu {

task_outcome run_task(const executor::task& work) {
  const auto t0 = std::chrono::steady_clock::now();
  task_outcome out;
  try {
    work();
  } catch (const std::exception& e) {
    out.failure = error{errc::internal, std::string("device task failed: ") + e.what()};
  } catch (...) {
    out.failure = error{errc::internal, "device task failed with an unknown exception"};
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

void inline_executor::submit(task work, completion done) { done(run_task(work)); }

struct thread_executor::shared {
  struct job {
    task work;
    completion done;
  };
  std::string name;
  std::size_t queue_max = 0;
  std::function<void()> on_start;
  finisher finish;
  mutable std::mutex mutex;
  std::condition_variable wake;
  std::deque<job> queue;      // guarded by mutex
  std::size_t running = 0;    // guarded by mutex: 0 or 1
  bool stopping = false;      // guarded by mutex

  void loop() {
    if (on_start) on_start();
    for (;;) {
      job j;
      {
        std::unique_lock lock(mutex);
        wake.wait(lock, [&] { return stopping || !queue.empty(); });
        if (stopping) break;
        j = std::move(queue.front());
        queue.pop_front();
        running = 1;
      }
      auto outcome = run_task(j.work);
      j.work = nullptr;  // the task's captures (an engine) go now, not with the next one
      if (finish) finish(std::move(outcome), std::move(j.done));
      else j.done(std::move(outcome));
      std::lock_guard lock(mutex);
      running = 0;
    }
    // Closed: what is still queued will never run.
    std::deque<job> left;
    {
      std::lock_guard lock(mutex);
      left.swap(queue);
    }
    for (auto& j : left) j.done({0, error{errc::unavailable, "device " + name + " closed before the task ran"}});
  }
};

thread_executor::thread_executor(std::string name, std::size_t queue_max, std::function<void()> on_start,
                                 finisher finish)
    : shared_(std::make_shared<shared>()) {
  EXA_ASSERT_MSG(queue_max > 0, "an executor needs room for one task");
  shared_->name = std::move(name);
  shared_->queue_max = queue_max;
  shared_->on_start = std::move(on_start);
  shared_->finish = std::move(finish);
  worker_ = std::thread([s = shared_] { s->loop(); });
  // Named for profilers and `top -H` (at most 15 characters).
  pthread_setname_np(worker_.native_handle(), shared_->name.substr(0, 15).c_str());
}

thread_executor::~thread_executor() {
  {
    std::lock_guard lock(shared_->mutex);
    shared_->stopping = true;
  }
  shared_->wake.notify_all();
  // The last owner of a device can be a task's capture, released on the
  // worker thread itself: that thread cannot join itself, so it is let go
  // (it holds `shared_` and touches nothing else on its way out).
  if (worker_.get_id() == std::this_thread::get_id()) worker_.detach();
  else worker_.join();
}

void thread_executor::submit(task work, completion done) {
  std::optional<error> refused;
  {
    std::lock_guard lock(shared_->mutex);
    if (shared_->stopping)
      refused = error{errc::unavailable, "device " + shared_->name + " is closed"};
    else if (shared_->queue.size() >= shared_->queue_max)
      refused = error{errc::overloaded, "device " + shared_->name + " has " + std::to_string(shared_->queue.size()) +
                                            " tasks queued (its queue_max)"};
    else
      shared_->queue.push_back({std::move(work), std::move(done)});
  }
  if (refused) return done({0, std::move(refused)});  // outside the lock: `done` may send a message
  shared_->wake.notify_one();
}

std::size_t thread_executor::pending() const noexcept {
  std::lock_guard lock(shared_->mutex);
  return shared_->queue.size() + shared_->running;
}

bool completion_latch::offer(task_outcome& outcome) {
  std::lock_guard lock(mutex_);
  if (!open_) return false;
  early_ = std::move(outcome);
  return true;
}

std::optional<task_outcome> completion_latch::close() {
  std::lock_guard lock(mutex_);
  open_ = false;
  return std::move(early_);
}

}  // namespace exa::gpu
