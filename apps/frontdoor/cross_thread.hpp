#pragma once
// Getting backend callbacks, which may run on any thread, back onto the
// front door's KJ event loop.
//
// Why not Executor::executeAsync: it must be called from a thread that has a
// KJ event loop (its result promise belongs to the caller), and backend
// threads (CAF workers) have none. A cross-thread fulfiller is the one KJ
// primitive that any thread may complete; the loop creates it and waits on the
// promise, the callback fulfils it. Its promise may be dropped at any time
// (client gone): a later fulfil is then a harmless no-op, by KJ's design.

#include <kj/async.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "api/gateway.hpp"

namespace exa::door {

/// The events of one generate request, queued by backend threads in the
/// order they were produced and taken in batches by the loop.
class request_channel {
 public:
  struct batch {
    std::vector<api::token_chunk> chunks;
    std::optional<api::generate_result> done;  // after every chunk in `chunks`
    bool backend_finished = false;             // done came from the backend itself
  };

  explicit request_channel(std::size_t pending_chunks_max);

  // Backend side: any thread. Events after done or close() are dropped.
  void push_chunk(const api::token_chunk& chunk);
  void push_done(const api::generate_result& result);

  // Loop side.
  /// Resolves once take() has something to return (at once if it has now).
  kj::Promise<void> when_ready();
  /// Resolves when the request overflowed its buffer (pending_chunks_max
  /// chunks not taken): the consumer is stuck, so its owner cancels the
  /// backend request at once rather than when the consumer next looks.
  /// One caller at a time.
  kj::Promise<void> when_overflowed();
  batch take();
  /// Stops accepting events: late callbacks of a vanished client find the
  /// channel closed and do nothing.
  void close();

 private:
  void wake_locked();

  const std::size_t pending_chunks_max_;
  std::mutex mu_;
  std::vector<api::token_chunk> chunks_;
  std::optional<api::generate_result> done_;
  bool backend_done_ = false;
  bool delivered_done_ = false;
  bool closed_ = false;
  bool overflowed_ = false;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> waiter_;           // armed by when_ready()
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> overflow_waiter_;  // armed by when_overflowed()
};

/// A backend stream_sink that feeds a request_channel. The backend may keep
/// it (and so the channel) alive after the request is gone; that is harmless.
class channel_sink final : public api::stream_sink {
 public:
  explicit channel_sink(std::shared_ptr<request_channel> channel) : channel_(std::move(channel)) {}
  void on_chunk(const api::token_chunk& chunk) override { channel_->push_chunk(chunk); }
  void on_done(const api::generate_result& result) override { channel_->push_done(result); }

 private:
  std::shared_ptr<request_channel> channel_;
};

/// A promise on the loop plus a callback that any thread may call (once;
/// later calls are ignored). A callback destroyed without being called
/// rejects the promise, so a backend that loses a reply cannot hang a client
/// forever.
template <class T>
struct cross_thread_callback {
  kj::Promise<T> promise;
  std::function<void(T)> callback;
};

template <class T>
cross_thread_callback<T> make_cross_thread_callback() {
  auto paf = kj::newPromiseAndCrossThreadFulfiller<T>();
  // std::function must be copyable; the fulfiller is shared by its copies.
  auto fulfiller = std::make_shared<kj::Own<kj::CrossThreadPromiseFulfiller<T>>>(kj::mv(paf.fulfiller));
  return {kj::mv(paf.promise), [fulfiller](T value) { (*fulfiller)->fulfill(kj::mv(value)); }};
}

}  // namespace exa::door
