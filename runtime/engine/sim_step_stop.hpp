#pragma once
// Which engine's step stop a simulated engine models (sim_engine_config's
// layer_yield fields, set by set_step_stop in sim_engine.hpp). Its own small
// header: the cluster options and scenarios name it without the engine.

#include <cstdint>

namespace exa::engine {

enum class sim_step_stop : std::uint8_t {
  none,        // arrivals wait for the step in flight
  every_step,  // the CPU engine: every decode step and chunk, at the next stage boundary
  long_steps,  // the CUDA engine: chunks, and decode steps of at least
               // fair::cuda_stoppable_decode_s, a stage later (its host asks one stage ahead)
};

}  // namespace exa::engine
