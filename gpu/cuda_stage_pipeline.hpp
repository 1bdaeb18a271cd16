#pragma once
// How the CUDA engine runs a step that may stop part way (the CPU engine's
// execute_yielding, engine/llama_forward.hpp): stage by stage (a layer is two
// stages, attention then MLP), asking before each stage after the first one
// it runs whether a lighter arrival should go first.
//
// The stream runs behind the host: a question asked when a stage is launched
// would be answered long before the device gets there, and a stop would then
// come a whole step early or not at all. So the host keeps at most
// `lookahead` stages launched and unfinished: before launching stage s it
// waits until stage s − lookahead has finished, then asks. With a lookahead
// of 2 the device is running stage s − 1 when the question is asked, a "yes"
// stops the step after it, and the launches of stage s overlap stage s − 1's
// work so the device never idles between stages. An arrival just after a
// "no" waits out the rest of the stage running and the one launched after
// it: at most two stages, where the CPU engine, asking between stages it
// runs itself, makes it wait out the rest of one.
//
// Which steps run this way (stoppable_step): launching a stage's kernels
// one by one costs the host tens of microseconds, where a step replayed from
// its CUDA graph (cuda_graph_policy.hpp) costs one launch. That is worth
// paying only where the step is long, so that the launches keep pace with
// the device's work and a stop saves an arrival more than it costs:
//  - a step with a prompt chunk in it (more tokens than sequences): its
//    matrix products over many tokens are long (the flood's prefill chunks);
//  - a decode-only step whose reads alone (the weights once, and each
//    sequence's K and V over its context) take the device at least the time
//    the host needs to launch its stages (engine::fair::cuda_stoppable_decode_s:
//    2.4 ms for 40 layers at the estimated 30 µs a stage; the decode steps of
//    a large batch over long contexts).
// Any other step (decode at small batches or short contexts) keeps its graph
// and runs whole. Pure logic; cuda_forward.cpp
// supplies the launches and waits.

#include <cstdint>
#include <functional>

#include "engine/fair_stop.hpp"
#include "engine/llama_forward.hpp"

namespace exa::gpu {

/// What stoppable_step weighs a decode step with.
struct stage_cost_model {
  double weight_bytes = 0;           // read once by every step
  double kv_bytes_per_position = 0;  // K and V of one position, all layers
  double read_bytes_per_s = 0;       // the device's memory bandwidth (cuda_peak.hpp); 0: unknown
  /// Host time to launch one stage's kernels eagerly (engine/fair_stop.hpp).
  double launch_s_per_stage = engine::fair::cuda_stage_launch_s;
};

/// The time a step's reads take the device at `m`'s bandwidth: the weights
/// once, and each token's K and V over positions 0 .. its own.
double step_read_s(const engine::forward_batch& batch, const stage_cost_model& m) noexcept;

/// Whether a step of `stages` stages runs stage by stage and may stop part
/// way on the GPU (see above): it carries prompt work, or its reads take at
/// least as long as its stages' launches.
bool stoppable_step(const engine::forward_batch& batch, std::uint32_t stages, const stage_cost_model& m) noexcept;

struct stage_hooks {
  /// Enqueues stage s (and marks its end, so wait_done(s) can wait for it).
  std::function<void(std::uint32_t)> launch;
  /// Blocks until stage s, launched earlier, has finished on the device.
  std::function<void(std::uint32_t)> wait_done;
  /// The engine's question: stop before the next stage?
  std::function<bool()> should_yield;
};

/// Launches stages [first, total), keeping at most `lookahead` (≥ 1) of them
/// unfinished, and asks `should_yield` before each stage after `first`.
/// Returns the stage it stopped before (the hidden state to keep is the one
/// after the stages launched, once they finish), or `total` when it launched
/// them all.
std::uint32_t run_stages(std::uint32_t first, std::uint32_t total, std::uint32_t lookahead, const stage_hooks& hooks);

}  // namespace exa::gpu
