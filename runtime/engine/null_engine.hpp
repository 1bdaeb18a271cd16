#pragma once
// A zero-cost engine: the same interface and request validation as the CPU
// engine, but every step emits the next token of each running sequence
// without computing anything. It measures the serving path with the model
// taken out (docs/PERFORMANCE.md) and keeps actor tests fast. Its tokens are a
// pure function of the sequence so far, so resumed requests continue exactly,
// like the real engine's.

#include <cstdint>
#include <map>
#include <vector>

#include "engine/engine.hpp"

namespace exa::engine {

struct null_engine_config {
  std::uint32_t vocab_size = 260;
  std::uint32_t context_length = 4096;
  std::uint32_t kv_capacity_tokens = 1 << 20;
  std::uint32_t max_running = 256;
  std::uint32_t max_waiting = 4096;
};

class null_engine final : public inference_engine {
 public:
  explicit null_engine(null_engine_config config) : config_(config) {}

  expected<void> submit(generation_request request) override;
  void cancel(seq_id id) override;
  bool idle() const override { return running_.empty() && finished_.empty(); }
  step_result step() override;
  engine_stats stats() const override;

  /// The token this engine emits after `tokens` (prompt + generated so far).
  static model::token_id next_token(const std::vector<model::token_id>& tokens, std::uint32_t vocab);

 private:
  struct seq {
    generation_request request;
    std::vector<model::token_id> tokens;
    std::uint32_t generated = 0;
  };
  null_engine_config config_;
  std::map<seq_id, seq> running_;  // ordered: deterministic step order
  std::vector<finish_event> finished_;
  std::uint32_t kv_used_ = 0;
  engine_stats stats_;
};

}  // namespace exa::engine
