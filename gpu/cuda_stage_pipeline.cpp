#include "gpu/cuda_stage_pipeline.hpp"

#include "common/assert.hpp"

namespace exa::gpu {

double step_read_s(const engine::forward_batch& batch, const stage_cost_model& m) noexcept {
  if (m.read_bytes_per_s <= 0) return 0;
  double positions = 0;
  for (const engine::forward_token& t : batch.tokens) positions += double(t.pos) + 1;
  return (m.weight_bytes + positions * m.kv_bytes_per_position) / m.read_bytes_per_s;
}

bool stoppable_step(const engine::forward_batch& batch, std::uint32_t stages, const stage_cost_model& m) noexcept {
  if (batch.tokens.empty() || stages < 2) return false;
  if (batch.tokens.size() > batch.tables.size()) return true;
  return step_read_s(batch, m) >= engine::fair::cuda_stoppable_decode_s(stages, m.launch_s_per_stage);
}

std::uint32_t run_stages(std::uint32_t first, std::uint32_t total, std::uint32_t lookahead, const stage_hooks& hooks) {
  EXA_ASSERT_MSG(lookahead >= 1, "a stage pipeline needs at least one stage in flight");
  for (std::uint32_t s = first; s < total; ++s) {
    if (s > first) {
      if (s - first >= lookahead) hooks.wait_done(s - lookahead);
      if (hooks.should_yield()) return s;
    }
    hooks.launch(s);
  }
  return total;
}

}  // namespace exa::gpu
