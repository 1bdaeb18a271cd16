#pragma once
// Client-side timing of streamed RPC generations, shared by the bench tools
// (rpc_loadgen, prefix_replay): when a request started and when its first
// token chunk arrived.

#include <chrono>
#include <memory>
#include <optional>

#include <kj/async.h>

#include "schemas/exaserve.capnp.h"

namespace exa::bench {

using clock_type = std::chrono::steady_clock;

inline double ms_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

/// One request's timestamps. Shared by the call and its TokenSink, which
/// the server may release after the call returns.
struct request_times {
  clock_type::time_point start;
  std::optional<clock_type::time_point> first_chunk;
};

/// Notes when the first chunk arrives and returns at once, so the client
/// never holds back the server's flow-control window.
class sink_impl final : public exa::rpc::TokenSink::Server {
 public:
  explicit sink_impl(std::shared_ptr<request_times> times) : times_(std::move(times)) {}

 protected:
  kj::Promise<void> chunk(ChunkContext) override {
    if (!times_->first_chunk) times_->first_chunk = clock_type::now();
    return kj::READY_NOW;
  }

 private:
  std::shared_ptr<request_times> times_;
};

}  // namespace exa::bench
