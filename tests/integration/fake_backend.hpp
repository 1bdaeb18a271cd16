#pragma once
// A deterministic gateway_backend for front-door tests.
//
// Model "fake" (the only deployment at first) answers a text prompt with the
// prompt's bytes reversed, one byte per token (token id = byte value); a
// token-id prompt gets its ids reversed, each rendered as 'a' + id % 26.
// When the reversed prompt runs out before max_tokens the request ends with
// finish "stop" (an end of sequence), unless ignore_eos, which repeats it up
// to max_tokens ("length"). Stop sequences end it before their first
// occurrence, as a real backend would. With logprobs, token i has logprob
// -0.25 * (i + 1), and its top_logprobs alternatives are the token itself
// then the next byte values up (text: that byte), each 1.0 less likely.
//
// Tokens are produced on a thread per request (so callbacks really arrive
// from other threads), optionally with a delay per token, and every call is
// recorded so tests can assert what the front door asked for. Behaviour is
// configurable per model name, so one test can mix well-behaved and failing
// requests.

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "api/gateway.hpp"

namespace exa::test {

struct fake_behavior {
  std::optional<error> refuse{};             // on_done(error) at once, no chunks
  std::optional<std::size_t> fail_after{};   // tokens sent before an on_done(internal error)
  std::optional<std::size_t> hang_after{};   // tokens sent before waiting for cancel()
  std::chrono::milliseconds token_delay{0};  // simulated decode time per token
  bool synchronous = false;                  // answer inside generate(), on the caller's thread
  std::uint32_t cached_tokens = 0;           // usage.cached_tokens it reports (at most the prompt's)
};

/// The completion the fake produces for a request (for expected values).
struct fake_output {
  std::vector<api::token_id> tokens;
  std::string text;
  api::finish_reason reason = api::finish_reason::stop;
  std::uint32_t prompt_tokens = 0;
  std::vector<api::token_logprob> logprobs;  // one per token when the request asked
};
fake_output fake_complete(const api::generate_request& request);

class fake_backend final : public api::gateway_backend {
 public:
  fake_backend();
  ~fake_backend() override;

  // --- configuration (before or between requests) ---
  void set_behavior(const std::string& model, fake_behavior behavior);
  void set_ready(bool ready);
  void set_status_error(std::optional<error> e);

  // --- observation ---
  std::vector<api::generate_request> requests() const;
  std::vector<std::string> cancels() const;
  std::vector<std::string> admin_log() const;  // "deploy name=... replicas=..." etc.
  /// Waits (on a condition, not a sleep) until `id` was cancelled; false on timeout.
  bool wait_for_cancel(const std::string& id, std::chrono::milliseconds timeout) const;
  /// Waits until `n` generate requests arrived; false on timeout.
  bool wait_for_requests(std::size_t n, std::chrono::milliseconds timeout) const;
  /// Waits until every request's worker finished (sent on_done).
  bool wait_idle(std::chrono::milliseconds timeout) const;

  // --- gateway_backend ---
  void generate(api::generate_request request, std::shared_ptr<api::stream_sink> sink) override;
  void cancel(const std::string& request_id) override;
  void models(std::function<void(std::vector<api::model_info>)> done) override;
  void status(std::function<void(expected<api::cluster_status>)> done) override;
  void metrics(std::function<void(std::string)> done) override;
  void ready(std::function<void(bool)> done) override;
  void deploy(api::deploy_request request, std::function<void(expected<void>)> done) override;
  void undeploy(std::string name, std::function<void(expected<void>)> done) override;
  void scale(std::string name, std::uint32_t replicas, std::function<void(expected<void>)> done) override;
  void drain(api::drain_request request, std::function<void(expected<api::drain_result>)> done) override;
  void rollout(api::rollout_request request, std::function<void(expected<api::rollout_result>)> done) override;

 private:
  struct job;
  void run_job(const std::shared_ptr<job>& j);
  /// Runs `fn` on the helper thread, as a real backend answers from its own.
  void post(std::function<void()> fn);

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::map<std::string, fake_behavior> behaviors_;
  std::vector<api::model_info> models_;
  bool ready_ = true;
  std::optional<error> status_error_;
  std::vector<api::generate_request> requests_;
  std::vector<std::string> cancels_;
  std::vector<std::string> admin_log_;
  std::vector<api::rollout_status> rollouts_;  // shown in status once a rollout started
  std::map<std::string, std::shared_ptr<job>> jobs_;  // in flight, by request id
  std::size_t active_ = 0;
  std::vector<std::thread> threads_;
  // The helper thread for non-generate callbacks.
  std::vector<std::function<void()>> posted_;
  bool stopping_ = false;
  std::thread helper_;
};

}  // namespace exa::test
