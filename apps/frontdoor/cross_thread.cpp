#include "cross_thread.hpp"

#include <fmt/format.h>

#include "common/assert.hpp"

namespace exa::door {

request_channel::request_channel(std::size_t pending_chunks_max) : pending_chunks_max_(pending_chunks_max) {
  EXA_ASSERT(pending_chunks_max_ > 0);
}

void request_channel::push_chunk(const api::token_chunk& chunk) {
  std::lock_guard lock(mu_);
  if (closed_ || done_ || delivered_done_) return;
  if (chunks_.size() >= pending_chunks_max_) {
    // The client is not taking what the backend makes: end the request with
    // an error instead of buffering without bound. The owner of the request
    // sees a done that did not come from the backend and cancels it there.
    api::generate_result result;
    result.reason = api::finish_reason::error;
    result.err = error{errc::overloaded,
                       fmt::format("client fell behind: {} chunks buffered and not yet delivered",
                                   chunks_.size())};
    done_ = std::move(result);
    overflowed_ = true;
    if (overflow_waiter_) {
      overflow_waiter_->fulfill();
      overflow_waiter_ = nullptr;
    }
  } else {
    chunks_.push_back(chunk);
  }
  wake_locked();
}

void request_channel::push_done(const api::generate_result& result) {
  std::lock_guard lock(mu_);
  if (closed_ || done_ || delivered_done_) return;
  done_ = result;
  backend_done_ = true;
  wake_locked();
}

void request_channel::wake_locked() {
  // Fulfilling under the lock is deadlock-free: the fulfiller only takes the
  // loop executor's internal mutex, and the loop never holds that while
  // calling into us.
  if (waiter_) {
    waiter_->fulfill();
    waiter_ = nullptr;
  }
}

kj::Promise<void> request_channel::when_ready() {
  std::lock_guard lock(mu_);
  EXA_ASSERT(!delivered_done_);
  if (!chunks_.empty() || done_) return kj::READY_NOW;
  auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
  waiter_ = kj::mv(paf.fulfiller);
  return kj::mv(paf.promise);
}

kj::Promise<void> request_channel::when_overflowed() {
  std::lock_guard lock(mu_);
  if (overflowed_) return kj::READY_NOW;
  auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
  overflow_waiter_ = kj::mv(paf.fulfiller);
  return kj::mv(paf.promise);
}

request_channel::batch request_channel::take() {
  std::lock_guard lock(mu_);
  batch out;
  out.chunks.swap(chunks_);
  if (done_) {
    out.done = std::move(done_);
    out.backend_finished = backend_done_;
    done_.reset();
    delivered_done_ = true;
  }
  return out;
}

void request_channel::close() {
  std::lock_guard lock(mu_);
  closed_ = true;
  chunks_.clear();
  done_.reset();
  // Dropped on the loop thread, which owns the promise side: no one waits.
  waiter_ = nullptr;
  overflow_waiter_ = nullptr;
}

}  // namespace exa::door
